"""A draining run whose backlog the driver applies alone, without Spark (``source.driver_seconds``).

The driver reads, decodes and applies each table's records through the same journey as a
micro-batch; progress is the Delta logs, so a run that hands the rest to Spark, and any later
Spark run, resume exactly where the driver stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from harness.stack.process import wait_until

from ingest.config import IngestConfig, load_config
from ingest.lake.layout import TablePaths
from ingest.records import audit
from ingest.stream import checkpoint as checkpoints
from ingest.stream import driver_run
from ingest.stream.caught_up import pending
from ingest.stream.driver_run import DriverRun, refusal
from ingest.stream.queries import query_name
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce
from tests.harness import ingest_cli
from tests.test_caught_up import _run

TOPICS = {"notes": "app.public.notes", "tags": "app.public.tags"}


def _config(tmp_path: Path, *, driver_seconds: float, **source: Any) -> tuple[Path, IngestConfig]:
    """Tables ``notes`` (with a suite that fails a batch holding a note without a body) and ``tags``."""
    suites = tmp_path / "suites"
    suites.mkdir(exist_ok=True)
    (suites / "notes.json").write_text(json.dumps({"name": "notes", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "body"}}]}))
    raw = {"workdir": str(tmp_path / "work"),
           "source": {"value_format": "json", "max_records_per_batch": 100, "driver_seconds": driver_seconds,
                      **source},
           "quality": {"expectations_dir": str(suites)},
           "tables": [{"name": "notes", "topic": TOPICS["notes"], "expectations": "notes", "quality_policy": "fail"},
                      {"name": "tags", "topic": TOPICS["tags"]}]}
    path = tmp_path / f"config-{driver_seconds}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def _changes(first: int, count: int, body: str | None = "note") -> list[tuple[str, dict[str, Any], int]]:
    return [("c", {"id": i, "body": None if body is None else f"{body} {i}"}, 100 + i)
            for i in range(first, first + count)]


def _ids(config: IngestConfig, table: str) -> list[int]:
    return sorted(DeltaTable(str(config.table_path(table))).to_pyarrow_table(columns=["id"]).column("id").to_pylist())


@pytest.mark.spark
def test_a_modest_backlog_is_applied_on_the_driver_without_spark(tmp_path: Path) -> None:
    path, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["notes"], _changes(0, 250))
    produce(cfg, TOPICS["tags"], _changes(0, 40))

    done = _run(path)
    assert done["code"] == 0, done["output"]
    assert not done["spark"] and "pyspark" in done["loaded"]  # the journey's modules, not Spark's session
    assert done["gx"]  # the suite still validates every batch, on the driver
    assert "applied on the driver, Spark was not started" in done["output"]
    assert "│ notes │ 3 " in done["output"] and "│ tags  │ 1 " in done["output"]  # batches of <= 100 records
    assert _ids(cfg, "notes") == list(range(250)) and _ids(cfg, "tags") == list(range(40))
    assert pending(cfg, list(cfg.tables)) == {"notes": 0, "tags": 0}
    assert _run(path)["loaded"] == []  # caught up now: the next run starts nothing


@pytest.mark.spark
def test_a_backlog_too_big_for_the_driver_is_handed_to_spark_where_the_driver_stopped(
        tmp_path: Path, spark: Any) -> None:
    _, spark_only = _config(tmp_path, driver_seconds=0)
    produce(spark_only, TOPICS["notes"], _changes(0, 50))
    first = Runner(spark_only, spark=spark).run()
    assert not first.on_driver and first.tables["notes"].total("inserted") == 50
    checkpoint = spark_only.checkpoint_location / query_name(list(spark_only.tables))
    assert checkpoints.exists(checkpoint)

    produce(spark_only, TOPICS["notes"], _changes(50, 350))
    # A budget no batch can meet: the driver applies its first batch, then hands the rest over.
    _, hurried = _config(tmp_path, driver_seconds=1e-6)
    report = Runner(hurried, spark=spark).run()
    notes = report.tables["notes"]
    assert not report.on_driver and not report.failed
    assert notes.batches[0].received == 100  # the driver's batch, first in the run's report
    assert {b.run_id for b in notes.batches} == {report.run_id}  # one run, whoever applied its batches
    assert notes.total("received") == 350 and notes.total("inserted") == 350
    # Its Spark checkpoint was behind the Delta log: discarded, so Spark read nothing twice.
    assert notes.already_applied == 0
    assert _ids(hurried, "notes") == list(range(400))

    replay = Runner(spark_only, spark=spark).run(from_beginning=True)
    assert replay.tables["notes"].total("inserted") == 0 and replay.tables["notes"].total("updated") == 0
    assert _ids(spark_only, "notes") == list(range(400))


def test_a_table_that_fails_on_the_driver_stops_alone(tmp_path: Path) -> None:
    _, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["notes"], _changes(0, 30) + _changes(30, 1, body=None))  # the suite fails this batch
    produce(cfg, TOPICS["tags"], _changes(0, 30))

    report = Runner(cfg).run()
    assert report.on_driver and report.failed == ["notes"]
    assert "expectation" in (report.tables["notes"].error or "").lower()
    assert _ids(cfg, "tags") == list(range(30))
    assert pending(cfg, list(cfg.tables)) == {"notes": 31, "tags": 0}  # its offsets did not move


def test_tables_the_driver_cannot_apply_alone_start_spark(tmp_path: Path) -> None:
    _, cfg = _config(tmp_path, driver_seconds=60)
    notes, tags = cfg.tables
    assert refusal(cfg, notes) is None
    assert DriverRun.wanted(cfg, list(cfg.tables), {"notes": 5, "tags": 0})
    assert not DriverRun.wanted(cfg, list(cfg.tables), {"notes": 0, "tags": 0})  # nothing to do: the caught-up path

    by_spark = cfg.model_copy(update={"target": cfg.target.model_copy(update={"writer": "delta-spark"})})
    assert refusal(by_spark, notes) == "it is written by delta-spark"
    assert not DriverRun.wanted(by_spark, list(cfg.tables), {"notes": 5, "tags": 0})

    _, grouped = _config(tmp_path, driver_seconds=60, transactions={"topic": "app.transaction"})
    assert "transaction group" in (refusal(grouped, tags) or "")

    _, off = _config(tmp_path, driver_seconds=0)
    assert not DriverRun.wanted(off, list(off.tables), {"notes": 5, "tags": 0})


def test_ctrl_c_ends_a_driver_run_with_its_report_and_the_next_run_applies_the_rest(tmp_path: Path) -> None:
    _, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["tags"], _changes(0, 250))

    def interrupt(table: str, record: Any, result: Any) -> None:
        raise KeyboardInterrupt  # as Ctrl-C arriving once the first batch has committed

    report = Runner(cfg).run(progress=interrupt)
    assert report.on_driver and not report.failed
    assert pending(cfg, list(cfg.tables))["tags"] == 150  # the first batch of 100 committed, nothing else
    assert Runner(cfg).run().tables["tags"].total("received") == 150
    assert _ids(cfg, "tags") == list(range(250))


def test_ctrl_c_as_the_driver_hands_the_rest_to_spark_ends_the_run_before_spark_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The press comes after the driver's last batch, while its decoders close: the run's, not the
    caller's (a KeyboardInterrupt out of the run, or under Dagster a failed step)."""
    _, hurried = _config(tmp_path, driver_seconds=1e-6)  # the rest is handed to Spark after one batch
    produce(hurried, TOPICS["tags"], _changes(0, 250))
    close = driver_run._DecodedPieces.close

    def close_pressed(self: Any) -> None:
        signal.raise_signal(signal.SIGINT)
        close(self)

    def caller(signum: int, frame: Any) -> None:
        raise AssertionError("Ctrl-C reached the run's caller")

    monkeypatch.setattr(driver_run._DecodedPieces, "close", close_pressed)
    previous = signal.signal(signal.SIGINT, caller)
    try:
        with caplog.at_level("WARNING", logger="ingest.stream.driver_run"):
            report = Runner(hurried).run()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert report.on_driver and not report.failed  # it ended there: Spark did not start
    assert report.tables["tags"].total("received") == 100
    assert [r.event for r in caplog.records if hasattr(r, "event")] == ["run-interrupted"]
    assert pending(hurried, list(hurried.tables))["tags"] == 150


