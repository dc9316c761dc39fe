"""Shared fixtures: one SparkSession for every end-to-end test (starting one costs ~5 s), and an S3
API server on loopback for the tests of a lake on object storage."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from harness.stack.s3 import S3Server

#: each test's peak memory in the JUnit XML, and the stacks of a worker grown too large (tests/memory.py)
pytest_plugins = ["tests.memory"]

#: What the suite writes at its peak (Kafka's logs, Delta tables, Spark's spill files, the packaging
#: tests' virtualenvs): 5.1 GB in a clean-clone ``make test`` of 87c2273, free space sampled each
#: minute from the tests' start (a one-off, not a repo script); the margin keeps a nearly full disk
#: from failing halfway.
DISK_NEEDED = 6 * 1024**3


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C gets its default action in the suite and the commands its tests start, as in a
    terminal's foreground: a shell starts a background job (``nohup make test &``) with Ctrl-C
    ignored, which the commands inherit and keep (a run started ignoring it ignores it), so the
    tests that press Ctrl-C would find it ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, with the reason, when the disk cannot hold the suite's files.

    A full disk otherwise shows up as hundreds of unrelated errors: Kafka stops when it cannot
    write its log, and every test of the stack then fails to reach it.
    """
    for place in (Path(tempfile.gettempdir()), Path(__file__).resolve().parents[1]):
        free = shutil.disk_usage(place).free
        if free < DISK_NEEDED:
            pytest.exit(f"only {free / 1024**3:.1f} GiB free on the disk of {place}; the suite needs about "
                        f"{DISK_NEEDED / 1024**3:.0f} GiB (Kafka logs, Delta tables, Spark spill files, "
                        "the packaging tests' virtualenvs)", returncode=3)


@pytest.fixture(scope="session")
def spark():
    from ingest.errors import EnvironmentProblem
    from ingest.spark.session import DRIVER_JAVA_OPTIONS, QUICK_JIT, get_spark, session_conf

    # Spark's Kafka source, delta-spark and S3A must be on the classpath when the one session starts:
    # tests/stack read the real Kafka through it, the delta-spark engine's tests MERGE with it, and
    # tests/lake write to an S3 server through S3A.
    # The jars are resolved once by Spark's Ivy into the jars cache (ingest/spark/jars.py; `ingest jars`).
    # If that is impossible here, the other tests still run; the tests that need them then fail naming the jar.
    try:
        extra = tuple(sorted(session_conf(["spark-kafka", "delta-spark", "hadoop-aws"], {}).items()))
    except EnvironmentProblem as exc:
        warnings.warn(f"Spark's Kafka source or delta-spark is not on the classpath: {exc}", stacklevel=1)
        extra = ()
    # Tuned for many small jobs beside another worker on 2 cores (tests/apply/test_batch_apply.py
    # with -n 2 took 227 s before and 145 s after, timed once by hand): the JIT's quick compiler
    # only (most of a test's JVM time is planning and code generation that run a few times, which
    # C2 would compile for nothing) and the serial collector (no GC threads competing for the cores).
    extra = (*extra, (DRIVER_JAVA_OPTIONS, f"{QUICK_JIT} -XX:+UseSerialGC"))
    # Expressions evaluated as they are instead of compiled to Java first: Spark's own fallback path,
    # which its test suites run too (the setting is Spark's, for tests; never the product's). A test's
    # rows are a handful, and a delta-spark MERGE compiles dozens of projections and predicates for
    # them. tests/apply/test_new_keys_append.py alone, one pytest process at a time, timed by hand
    # (not a repo script): 64.9 s with it, 77.2-84.8 s without (whole-stage code generation off
    # instead: 79.5 s). The product keeps code generation: on the 20k-record batches of
    # benchmarks/bench_compare.py it made no difference (106.9 s against 106.1 s, one pair).
    extra = (*extra, ("spark.sql.codegen.factoryMode", "NO_CODEGEN"))
    # Adaptive query execution off: it re-plans a query between its stages and runs each stage as a job
    # of its own, which pays for itself on large shuffles, never on a test's rows. On the executor path
    # (target.plan_on: executors) a batch of tests/proof/torture/test_crash_windows.py ran 20 jobs
    # instead of 34 and took 13 % less, and that module's executor cases with tests/apply/test_spark_batch.py
    # 339 s instead of 380 s (one pytest process each, timed by hand). The product keeps Spark's default.
    extra = (*extra, ("spark.sql.adaptive.enabled", "false"))
    session = get_spark("local[2]", 2, extra)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _log_settings_stay_in_their_test() -> Iterator[None]:
    """The CLI leaves its log format and level in the environment for the processes it starts
    (ingest.logs.export), and a handler on the root logger writing to the stderr it had
    (ingest.logs.configure); a test that runs it in this process must not hand them to the next
    test's. Run by click's CliRunner, that stderr is closed after the test: the next test's log
    records would each print a "Logging error" traceback into its captured output."""
    from ingest import logs

    kept = {name: os.environ.get(name) for name in (logs.FORMAT_VARIABLE, logs.LEVEL_VARIABLE)}
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for name, value in kept.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for handler in list(root.handlers):  # pytest's own capture handlers come and go with each phase
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _secrets_seen_stay_in_their_test() -> Iterator[None]:
    """ingest.secrets remembers every secret value the process has seen, to redact it from then on;
    a test that sets a credential to a word ("secret") must not mask that word in the messages a
    later test on the same worker asserts on."""
    from ingest import secrets

    kept = set(secrets._known)
    yield
    with secrets._lock:
        secrets._known.clear()
        secrets._known.update(kept)


