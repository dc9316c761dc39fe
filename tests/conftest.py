"""Shared fixtures: one SparkSession for every end-to-end test (starting one costs ~5 s)."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture(scope="session")
def spark():
    from ingest.errors import EnvironmentProblem
    from ingest.jvm import classpath_conf
    from ingest.spark import get_spark

    # Spark's Kafka source must be on the classpath when the one session starts: tests/stack read the
    # real Kafka through it. The jars are resolved once by Maven into .stack/jars (`make jars`). If
    # that is impossible here, the other tests still run; the stack tests then fail naming the jar.
    try:
        extra = tuple(sorted(classpath_conf(["spark-kafka"], {}).items()))
    except EnvironmentProblem as exc:
        warnings.warn(f"Spark's Kafka source is not on the classpath: {exc}", stacklevel=1)
        extra = ()
    session = get_spark("local[2]", 2, extra)
    yield session
    session.stop()
