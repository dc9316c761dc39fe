"""Which driver JVM a configuration's Spark session asks for (``spark.jit``), without starting one."""

from __future__ import annotations

import contextlib
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.config import IngestConfig, local_cores
from ingest.spark import session as spark_module
from ingest.spark.class_archive import java_option
from ingest.spark.session import DRIVER_JAVA_OPTIONS, QUICK_JIT, driver_java_options, session_for


def _config(*, engine: str = "delta-rs", kafka_reader: str | None = None, jit: str = "auto",
            java_options: str | None = None, workdir: str = "work", target: dict[str, Any] | None = None,
            conf: dict[str, str] | None = None) -> IngestConfig:
    source: dict[str, Any] = {"kind": "embedded"}
    if kafka_reader:
        source = {"kind": "kafka", "kafka": {"bootstrap_servers": "127.0.0.1:9092", "reader": kafka_reader}}
    conf = {**(conf or {}), **({DRIVER_JAVA_OPTIONS: java_options} if java_options else {})}
    return IngestConfig.model_validate({
        "workdir": workdir, "source": source, "target": {"engine": engine, **(target or {})},
        "spark": {"jit": jit, "conf": conf},
        "tables": [{"name": "t", "topic": "db.public.t"}]})


@pytest.fixture
def asked(monkeypatch) -> dict[str, str]:
    """The settings ``session_for`` hands to ``get_spark`` (no JVM is started)."""
    seen: dict[str, str] = {}

    def get_spark(master: str, shuffle_partitions: int, extra: tuple[tuple[str, str], ...]) -> None:
        seen.update(extra)

    monkeypatch.setattr(spark_module, "get_spark", get_spark)
    return seen


@pytest.mark.parametrize(("engine", "reader", "jit", "draining", "quick"), [
    ("delta-rs", None, "auto", False, True),         # the JVM plans and hands Arrow batches over
    ("delta-rs", "python", "auto", False, True),     # the engine's own Kafka reader: the same
    ("delta-rs", "spark", "auto", False, False),     # Spark's Kafka source reads in the JVM
    ("delta-rs", "spark", "auto", True, False),
    ("delta-spark", None, "auto", False, False),     # delta-spark MERGEs in the JVM for as long as the run lasts
    ("delta-spark", None, "auto", True, True),       # a run that drains ends before C2 pays back
    ("delta-spark", None, "quick", False, True),
    ("delta-rs", None, "full", True, False),
])
def test_the_driver_jvm_compiles_with_c1_only_unless_it_works_long(asked, engine, reader, jit, draining, quick):
    session_for(_config(engine=engine, kafka_reader=reader, jit=jit), draining=draining)
    assert (QUICK_JIT in asked.get(DRIVER_JAVA_OPTIONS, "")) is quick


@pytest.mark.parametrize(("mode", "quick"), [("available_now", True), ("continuous", False)])
def test_a_delta_spark_run_asks_for_the_quick_jit_when_it_drains(asked, monkeypatch, tmp_path, mode, quick):
    from ingest.stream import runner as runner_module
    from ingest.stream.runner import Runner

    class Stop(Exception):
        pass

    def streaming_run(run):  # the run's first use of Spark, as the streaming run makes it
        run.spark  # noqa: B018
        raise Stop

    monkeypatch.setattr(runner_module, "pending", lambda config, specs, *asked: {s.name: 1 for s in specs})
    monkeypatch.setattr("ingest.stream.driver_run.DriverRun.wanted", staticmethod(lambda *a: False))
    monkeypatch.setattr("ingest.stream.queries.StreamingRun", streaming_run)
    config = _config(engine="delta-spark", workdir=str(tmp_path))
    with pytest.raises(Stop):
        Runner(config).run(mode=mode)
    assert (QUICK_JIT in asked.get(DRIVER_JAVA_OPTIONS, "")) is quick


def test_the_users_own_java_options_come_last_and_win(asked):
    session_for(_config(java_options="-XX:TieredStopAtLevel=4 -Dx=1"))
    assert asked[DRIVER_JAVA_OPTIONS] == f"{QUICK_JIT} -XX:TieredStopAtLevel=4 -Dx=1"
    opts = driver_java_options(tuple(asked.items())).split()
    # the logging configuration and the class archive's options stay, before the user's options
    user = asked[DRIVER_JAVA_OPTIONS].split()
    assert opts[0].startswith("-Dlog4j2.configurationFile=file:") and opts[-len(user):] == user
    assert driver_java_options(()).split()[1:] == java_option().split()