def _processes_with(marker: str) -> list[int]:
    """The processes whose environment holds ``marker`` (a killed run's, and anything it forked)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_a_driver_run_killed_mid_way_leaves_no_process_and_the_next_run_converges(tmp_path: Path) -> None:
    """Killed after its second batch's Delta commit, before the run's audit rows are appended."""
    path, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["notes"], _changes(0, 250))
    produce(cfg, TOPICS["tags"], _changes(0, 150))  # five batches: read by forked decoders
    marker = f"driver-run-{uuid.uuid4().hex}"

    killed = ingest_cli("run", "-c", str(path), env={"INGEST_KILL_AT": "after-delta-commit:2",
                                                               "INGEST_TEST_MARKER": marker})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert pending(cfg, list(cfg.tables))["tags"] > 0  # killed before it was done
    wait_until(lambda: not _processes_with(marker), what="the killed run's decoders to leave", timeout=15)

    again = ingest_cli("run", "-c", str(path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert _ids(cfg, "notes") == list(range(250)) and _ids(cfg, "tags") == list(range(150))
    assert pending(cfg, list(cfg.tables)) == {"notes": 0, "tags": 0}
    rows = audit.read(TablePaths.of(cfg, "notes").audit).to_pylist()
    received = {t: sum(r["received"] for r in rows if r["table"] == t and r["status"] == "committed")
                for t in ("notes", "tags")}
    assert received == {"notes": 250, "tags": 150}  # every record in exactly one committed batch's audit row


#: How a run gets stopped: Ctrl-C in a terminal (SIGINT to its whole process group); SIGTERM to the
#: run alone, as ``docker stop``, Kubernetes or systemd's ``KillMode=mixed`` send it; SIGTERM to
#: every process of the run at once, as systemd's default ``KillMode=control-group`` sends it.
STOPS = ("ctrl-c", "sigterm", "sigterm-to-all")


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """``start(config, marker, *options, ignoring_ctrl_c=False)``: ``ingest run`` in a session of its
    own, killed with its processes if a failing test left it running; ``ignoring_ctrl_c``: started as
    a shell starts a script's background job, with Ctrl-C ignored."""
    started: list[subprocess.Popen[str]] = []

    def run(path: Path, marker: str, *options: str, ignoring_ctrl_c: bool = False) -> subprocess.Popen[str]:
        shell = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"] if ignoring_ctrl_c else []
        started.append(subprocess.Popen(
            [*shell, sys.executable, "-m", "ingest.cli", "run", "-c", str(path), *options], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**os.environ, "INGEST_TEST_MARKER": marker}))
        return started[-1]

    yield run
    for left in started:
        with contextlib.suppress(ProcessLookupError):  # its group: a JVM left behind the run too
            os.killpg(left.pid, signal.SIGKILL)
        left.communicate()


