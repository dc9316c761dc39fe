"""One CLI convention: the configuration from -c or CDC_INGEST_CONFIG, --format checked and JSON on every
read command, one way to name a table, and distinct exit codes with one line for an operational error.

The table is written by the journey on the driver (no Spark): the commands read it as an analyst would.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from harness.stack.process import wait_until
from typer.testing import CliRunner

from ingest.apply.journey import apply_parts
from ingest.cli import app
from ingest.cli.outcome import Exit, classify
from ingest.config import load_config
from ingest.errors import (
    ConfigError,
    LakeUnavailableError,
    QueryError,
    RegistryUnavailableError,
    SchemaIncompatibleError,
    SourceUnavailableError,
    TableLockedError,
)
from ingest.lake.layout import TablePaths
from tests.factories import change, decoded_rows, source_bytes

runner = CliRunner()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A configuration whose table ``t`` holds two commits (one quarantined message)."""
    root = tmp_path_factory.mktemp("cli")
    path = root / "ingest.yaml"
    path.write_text("tables: [{name: t, topic: t}]\n")
    config = load_config(path)
    paths = TablePaths.of(config, "t")
    apply_parts(config.table("t"), paths, decoded_rows([change("c", 1, 10), change("c", 2, 11)]), batch_id=0,
                run_id="cli")
    apply_parts(config.table("t"), paths, decoded_rows([change("u", 1, 12, name="y"), "not json"], first_offset=2),
                batch_id=1, run_id="cli", fetch_raw=source_bytes)
    return path


def _invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, list(args), env=env)


def test_the_configuration_comes_from_the_environment_when_not_given(lake: Path) -> None:
    by_option = _invoke("history", "-t", "t", "-c", str(lake), "--format", "json")
    by_env = _invoke("history", "-t", "t", "--format", "json", env={"CDC_INGEST_CONFIG": str(lake)})
    assert by_option.exit_code == 0 and by_env.exit_code == 0, by_option.output + by_env.output
    assert by_env.stdout == by_option.stdout and by_env.stdout


@pytest.mark.parametrize("command", [["status"], ["history", "-t", "t"], ["changes", "-t", "t", "--from-version", "0"],
                                     ["quarantine", "list"], ["quality", "list", "-t", "t"], ["query", "select 1"]])
def test_an_unknown_format_is_a_usage_error(lake: Path, command: list[str]) -> None:
    result = _invoke(*command, "-c", str(lake), "--format", "xml")
    assert result.exit_code == Exit.USAGE and "xml" in result.output


@pytest.mark.parametrize(("command", "check"), [
    (["status"], lambda rows: rows[0]["table"] == "t" and rows[0]["delta_version"] == 1),
    (["history", "-t", "t"], lambda commits: [c["version"] for c in commits] == [1, 0]),
    (["changes", "-t", "t", "--from-version", "0"], lambda rows: {r["id"] for r in rows} == {1, 2}),
    (["quarantine", "list"], lambda rows: [r["reason"] for r in rows] == ["not json"] and rows[0]["raw_value"]),
    (["query", "select id, name from t order by id"], lambda rows: rows == [{"id": 1, "name": "y"},
                                                                            {"id": 2, "name": "x"}]),
])
def test_every_read_command_prints_json(lake: Path, command: list[str], check: Any) -> None:
    result = _invoke(*command, "-c", str(lake), "--format", "json")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert check([json.loads(line) for line in lines]), result.stdout


def test_a_table_is_named_with_table_or_as_the_argument_of_history_and_changes(lake: Path) -> None:
    as_argument = _invoke("history", "t", "-c", str(lake), "--format", "json")
    as_option = _invoke("history", "--table", "t", "-c", str(lake), "--format", "json")
    assert as_argument.exit_code == 0 and as_argument.stdout == as_option.stdout
    both = _invoke("history", "t", "-t", "u", "-c", str(lake))
    neither = _invoke("changes", "-c", str(lake), "--from-version", "0")
    assert both.exit_code == neither.exit_code == Exit.USAGE
    assert "two tables named" in both.output and "name the table" in neither.output