@pytest.mark.parametrize(("master", "cores"), [
    ("local", 1), ("local[3]", 3), ("local[2, 4]", 2), ("spark://host:7077", None), ("yarn", None),
])
def test_the_task_slots_of_a_local_master(master, cores):
    assert local_cores(master) == cores


def test_delta_rebuilds_snapshots_in_one_task_per_core_in_every_session(spark):
    """Delta's default, 50 tasks, makes a small table's maintenance several times slower on local[2]
    (benchmarks/bench_snapshot_tasks.py)."""
    cores = str(spark.sparkContext.defaultParallelism)
    assert spark.sparkContext.getConf().get(spark_module.SNAPSHOT_PARTITIONS) == cores
    assert spark.newSession().conf.get(spark_module.SNAPSHOT_PARTITIONS) == cores


def test_one_rule_for_the_snapshot_tasks_of_any_session(spark):
    """A session without the setting (a cluster's, whose cores the builder cannot know) gets one task
    per core of the context from the same helper the delta-spark engine uses; a user's value wins."""
    bare = spark.newSession()
    bare.conf.unset(spark_module.SNAPSHOT_PARTITIONS)
    assert bare.conf.get(spark_module.SNAPSHOT_PARTITIONS, None) is None
    spark_module.snapshot_tasks(bare)
    assert bare.conf.get(spark_module.SNAPSHOT_PARTITIONS) == str(spark.sparkContext.defaultParallelism)
    chosen = spark.newSession()
    chosen.conf.set(spark_module.SNAPSHOT_PARTITIONS, "7")
    assert spark_module.snapshot_tasks(chosen).conf.get(spark_module.SNAPSHOT_PARTITIONS) == "7"


def test_a_local_checkpoint_is_written_through_filesystems_and_one_on_s3_as_spark_chooses(asked):
    """A local FileContext forks chmod and readlink for every checkpoint file (no native Hadoop library)."""
    [(key, value)] = spark_module.LOCAL_CHECKPOINTS.items()
    session_for(_config())
    assert asked[key] == value
    asked.clear()
    session_for(_config(target={"checkpoint_dir": "s3://bucket/checkpoints"}))
    assert key not in asked
    session_for(_config(conf={key: "my.Manager"}))
    assert asked[key] == "my.Manager"  # a user's own value wins


@pytest.mark.parametrize("through", ["file contexts", "file systems"])
def test_a_streaming_checkpoint_resumes_however_its_files_are_written(spark, tmp_path, through):
    """Every micro-batch writes an offsets and a commit file. Through FileContexts, Hadoop's
    checksummed local file system wrote and renamed a .crc beside each, about half of the
    checkpoint's cost per micro-batch; the engine's session writes none. A local checkpoint is
    written through FileSystems, which write them, without forking chmod and readlink for each file
    (benchmarks/bench_checkpoint_files.py). Spark resumes from either."""
    [(key, value)] = spark_module.LOCAL_CHECKPOINTS.items()
    session = spark.newSession()
    if through == "file systems":
        session.conf.set(key, value)
    checkpoint = tmp_path / "checkpoint"
    seen: list[int] = []

    def run(batches: int) -> None:
        query = (session.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load().writeStream
                 .foreachBatch(lambda _df, batch_id: seen.append(batch_id))
                 .option("checkpointLocation", str(checkpoint)).trigger(processingTime="50 milliseconds").start())
        deadline = time.monotonic() + 120
        try:
            while len(seen) < batches or not query.lastProgress:
                assert time.monotonic() < deadline, f"{len(seen)} of {batches} micro-batches in 120 s"
                query.awaitTermination(0.1)  # raises the query's error, if it failed
        finally:
            query.stop()

    run(3)
    first = len(seen)
    run(first + 1)
    # resumed from the checkpoint: after the last batch, or that batch again if the stop came before its commit
    assert seen[first] in (seen[first - 1], seen[first - 1] + 1) and seen[first] > 0
    written = [p.name for p in checkpoint.rglob("*") if p.is_file()]
    assert {"0", "1"} <= set(written)
    assert bool([name for name in written if name.endswith(".crc")]) is (through == "file systems")


