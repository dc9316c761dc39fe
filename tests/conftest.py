"""Shared fixtures: one SparkSession for every end-to-end test (starting one costs ~5 s)."""

from __future__ import annotations

import warnings
from typing import Any

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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs two pytest-xdist workers; every test under ``tests/stack/`` goes to the same one.

    They share one stack on fixed loopback ports (started by that worker's session fixture), some
    restart its servers, and some rely on file order. (``--dist loadgroup`` would do this with a
    marker, but it renames node ids, which pytest 9.2 no longer allows.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class StackTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "stack" if nodeid.startswith("tests/stack/") else nodeid

    return StackTogether(config, log)
