"""Shared fixtures: one SparkSession for every end-to-end test (starting one costs ~5 s)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from ingest.spark import get_spark

    session = get_spark("local[2]", 2)
    yield session
    session.stop()
