"""``--log-format json`` and ``--log-level`` (issue 46, point 2).

A real ``ingest run`` in a subprocess: every stderr line is one JSON object, each table batch is an
event whose figures are the audit's, and a credential the process knows never appears in a line,
whichever field would carry it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest import logs, secrets
from ingest.config import load_config
from ingest.records import audit
from tests.dagster.conftest import produce
from tests.harness import ingest_cli

TOPIC = "app.public.notes"


def _config(tmp_path: Path, **source: Any) -> Path:
    raw = {"workdir": str(tmp_path / "work"),
           "source": {"value_format": "json", "max_records_per_batch": 7, **source},
           "tables": [{"name": "notes", "topic": TOPIC}, {"name": "tags", "topic": "app.public.tags"}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _ingest(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return ingest_cli(*args, env={"PYTHONUNBUFFERED": "1", **(env or {})}, timeout=600)


@pytest.mark.spark
def test_a_run_logs_one_json_object_per_line_with_each_batch_and_its_figures(tmp_path: Path) -> None:
    path = _config(tmp_path)
    config = load_config(path)
    produce(config, TOPIC, [("c", {"id": i, "body": f"note {i}"}, 100 + i) for i in range(20)])
    produce(config, "app.public.tags", [("c", {"id": i, "body": "t"}, 200 + i) for i in range(3)])
    done = _ingest("--log-format", "json", "--log-level", "info", "run", "-c", str(path))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    batches = [r for r in records if r.get("event") == "batch"]
    rows = audit.read(config.tables_root / config.target.audit_table).to_pylist()
    assert len(batches) == len(rows) >= 4
    by_batch = {(r["table"], r["batch_id"]): r for r in rows}
    for event in batches:
        row = by_batch[(event["table"], event["batch"])]
        assert {k: event["figures"][k] for k in ("received", "inserted", "updated", "deleted", "delta_version")} \
            == {k: row[k] for k in ("received", "inserted", "updated", "deleted", "delta_version")}
    finished = [r for r in records if r.get("event") == "run-finished"]
    assert len(finished) == 1 and finished[0]["figures"]["received"] == 23 and finished[0]["figures"]["failed"] == []
    assert next(r["event"] for r in records if "event" in r) == "run-started"

    # the environment sets it too, and the default level keeps a run's info lines out
    again = _ingest("run", "-c", str(path), env={"CDC_INGEST_LOG_FORMAT": "json"})
    assert again.returncode == 0 and not [ln for ln in again.stderr.splitlines() if '"event"' in ln]


def test_no_credential_reaches_a_json_or_text_line(capsys: Any) -> None:
    secret = "pa55-w0rd-in-a-log"
    secrets.register(secret)
    log = logging.getLogger("ingest.test")
    try:
        for fmt in ("json", "text"):
            logs.configure(fmt, "info")  # type: ignore[arg-type]
            logs.event(log, "table-stopped", f"refused with {secret}", table="t", level=logging.ERROR,
                       error=f"sasl password={secret}")
            try:
                raise RuntimeError(f"connect with {secret}")
            except RuntimeError:
                log.exception("failed: %s", secret)
        err = capsys.readouterr().err
    finally:
        logs.configure()
    assert err.count("refused with") == 2 and "connect with" in err
    assert secret not in err
    first = json.loads(err.splitlines()[0])
    assert first["event"] == "table-stopped" and first["table"] == "t" and first["level"] == "ERROR"


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_process_spark_starts_for_the_engine_logs_as_the_cli_that_started_spark(fmt: str, tmp_path: Path) -> None:
    """The Python process Spark starts to run the engine's stream (its data source runner, which warns
    of a source that stopped answering) gets the CLI's format and level from the environment, and keeps
    librdkafka's failed connection attempts out, as the CLI's own process does. Before, a real broker
    outage printed the reader's warning bare, and 327 lines of librdkafka's in 30 s (by hand)."""
    code = ("import logging; from ingest import logs; from ingest.source.reader import TopicLogDataSource; "
            f"TopicLogDataSource({{'subscribe': 't', 'path': {str(tmp_path)!r}}}).streamReader(None); "
            "logging.getLogger('ingest.source.reader').warning('Kafka did not answer; the stream waits'); "
            "logging.getLogger(logs.LIBRDKAFKA).error('FAIL|rdkafka#consumer-1| Connection refused'); "
            "logging.getLogger('ingest.source.reader').debug('below the level')")
    env = {**os.environ, logs.FORMAT_VARIABLE: fmt, logs.LEVEL_VARIABLE: "info"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = done.stderr.splitlines()
    if fmt == "json":
        assert [(r["level"], r["logger"], r["message"]) for r in map(json.loads, lines)] == [
            ("WARNING", "ingest.source.reader", "Kafka did not answer; the stream waits")]
    else:
        assert lines == ["WARNING ingest.source.reader: Kafka did not answer; the stream waits"]


def test_the_cli_leaves_its_log_settings_to_the_processes_it_starts(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ingest.cli import app

    try:
        CliRunner().invoke(app, ["--log-level", "info", "status", "-c", str(tmp_path / "missing.yaml")])
    finally:
        logs.configure()
    assert (os.environ.get(logs.FORMAT_VARIABLE), os.environ.get(logs.LEVEL_VARIABLE)) == ("text", "info")


def test_a_commands_error_line_is_an_error_in_json(tmp_path: Path) -> None:
    """``--log-format json`` turns the CLI's own ``error:`` line (why the command failed) into a JSON line
    whose level is ERROR: a pipeline that keeps errors must not find it at INFO."""
    done = _ingest("--log-format", "json", "check", "-c", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2
    (line,) = [json.loads(ln) for ln in done.stderr.splitlines() if ln.strip()]
    assert line["level"] == "ERROR" and line["message"].startswith("error:") and "missing.yaml" in line["message"]
    assert [logs.level_of_line(text) for text in ("24/12/04 03:00:00 WARN TaskSetManager: lost", "ERROR Executor: x",
                                                  "error: no such table", "Ivy resolution report")] == [
        "WARNING", "ERROR", "ERROR", "INFO"]


def test_json_lines_reach_stderr_at_the_end_without_waiting_for_the_pipe() -> None:
    """At the process's end the last lines are drained to the real stderr, and the pump that makes them
    JSON finishes then, instead of waiting out its timeout for a pipe that this process still held."""
    code = ("import atexit, sys\n"
            "from ingest import logs\n"
            "atexit.register(lambda: print('pump running after the drain:', logs._WRAPPED[0].is_alive()))\n"
            "logs.json_stderr()\n"
            "print('the last line', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "pump running after the drain: False"
    (line,) = [json.loads(ln) for ln in done.stderr.splitlines() if ln.strip()]
    assert line["message"] == "the last line"


def test_json_logging_leaves_a_callers_captured_stderr_open() -> None:
    """Under a CLI runner that captures Python's stderr (a test's, a notebook's), ``--log-format json``
    rewires descriptor 2 and leaves the caller's stream in place: replacing it dropped the runner's last
    reference, closed it, and the runner's second look at it failed with "I/O operation on closed file".
    In a subprocess: the rewiring is the whole process's."""
    code = ("from typer.testing import CliRunner\n"
            "from ingest.cli.commands import app\n"
            "runner = CliRunner()\n"
            "for _ in range(2):\n"
            "    done = runner.invoke(app, ['--log-format', 'json', 'check', '-c', '/nowhere/missing.yaml'])\n"
            "    print(done.exit_code, repr(done.exception), done.stderr.strip())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    said = "error: /nowhere/missing.yaml: configuration file not found"
    assert all(ln.startswith("2 SystemExit(") and ln.endswith(said) for ln in lines), lines


@pytest.mark.spark
def test_a_run_through_spark_prints_no_banner_of_sparks(tmp_path: Path) -> None:
    """A driver started from Python counts, for Spark, as an interactive shell: it set its console to
    WARN and said so on stderr ("Setting default log level to ...", "To adjust logging level use
    sc.setLogLevel ...") at every run that started Spark, in the middle of the engine's own lines. Its
    JVM's boot printed "WARNING: Using incubator modules: jdk.incubator.vector" (ingest.spark.gateway)."""
    path = _config(tmp_path, driver_seconds=0)
    produce(load_config(path), TOPIC, [("c", {"id": i, "body": f"note {i}"}, 100 + i) for i in range(5)])
    done = _ingest("run", "-c", str(path))
    assert done.returncode == 0 and "notes: batch 0" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Spark was not started" not in done.stdout  # through Spark's queries
    assert "log level" not in done.stderr and "setLogLevel" not in done.stderr, done.stderr
    assert "incubator" not in done.stderr, done.stderr


@pytest.mark.parametrize("level", ["info", "debug"])
def test_the_log_level_is_the_engines_and_libraries_speak_up_from_warning(level: str) -> None:
    """``--log-level info`` printed 209 lines of Great Expectations' about its own functions (and each HTTP
    request) around the engine's four lines of a run. Debugging shows them all."""
    code = ("import logging; from ingest import logs; "
            f"logs.configure('text', {level!r}); "
            "import great_expectations; "
            "logging.getLogger('httpx').info('HTTP Request: GET /subjects'); "
            "logging.getLogger('great_expectations').warning('a library warns'); "
            "logging.getLogger('ingest.stream.runner').info('run finished')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stderr.splitlines()
    assert "INFO ingest.stream.runner: run finished" in lines and "WARNING great_expectations: a library warns" in lines
    libraries = [line for line in lines if line.startswith(("INFO great_expectations", "INFO httpx"))]
    assert (len(libraries) > 100) if level == "debug" else libraries == [], lines[:5]