def _stop(run: subprocess.Popen[str], how: str, marker: str, *, head_start: float = 0) -> tuple[str, str]:
    """Stop ``run`` as ``how`` says; SIGTERM to every process reaches the run ``head_start`` seconds
    after the others (its decoders, Spark's JVM and its Python workers)."""
    if how == "ctrl-c":
        os.killpg(run.pid, signal.SIGINT)
    elif how == "sigterm":
        run.send_signal(signal.SIGTERM)
    else:
        for pid in _processes_with(marker):
            if pid != run.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        time.sleep(head_start)
        run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    wait_until(lambda: not _processes_with(marker), what="the run's processes to leave", timeout=15)
    return out, err


@pytest.mark.parametrize("how", STOPS)
def test_a_stopped_driver_run_ends_with_its_report_and_leaves_no_table_held(tmp_path: Path, how: str, start: Any,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The batch under way finishes (cut short inside DuckDB, it would fail its table), then the run
    ends. SIGTERM killed the run outright before: no report, exit -15, every table's lease left for the
    next run to take over."""
    path, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["tags"], _changes(0, 3000))  # thirty batches: the run is still busy when stopped
    marker = f"driver-run-{uuid.uuid4().hex}"
    run = start(path, marker)
    wait_until(lambda: pending(cfg, list(cfg.tables))["tags"] < 3000, what="the first batch", timeout=120)
    out, err = _stop(run, how, marker)

    assert run.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "the batch under way finishes, then the run ends" in err and "applied on the driver" in out
    assert "stopped" not in err  # the batch under way was not cut short: no table failed
    left = pending(cfg, list(cfg.tables))["tags"]
    assert 0 < left < 3000
    assert Runner(cfg).run().tables["tags"].total("received") == left  # the next run applies exactly the rest
    assert "took over the lease" not in caplog.text
    assert _ids(cfg, "tags") == list(range(3000))


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_run_started_ignoring_ctrl_c_ignores_it_and_stops_on_sigterm(tmp_path: Path, how: str, start: Any) -> None:
    """A script's background job (``ingest run &``) starts with Ctrl-C ignored, as the shell's
    convention has it, so that Ctrl-C at the script's terminal stops the script and not its jobs.
    The run's handler replaced the ignore: the run stopped. SIGTERM still stops it, with its report."""
    path, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["tags"], _changes(0, 3000))
    marker = f"driver-run-{uuid.uuid4().hex}"
    run = start(path, marker, ignoring_ctrl_c=True)
    wait_until(lambda: pending(cfg, list(cfg.tables))["tags"] < 3000, what="the first batch", timeout=120)
    out, err = _stop(run, how, marker)

    assert run.returncode == 0 and "Traceback" not in err and "applied on the driver" in out, err[-3000:]
    left = pending(cfg, list(cfg.tables))["tags"]
    if how == "ctrl-c":
        assert left == 0 and "interrupted" not in err
    else:
        assert 0 < left < 3000 and "the batch under way finishes, then the run ends" in err
    assert _ids(cfg, "tags") == list(range(3000 - left))