@pytest.mark.parametrize(("error", "code"), [
    (ConfigError("x.yaml: tables[0].name: bad"), Exit.USAGE),
    (QueryError("the query failed: Parser Error"), Exit.USAGE),
    (SourceUnavailableError("Kafka at b:9092 did not answer"), Exit.UNAVAILABLE),
    (RegistryUnavailableError("schema registry refused: HTTP 401"), Exit.UNAVAILABLE),
    (LakeUnavailableError("lake s3://b/x: the bucket does not exist"), Exit.UNAVAILABLE),
    (SchemaIncompatibleError("t", "c", "integer", "string"), Exit.TABLE_FAILED),
    (TableLockedError("t", "held by pid 7", "pid 7"), Exit.TABLE_FAILED),
    (ConnectionRefusedError("refused"), Exit.UNAVAILABLE),
    (NotADirectoryError(20, "Not a directory", "/data/lake/_cdc_locks"), Exit.UNAVAILABLE),
    (PermissionError(13, "Permission denied", "/data/checkpoints/t"), Exit.UNAVAILABLE),
    (FileNotFoundError(2, "No such file or directory", "/opt/ingest/x.py"), Exit.INTERNAL),
    (KeyError("boom"), Exit.INTERNAL),
])
def test_each_kind_of_error_has_its_exit_code_and_one_line(error: Exception, code: Exit) -> None:
    got, line = classify(error)
    assert got == code and "\n" not in line and line
    if code == Exit.INTERNAL:
        assert "--debug" in line


def _cli(*args: str, cwd: Path, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120, check=False)


def test_kafka_without_its_sasl_credentials_is_one_line_and_exit_3(tmp_path: Path) -> None:
    (tmp_path / "k.yaml").write_text(
        "source: {kind: kafka, kafka: {bootstrap_servers: '127.0.0.1:9', credentials_env: NO_SUCH_JAAS,\n"
        "  options: {kafka.security.protocol: SASL_PLAINTEXT, kafka.sasl.mechanism: PLAIN}}}\n"
        "tables: [{name: t, topic: t}]\n")
    done = _cli("status", "-c", "k.yaml", cwd=tmp_path)
    assert done.returncode == Exit.UNAVAILABLE, done.stdout + done.stderr
    problems = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(problems) == 1 and "Kafka at 127.0.0.1:9" in problems[0] and "NO_SUCH_JAAS" in problems[0], problems
    assert "Traceback" not in done.stderr


def test_writing_to_a_kafka_that_does_not_answer_is_one_line_naming_the_cause(tmp_path: Path) -> None:
    """librdkafka printed each failed connection attempt of ``ingest produce`` (and ``resnapshot``'s
    signal) straight to stderr, about 50 lines in 15 s before the engine's own."""
    (tmp_path / "k.yaml").write_text("source: {kind: kafka, kafka: {bootstrap_servers: '127.0.0.1:9'}}\n"
                                     "tables: [{name: t, topic: t}]\n")
    (tmp_path / "r.jsonl").write_text('{"key": null, "value": "eA=="}\n')
    done = _cli("produce", "t", "-c", "k.yaml", "-f", "r.jsonl", cwd=tmp_path)
    assert done.returncode == Exit.UNAVAILABLE, done.stdout + done.stderr
    problems = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(problems) == 1, done.stderr
    assert "Kafka at 127.0.0.1:9" in problems[0] and "Connection refused" in problems[0], problems


def test_a_lake_directory_that_is_a_file_is_one_line_naming_it_and_exit_3(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "lake").write_text("")
    (tmp_path / "c.yaml").write_text("workdir: w\ntarget: {root: lake}\ntables: [{name: t, topic: t}]\n")
    done = _cli("run", "-c", "c.yaml", cwd=tmp_path)
    assert done.returncode == Exit.UNAVAILABLE, done.stdout + done.stderr
    problems = [line for line in done.stderr.splitlines() if line.strip()]
    assert problems == [f"error: unavailable: {tmp_path / 'w' / 'lake'}/_cdc_locks: Not a directory"], problems


@pytest.mark.parametrize(("args", "says"), [
    (["verify", "--source-db", "mysql://u:pw@127.0.0.1:noport/db"], "mysql:// URL is not valid: Port could not be"),
    (["verify", "--source-db", "dbname"], "connection string is not valid: missing \"=\" after \"dbname\""),
    (["produce", "t", "-f", "no-such.jsonl"], "'no-such.jsonl' does not exist"),
    (["history", "t", "--limit", "-1"], "greater than or equal to 1"),
    (["query", "SELECT 1", "--limit", "0"], "greater than or equal to 1"),
    (["verify", "-t", "t"], "Invalid value for --table: only with --source-db"),
    (["verify"], "no simulated source under"),  # was exit 5, FileNotFoundError: .../truth/truth.json
    (["quarantine", "list", "-t", "nosuch"], "no table named 'nosuch' in the configuration (its tables: t)"),
    (["quarantine", "list", "--stage", "decod"], "'decod' is not a stage: decode, key, quality"),
    (["quarantine", "replay", "-t", "t", "--stage", "keys"], "'keys' is not a stage"),
])
def test_a_malformed_argument_is_a_usage_error_naming_it(lake: Path, args: list[str], says: str) -> None:
    done = runner.invoke(app, [*args, "-c", str(lake)])
    assert done.exit_code == Exit.USAGE, done.output
    assert says in _unboxed(done.output), done.output


