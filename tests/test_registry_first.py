"""A run of Avro records asks the schema registry one question before Spark starts, as it asks Kafka.

A registry that refuses the login (HTTP 401) ends the run with exit 3 and one line naming it, with
neither Spark nor Great Expectations loaded; a run with nothing to do does not ask. A registry that
does not answer, or answers 5xx (nginx's 502 while the registry behind it restarts), is an outage the
run rides out: the question only logs a warning. The registry here is
:class:`tests.fake_registry.FakeRegistry` on loopback, which answers a wrong password as a registry
behind basic auth does (``tests/stack/test_security.py`` checks the real one,
``tests/stack/test_torture_stack.py`` runs through its restarts).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
import yaml

from ingest.config import load_config
from ingest.decode.registry import EmbeddedSchemaRegistry, frame
from ingest.source.topiclog import ProducerRecord, TopicLog
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce
from tests.decode.fixtures import avro_envelope_schema, optional
from tests.fake_registry import FakeRegistry

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "app.public.notes"

_PROBE = """
import json, sys
from typer.testing import CliRunner
from ingest.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
print(json.dumps({"code": result.exit_code, "output": result.output,
                  "loaded": sorted(m for m in ("pyspark", "great_expectations") if m in sys.modules)}))
"""


@pytest.fixture
def refusing(tmp_path: Path) -> Iterator[FakeRegistry]:
    """A registry whose login :data:`ENV` does not know (it answers 401)."""
    fake = FakeRegistry(tmp_path, user="ingest", password="the-password")
    yield fake
    fake.close()


def _config(tmp_path: Path, registry_url: str) -> Path:
    raw = {"workdir": str(tmp_path / "work"),
           "source": {"value_format": "avro", "registry": {"kind": "confluent", "url": registry_url}},
           "tables": [{"name": "notes", "topic": TOPIC}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(path: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _PROBE, "run", "-c", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=False, env=env)
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


#: A login the registry refuses, from the environment as the configuration's credentials_env names it.
ENV = {**os.environ, "SCHEMA_REGISTRY_USER_INFO": "ingest:not-the-password"}


def test_a_refused_registry_login_ends_the_run_before_spark(tmp_path: Path, refusing: FakeRegistry) -> None:
    path, asked = _config(tmp_path, refusing.url), refusing.asked
    produce(load_config(path), TOPIC, [("c", {"id": 1, "body": "one"}, 10)])  # work (never decoded here)

    result = _run(path, ENV)
    assert result["code"] == 3, result["output"]
    assert f"schema registry refused subject {TOPIC}-value: HTTP 401" in result["output"], result["output"]
    assert "Traceback" not in result["output"] and "not-the-password" not in result["output"]
    assert result["loaded"] == [], result["loaded"]  # neither Spark nor Great Expectations
    assert asked and all(p.startswith(f"/subjects/{TOPIC}-value") for p in asked), asked


def test_a_registry_url_without_its_api_ends_the_run_before_spark(tmp_path: Path, refusing: FakeRegistry) -> None:
    """Apicurio's root instead of its ``/apis/ccompat/v7``: every question is a web server's 404. The run
    used to take each as "no such schema", quarantine every record and exit 0."""
    path = _config(tmp_path, f"{refusing.url}/elsewhere")
    produce(load_config(path), TOPIC, [("c", {"id": 1, "body": "one"}, 10)])

    result = _run(path, {**os.environ, "SCHEMA_REGISTRY_USER_INFO": "ingest:the-password"})
    assert result["code"] == 3, result["output"]
    assert (f"schema registry {refusing.url}/elsewhere has no Confluent-compatible API: HTTP 404 for subject "
            f"{TOPIC}-value") in result["output"], result["output"]
    assert "Traceback" not in result["output"] and result["loaded"] == [], result
    assert not (load_config(path).tables_root / "_cdc_quarantine").exists()


@pytest.mark.parametrize("answer", ["none", 502])
def test_a_registry_outage_at_the_start_is_left_to_the_run(tmp_path: Path, answer: str | int,
                                                          caplog: pytest.LogCaptureFixture, refused_port: int) -> None:
    with contextlib.ExitStack() as stack:
        if answer == "none":
            url = f"http://127.0.0.1:{refused_port}"
        else:
            fake = FakeRegistry(tmp_path, user="ingest", password="the-password", answer=int(answer))
            stack.callback(fake.close)
            url = fake.url
        path = _config(tmp_path, url)
        config = load_config(path)
        with caplog.at_level(logging.WARNING, logger="ingest.stream.runner"):
            Runner(config)._ask_registry(list(config.tables))  # no exception: the run would go on
    [warning] = [r.getMessage() for r in caplog.records if "did not answer at the start" in r.getMessage()]
    assert f"{TOPIC}-value" in warning and ("unreachable" in warning if answer == "none" else "HTTP 502" in warning)


class _Started(Exception):
    """Raised where a run's start has asked its questions and would begin to apply."""