@pytest.mark.spark
@pytest.mark.parametrize("how", STOPS)
def test_a_stopped_continuous_spark_run_ends_with_its_report(tmp_path: Path, how: str, start: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The service's case: ``run --continuous`` through Spark's queries, caught up and waiting. SIGTERM
    to every process reached Spark's JVM too, which shut down under the run: "error: internal error:
    Py4JJavaError: An error occurred while calling o101.stop", exit 5."""
    path, cfg = _config(tmp_path, driver_seconds=0)
    produce(cfg, TOPICS["tags"], _changes(0, 50))
    marker = f"spark-run-{uuid.uuid4().hex}"
    run = start(path, marker, "--continuous")
    wait_until(lambda: pending(cfg, list(cfg.tables))["tags"] == 0, what="the backlog applied", timeout=240)
    out, err = _stop(run, how, marker, head_start=1)  # time for the JVM to shut down, when it did

    assert run.returncode == 0 and "Traceback" not in err and "error:" not in err, err[-3000:]
    assert "interrupted: the micro-batch under way finishes, then the queries stop" in err
    assert "│ tags" in out and "applied on the driver" not in out  # the run's report, of a Spark run
    produce(cfg, TOPICS["tags"], _changes(50, 5))
    assert _rest_on_the_driver(tmp_path) == 5
    assert "took over the lease" not in caplog.text


def _rest_on_the_driver(tmp_path: Path) -> int:
    """The records the next run applies after a stopped Spark run, applied on the driver: where a run
    resumes is the Delta log's, whoever applies, and the driver needs no streaming query's start."""
    _, on_driver = _config(tmp_path, driver_seconds=60)
    report = Runner(on_driver).run()
    assert report.on_driver and not report.failed
    return report.tables["tags"].total("received")


def _started(marker: str, what: str, cfg: IngestConfig) -> bool:
    """Whether the run's start reached ``what``: Spark's JVM running, or a query's checkpoint written."""
    if what == "jvm":
        return any(b"SparkSubmit" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in _processes_with(marker))
    return (cfg.checkpoint_location / query_name(list(cfg.tables)) / "metadata").local.exists()


@pytest.mark.spark
@pytest.mark.parametrize("when", ["jvm", "query"])
def test_ctrl_c_while_a_spark_run_starts_ends_it_before_any_micro_batch(tmp_path: Path, when: str, start: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C in the first seconds of Spark's start cut PySpark's launch short, which deleted the file
    Spark's JVM was about to write its port in: the JVM stayed behind the run for good, holding its
    output open (this test's read of it never ended). Later in the start, py4j printed
    "KeyboardInterrupt while sending command" and its traceback, exit 130."""
    path, cfg = _config(tmp_path, driver_seconds=0)
    produce(cfg, TOPICS["tags"], _changes(0, 50))
    marker = f"spark-run-{uuid.uuid4().hex}"
    run = start(path, marker)
    wait_until(lambda: _started(marker, when, cfg), what=f"the run's start to reach its {when}", timeout=240,
               interval=0.05)
    out, err = _stop(run, "ctrl-c", marker)

    assert run.returncode == 0 and "Traceback" not in err and "error:" not in err, err[-3000:]
    assert "interrupted while the run starts" in err and "│ tags" in out
    assert pending(cfg, list(cfg.tables))["tags"] == 50  # no micro-batch
    assert _rest_on_the_driver(tmp_path) == 50
    assert "took over the lease" not in caplog.text


def _reading(marker: str) -> bool:
    """Whether one of the run's Spark Python workers is busy (its CPU time grows within 100 ms)."""
    def cpu() -> dict[int, int]:
        times = {}
        for pid in _processes_with(marker):
            with contextlib.suppress(OSError):
                if b"pyspark.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    times[pid] = int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
        return times

    before = cpu()
    time.sleep(0.1)
    return any(ticks > before.get(pid, ticks) for pid, ticks in cpu().items())


@pytest.mark.spark
@pytest.mark.parametrize(("options", "how"), [(("--continuous",), "ctrl-c"), (("--continuous",), "sigterm"),
                                              ((), "ctrl-c")], ids=["continuous-ctrl-c", "continuous-sigterm",
                                                                     "draining-ctrl-c"])
def test_a_spark_run_stopped_mid_catch_up_lets_the_micro_batch_under_way_commit(
        tmp_path: Path, options: tuple[str, ...], how: str, start: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Micro-batches too big for the driver, read by Spark's Python workers. PySpark's SIGINT handler
    cancelled every Spark job, so the read under way failed: tracebacks from py4j, Spark and its
    Python daemon, and at times "error: internal error: Py4JError: Gateway must be connected to send
    cancel cmd", exit 5. A draining run, which waited in ``awaitTermination``, printed no report
    and was at times aborted (exit -6). (SIGTERM to every process reaches those workers too: see
    operations.md.)"""
    path, cfg = _config(tmp_path, driver_seconds=0, max_records_per_batch=5000)
    produce(cfg, TOPICS["tags"], _changes(0, 60_000))
    marker = f"spark-run-{uuid.uuid4().hex}"
    run = start(path, marker, *options)
    wait_until(lambda: pending(cfg, list(cfg.tables))["tags"] < 60_000, what="the first micro-batch", timeout=240)
    # Looked for often: the twelve micro-batches take a second or so each, and a press that comes
    # with the last of them leaves nothing to apply.
    wait_until(lambda: _reading(marker), what="a Python worker reading a micro-batch", timeout=60, interval=0.05)
    out, err = _stop(run, how, marker)

    assert run.returncode == 0 and "│ tags" in out, err[-3000:]
    assert [line for line in err.splitlines() if "Traceback" in line or "ERROR" in line or "error:" in line] == []
    left = pending(cfg, list(cfg.tables))["tags"]
    # whole micro-batches committed, none cut short
    assert 0 < left < 60_000 and left % 5000 == 0, f"{left} left\n{out[-3000:]}\n{err[-3000:]}"
    assert Runner(cfg).run().tables["tags"].total("received") == left
    assert "took over the lease" not in caplog.text and "cannot be trusted" not in caplog.text
    assert _ids(cfg, "tags") == list(range(60_000))


def test_a_checkpoint_the_store_will_not_delete_does_not_fail_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    _, cfg = _config(tmp_path, driver_seconds=60)
    produce(cfg, TOPICS["tags"], _changes(0, 30))

    def refuse(directory: Any) -> None:
        raise OSError("AccessDenied: s3:DeleteObject")

    monkeypatch.setattr(checkpoints, "discard", refuse)
    report = Runner(cfg).run()
    assert report.on_driver and not report.failed and _ids(cfg, "tags") == list(range(30))
    assert "could not discard the Spark checkpoint" in caplog.text and "AccessDenied" in caplog.text