def _unboxed(output: str) -> str:
    """A usage error's text without the lines and borders of the box typer prints it in."""
    return " ".join(output.replace("│", " ").split())


def test_produce_refuses_a_line_that_is_not_a_record(tmp_path: Path) -> None:
    """A misspelled field used to leave key and value empty: a tombstone was written instead."""
    config = tmp_path / "c.yaml"
    config.write_text("tables: [{name: t, topic: t}]\n")
    done = runner.invoke(app, ["produce", "t", "-c", str(config)], input='{"key": null, "vlaue": "eA=="}\n')
    assert done.exit_code == Exit.USAGE, done.output
    assert "unknown field(s) vlaue" in _unboxed(done.output), done.output
    assert not (tmp_path / "w").exists() and not list(tmp_path.rglob("*.log")), list(tmp_path.rglob("*"))


def test_an_s3_lake_without_credentials_is_one_line_naming_the_location(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("target: {root: 's3://nobucket/lake', storage: {endpoint_url: "
                                     "'http://127.0.0.1:9', region: us-east-1}}\ntables: [{name: t, topic: t}]\n")
    done = _cli("history", "-t", "t", "-c", "s.yaml", cwd=tmp_path,
                unset=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"))
    assert done.returncode == Exit.UNAVAILABLE, done.stdout + done.stderr
    problems = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
    assert len(problems) == 1 and "lake s3://nobucket/lake/t" in problems[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_query_before_the_first_run_says_no_run_has_created_the_table(tmp_path: Path) -> None:
    """It said "Table with name t does not exist! (tables: t, ...)", naming t among the tables."""
    (tmp_path / "c.yaml").write_text("tables: [{name: t, topic: t}]\n")
    done = runner.invoke(app, ["query", "SELECT * FROM t", "-c", str(tmp_path / "c.yaml")])
    assert done.exit_code == Exit.USAGE
    assert "(tables: none; no run has created t, _cdc_audit, _cdc_quarantine yet)" in _unboxed(done.output)


def test_bad_sql_is_one_line_and_exit_2_and_debug_shows_the_traceback(lake: Path) -> None:
    done = _cli("query", "SELEC 1", "-c", str(lake), cwd=lake.parent)
    assert done.returncode == Exit.USAGE
    assert done.stderr.strip().splitlines() == ['error: the query failed: Parser Error: syntax error at or near '
                                                '"SELEC" (tables: t, _cdc_audit, _cdc_quarantine)']
    debug = _cli("--debug", "query", "SELEC 1", "-c", str(lake), cwd=lake.parent)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "QueryError" in debug.stderr


def test_status_shows_no_offset_as_a_dash_not_minus_one(tmp_path: Path) -> None:
    """An empty partition read "p1:-/-1", and a table no run had created "Delta version None"."""
    path = tmp_path / "ingest.yaml"
    path.write_text("tables: [{name: a, topic: t}]\n")
    produced = runner.invoke(app, ["produce", "t", "-c", str(path), "--partitions", "3"],
                             input='{"partition": 0, "key": null, "value": "e30="}\n')
    assert produced.exit_code == 0, produced.output
    done = runner.invoke(app, ["status", "-c", str(path)])
    assert done.exit_code == 0, done.output
    row = next(line for line in done.output.splitlines() if line.startswith("│ a "))
    assert [cell.strip() for cell in row.strip("│").split("│")][2:5] == ["p0:-/0, p1:-/-, p2:-/-", "1", "-"], row


def test_a_batch_that_commits_nothing_says_so_and_json_sent_to_an_avro_table_is_named(tmp_path: Path) -> None:
    """The batch line ended "-> vNone", and the quarantine said only "magic byte is 0x7b"."""
    path = tmp_path / "ingest.yaml"
    path.write_text("tables: [{name: a, topic: t, primary_key: [id]}]\n")
    produced = runner.invoke(app, ["produce", "t", "-c", str(path), "--partitions", "1"],
                             input='{"key": null, "value": "eyJpZCI6IDF9"}\n')  # {"id": 1}, not Avro
    assert produced.exit_code == 0, produced.output
    done = runner.invoke(app, ["run", "-c", str(path)])
    assert done.exit_code == 0, done.output
    assert "quarantined 1" in done.output and "-> no commit (" in done.output, done.output
    held = runner.invoke(app, ["quarantine", "list", "-c", str(path), "--format", "json"])
    assert held.exit_code == 0, held.output
    assert "it starts like JSON: is source.value_format json?" in held.output, held.output


@pytest.mark.parametrize("command", [["status"], ["maintain", "--dry-run"]])
def test_no_configuration_outside_a_checkout_says_how_to_give_one(tmp_path: Path, command: list[str]) -> None:
    """Away from the checkout, "configs/demo.yaml: configuration file not found" named a file the user never chose."""
    done = _cli(*command, cwd=tmp_path, unset=("CDC_INGEST_CONFIG",))
    assert done.returncode == Exit.USAGE, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: configs/demo.yaml: configuration file not found; it is the default, the demo's in a checkout: "
        "give -c FILE or set CDC_INGEST_CONFIG (ingest init writes one)"], done.stderr


@pytest.mark.parametrize("command", [["history", "t", "--format", "json"], ["changes", "t", "--from-version", "0"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(lake: Path, command: list[str]) -> None:
    """``ingest changes ... | head`` printed "error: unavailable: BrokenPipeError" and exited 3, as for an outage."""
    done = subprocess.Popen([sys.executable, "-m", "ingest.cli", *command, "-c", str(lake)], cwd=lake.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert done.stdout is not None
    done.stdout.close()  # the reader goes away before the command writes (it is still importing)
    _, stderr = done.communicate(timeout=120)
    assert (done.returncode, stderr) == (Exit.OUTPUT_CLOSED, "")


def test_a_broken_pipe_that_is_not_the_output_is_an_error() -> None:
    """A socket the command writes to is not its reader: a broken one is an outage, not a quiet end."""
    assert classify(BrokenPipeError(32, "Broken pipe"))[0] == Exit.UNAVAILABLE


def test_history_says_when_it_shows_part_of_a_tables_commits(lake: Path) -> None:
    whole = _invoke("history", "t", "-c", str(lake))
    part = _invoke("history", "t", "-c", str(lake), "--limit", "1")
    assert whole.exit_code == part.exit_code == 0, whole.output + part.output
    assert "t: 2 commits, newest first" in whole.output
    assert "t: the newest 1 of 2 commits" in part.output, part.output


def test_every_command_sums_itself_up_in_one_line_for_the_list_of_commands() -> None:
    """Typer's list of commands keeps a summary's line breaks: ``ingest --help`` broke seven of them mid-sentence."""
    def commands(group: Any, prefix: str = "") -> Any:
        for name, command in group.commands.items():
            yield prefix + name, command
            if hasattr(command, "commands"):
                yield from commands(command, f"{prefix}{name} ")

    broken = [name for name, command in commands(typer.main.get_command(app))
              if "\n" in inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]]
    assert broken == []


def test_the_help_lists_every_exit_code() -> None:
    """``ingest --help`` listed 0-5, not 130 (interrupted) nor 141 (the output's reader went away)."""
    shown = " ".join(runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output.replace("│", " ").split())
    listed = shown[shown.index("Exit codes:"):]
    assert [code.value for code in Exit if not re.search(rf"[:;] {code.value} \w", listed)] == []


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_sigterm_interrupts_a_command_as_ctrl_c_does(tmp_path: Path, stop: signal.Signals) -> None:
    """Ctrl-C ends a command with 130, quietly (Typer's answer); SIGTERM killed it outright (-15)."""
    (tmp_path / "c.yaml").write_text("tables: [{name: t, topic: t}]\n")
    waiting = subprocess.Popen([sys.executable, "-m", "ingest.cli", "produce", "t", "-c", str(tmp_path / "c.yaml")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wchan = Path(f"/proc/{waiting.pid}/wchan")
    wait_until(lambda: "pipe_read" in wchan.read_text(), what="produce reading stdin", timeout=60,
               pid=waiting.pid)  # stdin stays open
    waiting.send_signal(stop)
    _, stderr = waiting.communicate(timeout=60)
    assert (waiting.returncode, stderr) == (Exit.INTERRUPTED, "")