@pytest.fixture(params=["delta-rs", "delta-spark"])
def apply_engine(request: pytest.FixtureRequest) -> Any:
    """Runs the test once per apply engine; tests/harness.py (and helpers that ask it) commit with it.

    A module opts in with ``pytestmark = pytest.mark.usefixtures("apply_engine")``: its semantics
    must hold on both engines (issue 11).
    """
    from ingest.commit.delta_rs import DeltaRsWriter
    from tests import harness

    if request.param == "delta-rs":
        engine: Any = DeltaRsWriter()
    else:
        from ingest.commit.delta_spark import DeltaSparkWriter

        # The tests' tables are small: read their stored rows on the executors, as a large table's
        # are, so the semantics hold on that path. The driver's read is the delta-rs engine's, and
        # tests/apply/test_spark_lookup.py compares the two on a table with deletion vectors.
        engine = DeltaSparkWriter(request.getfixturevalue("spark"), driver_lookup_rows=0)
    harness.use_engine(engine)
    yield engine
    harness.use_engine(None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the delta-spark runs of a ``one_writer`` test, and of a ``hard_mode_on_delta_spark``
    test those in soft-delete mode (a case whose id has ``soft``).

    A delta-spark MERGE costs about 3 s on 2 cores; cases that differ only in the decode step, a
    per-key rule or the quality gate (the same code on both engines), or in what a reader makes of
    the table, would cost minutes without testing the engine: tests/apply/test_writers_agree.py
    compares the two writers' tables over every rule at once.
    """
    keep, drop = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        on_spark = spec is not None and spec.params.get("apply_engine") == "delta-spark"
        soft = spec is not None and "soft" in spec.id.split("-")
        one_writer = item.get_closest_marker("one_writer") is not None
        if on_spark and (one_writer or (soft and item.get_closest_marker("hard_mode_on_delta_spark"))):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs three pytest-xdist workers; every test under ``tests/stack/`` goes to the same one,
    and the tests of any other module to one worker.

    The stack's tests share one stack on fixed loopback ports (started by that worker's session
    fixture), some restart its servers, and some rely on file order. (``--dist loadgroup`` would do
    this with a marker, but it renames node ids, which pytest 9.2 no longer allows.) A module's tests
    share its module-scoped fixtures (an ingested lake, a Dagster run), which would otherwise be built
    once on each worker. The costliest work goes out first (:func:`_cost`), so that no long module is
    left for the end while the other workers idle.
    """
    from xdist.scheduler import LoadScopeScheduling

    class StackTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "stack" if nodeid.startswith("tests/stack/") else nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node: Any) -> None:
            costliest = max(self.workqueue, key=lambda scope: _cost(scope, self.workqueue[scope]))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

    return StackTogether(config, log)