_SPY_ON_THE_START = """
import signal
import sys
from pyspark.sql import SparkSession
from ingest.spark.session import get_spark

def name(handler):
    return getattr(handler, "__qualname__", str(handler))

handlers = []
start = SparkSession.__init__

def spy(self, *args, **kwargs):
    handlers.append(name(signal.getsignal(signal.SIGINT)))
    start(self, *args, **kwargs)

signal.signal(signal.SIGINT, signal.SIG_IGN if sys.argv[1] == "ignored" else signal.default_int_handler)
SparkSession.__init__ = spy
get_spark()
print(handlers, name(signal.getsignal(signal.SIGINT)))
"""


@pytest.mark.spark
@pytest.mark.parametrize(("ctrl_c", "at_start", "after"), [
    ("default", "HeldCtrlC._press", "SparkContext._do_init.<locals>.signal_handler"),
    ("ignored", "1", "1")])  # SIG_IGN
def test_pysparks_handler_is_not_in_place_while_the_session_starts(ctrl_c: str, at_start: str, after: str) -> None:
    """PySpark's context puts its handler in place as the last step of its start, and the session's
    start followed it: a second of py4j calls in which Ctrl-C was PySpark's, four py4j tracebacks
    and exit 130 (``benchmarks/bench_ctrl_c.py``: 5 presses of 7 between 4.75 and 6 s into a run).
    Once it is up, the handler is PySpark's again, for whatever the command does next; where Ctrl-C
    was ignored (a script's background job), the ignore is put back."""
    done = subprocess.run([sys.executable, "-c", _SPY_ON_THE_START, ctrl_c], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"['{at_start}'] {after}"


@contextlib.contextmanager
def _one_update(server: Any) -> Iterator[None]:
    """What Spark's JVM does to PySpark's accumulator server: connect, authenticate, send an update
    (of no accumulator) and read the acknowledgement; it closes the connection when the block ends."""
    with socket.create_connection(server.server_address[:2]) as conn:
        conn.sendall(server.auth_token.encode() + struct.pack("!i", 0))
        assert conn.recv(1) == b"\x01"
        yield


def _hang_up_after_one_update(server: Any) -> None:
    with _one_update(server):
        pass


def _printed_then_shut_down(capfd: pytest.CaptureFixture[str], server: Any) -> str:
    """What the server printed for the connections so far; then it is shut down. It serves one
    connection at a time, so an answered update means the earlier ones have been handled (and printed,
    or not). That last connection stays open until the server has shut down (its handler then returns
    without a failure): a hang-up would print while pytest rewinds the capture file, over the head of
    the first traceback, or after the capture has closed."""
    with _one_update(server):
        printed = capfd.readouterr().err
        server.shutdown()
    return printed


@pytest.fixture
def accumulator_server() -> Iterator[Any]:
    """PySpark's own accumulator server, as a context starts it (token ``t0ken``)."""
    from pyspark.accumulators import _start_update_server

    server = _start_update_server("t0ken", False)
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("quiet", [False, True])
def test_the_jvm_closing_its_accumulator_connection_prints_no_traceback(capfd: pytest.CaptureFixture[str],
                                                                       accumulator_server: Any, quiet: bool) -> None:
    if quiet:
        spark_module.quiet_hangups(accumulator_server)
    _hang_up_after_one_update(accumulator_server)
    _hang_up_after_one_update(accumulator_server)  # it serves the next connection after a hang-up
    printed = _printed_then_shut_down(capfd, accumulator_server)
    if quiet:
        assert printed == ""
    else:  # PySpark alone: the traceback this is about (the test would pass on a server that never failed)
        assert printed.count("Exception occurred during processing of request") == 2, printed
        assert printed.count("\nEOFError") == 2, printed


def test_a_failure_of_the_accumulator_server_other_than_a_hang_up_is_still_printed(
        capfd: pytest.CaptureFixture[str], accumulator_server: Any) -> None:
    """Only the JVM's hang-up is quiet: a connection with the wrong token, say, still prints its traceback."""
    spark_module.quiet_hangups(accumulator_server)
    with socket.create_connection(accumulator_server.server_address[:2]) as conn:
        conn.sendall(b"wrong")
        conn.recv(1)  # the server closes the connection once it has refused the token
    printed = _printed_then_shut_down(capfd, accumulator_server)  # served after the refusal: it was handled
    assert "Exception occurred during processing of request" in printed, printed
    assert "ValueError: The value of the provided token to the AccumulatorServer is not correct" in printed
    assert "EOFError" not in printed, printed