def test_a_registry_outage_is_met_once_however_many_tables_name_columns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each table that names columns is asked for its newest schema; once the registry has not answered,
    the others are not asked (each would wait out the client's retries before the run begins)."""
    from ingest.stream import driver_run

    def started(*args: Any) -> bool:
        raise _Started

    monkeypatch.setattr(driver_run.DriverRun, "wanted", started)
    fake = FakeRegistry(tmp_path, user="ingest", password="the-password", answer=502)
    try:
        raw = {"workdir": str(tmp_path / "work"),
               "source": {"value_format": "avro", "registry": {"kind": "confluent", "url": fake.url}},
               "tables": [{"name": f"t{i}", "topic": f"app.public.t{i}", "primary_key": "id"} for i in range(3)]}
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(raw))
        config = load_config(path)
        log = TopicLog(config.log_dir)
        log.create_topic("app.public.t0", 1)
        log.append("app.public.t0", [ProducerRecord(0, None, frame(1, b"\x02"), 1_700_000_000_000)])  # work
        with caplog.at_level(logging.WARNING, logger="ingest.stream.runner"), pytest.raises(_Started):
            Runner(config).run()
    finally:
        fake.close()
    assert fake.asked and all(p.startswith("/subjects/app.public.t0-value") for p in fake.asked), fake.asked
    assert len([r for r in caplog.records if "did not answer at the start" in r.getMessage()]) == 1


def test_a_run_with_nothing_to_do_does_not_ask_the_registry(tmp_path: Path, refusing: FakeRegistry) -> None:
    path, asked = _config(tmp_path, refusing.url), refusing.asked
    produce(load_config(path), TOPIC, [])  # the topic exists and is empty: every table is caught up

    result = _run(path, ENV)
    assert result["code"] == 0 and "Spark was not started" in result["output"], result["output"]
    assert asked == []


def test_a_run_names_a_key_column_the_newest_schema_lacks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A misspelled primary_key sent every change to quarantine, and the run said nothing until a user
    read the quarantine's reasons; it now warns as it starts, as ``ingest check`` does."""
    raw = {"workdir": str(tmp_path / "work"), "source": {"value_format": "avro"},
           "tables": [{"name": "notes", "topic": TOPIC, "primary_key": "idd"},
                      {"name": "other", "topic": "app.public.other", "primary_key": "id"},
                      {"name": "third", "topic": "app.public.third", "columns": {"exclude": ["SSN"]}}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    value = avro_envelope_schema([{"name": "id", "type": "long"}, {"name": "body", "type": optional("string")}],
                                 namespace="app.public.notes")
    registry = EmbeddedSchemaRegistry(config.registry_dir)
    schema_id = registry.register(f"{TOPIC}-value", value)
    # not a change's schema: that table is left to its batches, and the next is still looked at
    registry.register("app.public.other-value", {"type": "record", "name": "Beat", "fields": [
        {"name": "ts_ms", "type": "long"}]})
    registry.register("app.public.third-value", avro_envelope_schema(
        [{"name": "id", "type": "long"}, {"name": "ssn", "type": optional("string")}], namespace="app.public.third"))
    change = {"before": None, "after": {"id": 1, "body": "a note"}, "op": "c", "ts_ms": 1_700_000_000_000,
              "transaction": None, "source": {"version": "2.7", "connector": "postgresql", "name": "app",
                                              "ts_ms": 1_700_000_000_000, "snapshot": "false", "db": "app",
                                              "sequence": None, "schema": "public", "table": "notes",
                                              "txId": 7, "lsn": 100, "xmin": None}}
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(value), change)
    log = TopicLog(config.log_dir)
    log.create_topic(TOPIC, 1)
    log.append(TOPIC, [ProducerRecord(0, None, frame(schema_id, body.getvalue()), 1_700_000_000_000)])
    with caplog.at_level(logging.WARNING, logger="ingest.stream.runner"):
        report = Runner(config).run()
    assert [r.getMessage() for r in caplog.records if "newest schema" in r.getMessage()] == [
        f"table notes: primary_key names idd, not in the newest schema under {TOPIC}-value (its columns: id, "
        "body); a change without its key columns goes to quarantine (see ingest check)",
        "table third: columns.exclude names SSN, not in the newest schema under app.public.third-value (its "
        "columns: id, ssn) (see ingest check)"]
    assert report.tables["notes"].total("quarantined") == 1  # what the warning said would happen