#: Seconds the costliest modules took in a clean clone's run of the suite here (2 cores, -n 3), for the schedule
#: (``scripts/suite_times.py`` prints these lines from a run's JUnit XML); only their order matters.
MODULE_SECONDS: Final = {
    "tests/test_driver_run.py": 560, "tests/packaging/test_upgrade.py": 310, "tests/apply/test_spark_batch.py": 250,
    "tests/proof/torture/test_crash_windows.py": 210, "tests/apply/test_writers_agree.py": 180,
    "tests/proof/torture/test_maintain_beside_a_run.py": 170, "tests/lake/test_s3_torture.py": 160,
    "tests/cli/test_retype_runbook.py": 150, "tests/test_engine_e2e.py": 140, "tests/lake/test_s3_lake.py": 140,
    "tests/proof/torture/test_torture_fast.py": 130, "tests/packaging/test_wheel.py": 130,
    "tests/test_semantics_edges.py": 130, "tests/cuts/test_run.py": 90, "tests/test_discovery.py": 70,
    "tests/cli/test_logs.py": 70, "tests/dagster/test_observe.py": 70, "tests/apply/test_engines_interchange.py": 60,
    "tests/quality/test_replay.py": 60, "tests/test_spark_session.py": 60, "tests/cli/test_setup.py": 60,
    "tests/test_caught_up.py": 50, "tests/apply/test_rereads.py": 50, "tests/quality/test_gate_on_spark.py": 50,
    "tests/test_maintain.py": 50, "tests/cli/test_conventions.py": 50, "tests/cli/test_metrics.py": 50,
    "tests/apply/test_batch_apply.py": 50, "tests/dagster/test_materialize.py": 50,
    "tests/apply/test_key_list.py": 40, "tests/dagster/test_incremental.py": 40,
    "tests/apply/test_spark_plan.py": 40, "tests/dagster/test_maintenance.py": 40,
    "tests/apply/test_spark_lookup.py": 40, "tests/apply/test_new_keys_append.py": 40,
    "tests/proof/torture/test_secrets.py": 40, "tests/test_time_travel.py": 40, "tests/apply/test_moves.py": 30,
    "tests/test_change_feed.py": 30, "tests/proof/torture/test_checkpoint_loss.py": 30,
    "tests/quality/test_quality_e2e.py": 30, "tests/test_semantics_e2e.py": 30,
    "tests/quality/test_quality_gate.py": 30, "tests/test_class_archive.py": 20, "tests/source/test_source.py": 20,
    "tests/docs/test_site.py": 20, "tests/proof/torture/test_two_writers.py": 20, "tests/lake/test_lease.py": 20,
    "tests/cli/test_stopped_table_runbook.py": 20, "tests/apply/test_history.py": 20,
    "tests/lake/test_s3_outage.py": 20, "tests/test_registry_first.py": 20, "tests/cuts/test_cuts.py": 20,
    "tests/test_handler.py": 20, "tests/apply/test_spark_reduce.py": 20,
}


def _cost(scope: str, nodeids: dict[str, bool]) -> float:
    """A scope's expected cost, to schedule the costly ones first: the stack's tests (about a third
    of the suite) before all, then the modules of :data:`MODULE_SECONDS`; any other test counts a
    second, a delta-spark case ten (a delta-spark MERGE costs seconds)."""
    if scope == "stack":
        return float("inf")
    return MODULE_SECONDS.get(scope) or sum(10 if "delta-spark" in nodeid else 1 for nodeid in nodeids)


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3 server for the session; its key pair is put in this process's environment, where
    delta-rs, polars and boto3 look for credentials (the configuration never holds them).

    ``TEST_S3=stack`` runs them against the stack's MinIO instead (``make stack`` first). A server
    that cannot start fails the tests that use it (never a skip)."""
    if os.environ.get("TEST_S3") == "stack":
        from harness.stack import StackSettings

        settings = StackSettings.from_env()
        server = S3Server.external(settings.s3_endpoint(), settings.s3_access_key, settings.credentials.s3_secret_key)
    else:
        server = S3Server(tmp_path_factory.mktemp("s3")).start()
    saved = {name: os.environ.get(name) for name in server.environment}
    os.environ.update(server.environment)
    yield server
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    server.stop()


@pytest.fixture
def bucket(s3: S3Server) -> str:
    """A fresh bucket per test: nothing one test writes is seen by another."""
    name = f"lake-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return name


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection for the whole test. Its socket stays bound and never
    listens: a port bound and closed again may be taken meanwhile by a server another test worker starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
