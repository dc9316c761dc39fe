"""Credentials come from the environment or a secrets file and never show up anywhere we write.

The end-to-end test runs ``ingest run`` as a separate process (so Spark's own logs and the Python
workers' tracebacks are captured too) against a fake schema registry that requires basic auth:
once with the right credentials from the environment, once with wrong ones from a secrets file.
Then it searches every byte the runs produced -- output, audit, quarantine, Delta logs, data files,
checkpoints -- for the secrets.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest import secrets
from ingest.config import load_config
from ingest.decode.registry import ConfluentSchemaRegistry
from ingest.errors import ConfigError, RegistryUnavailableError, SchemaRegistryError
from ingest.lake.delta import open_table, read_all
from ingest.records import audit, quarantine
from ingest.source.topiclog import ProducerRecord, TopicLog
from tests.fake_registry import FakeRegistry
from tests.proof.torture.corpus import ITEM_FIELDS, AvroTable, Topic, item

USER, PASSWORD = "svc-ingest", "S3cret-Registry-Pa55"
WRONG = "Wr0ng-Secret-Value-77"
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="K4fka-Jaas-Secret";'
AWS = "AwsSecretKey-XYZ-1234567"
SECRETS = (PASSWORD, WRONG, "K4fka-Jaas-Secret", AWS)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[FakeRegistry]:
    fake = FakeRegistry(tmp_path, user=USER, password=PASSWORD)
    try:
        yield fake
    finally:
        fake.close()


# -- unit ---------------------------------------------------------------------------------------------
def test_redact_masks_known_values_and_credential_shapes() -> None:
    secrets.register(f"{USER}:{PASSWORD}")
    text = (f"GET https://{USER}:{PASSWORD}@registry/schemas failed; Authorization: Basic dXNlcjpwYXNz; "
            f'sasl.jaas.config={JAAS} password="hunter22" api_key=abcd1234 {PASSWORD}')
    out = secrets.redact(text)
    for leaked in (PASSWORD, "dXNlcjpwYXNz", "hunter22", "abcd1234", "K4fka-Jaas-Secret"):
        assert leaked not in out
    assert "https://***@registry" in out


def test_lookup_prefers_the_environment_then_the_secrets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text(yaml.safe_dump({"REG": "from-file-secret", "OTHER": "other-file-secret"}))
    path.chmod(0o600)
    monkeypatch.setenv("REG", "from-env-secret")
    assert secrets.lookup("REG", path) == "from-env-secret"
    assert secrets.lookup("OTHER", path) == "other-file-secret"
    assert secrets.lookup("MISSING", path) is None
    assert "other-file-secret" not in secrets.redact("x other-file-secret y")


def test_a_broken_secrets_file_is_named_without_its_content(tmp_path: Path) -> None:
    path = tmp_path / "secrets.yaml"
    path.write_text(f"REG: [{PASSWORD}\n  : : {PASSWORD}")
    with pytest.raises(ConfigError) as caught:
        secrets.read_secrets_file(path)
    assert str(path) in str(caught.value) and PASSWORD not in str(caught.value)


@pytest.mark.parametrize(("section", "field"), [
    ({"registry": {"kind": "confluent", "url": f"https://{USER}:{PASSWORD}@registry:8081"}}, "source.registry.url"),
    ({"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092",
                                 "options": {"kafka.sasl.jaas.config": JAAS}}}, "source.kafka.options"),
])
def test_config_refuses_secrets_and_does_not_echo_them(tmp_path: Path, section: dict[str, Any], field: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"source": section, "tables": [{"name": "t", "topic": "t"}]}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert field in str(caught.value)
    assert all(s not in str(caught.value) for s in (PASSWORD, "K4fka-Jaas-Secret"))


def test_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    secrets.register(f"{USER}:{PASSWORD}")
    logger = logging.getLogger("ingest.test-secrets")
    handler = logging.StreamHandler(stream := io.StringIO())
    logger.addHandler(handler)
    secrets.install_log_redaction(logger)
    try:
        logger.warning("connecting with %s", PASSWORD)
        try:
            raise ValueError(f"refused https://{USER}:{PASSWORD}@host")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert PASSWORD not in stream.getvalue() and "***" in stream.getvalue()


def test_registry_client_classifies_failures_and_never_leaks(registry: FakeRegistry,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url = registry.url
    schema_id = registry.local.register("x-value", {"type": "record", "name": "X",
                                                    "fields": [{"name": "id", "type": "int"}]})
    registry.publish()
    monkeypatch.setenv("REG_OK", f"{USER}:{PASSWORD}")
    monkeypatch.setenv("REG_BAD", f"{USER}:{WRONG}")
    good = ConfluentSchemaRegistry.from_settings(url, credentials_env="REG_OK")
    assert good.get_schema(schema_id)["name"] == "X"
    with pytest.raises(SchemaRegistryError, match="not in the registry"):  # 404: the message's fault
        good.get_schema(4242)
    bad = ConfluentSchemaRegistry.from_settings(url, credentials_env="REG_BAD")
    with pytest.raises(RegistryUnavailableError, match="HTTP 401") as refused:
        bad.get_schema(schema_id)
    down = ConfluentSchemaRegistry({"url": f"http://{USER}:{PASSWORD}@127.0.0.1:9", "max.retries": 0})
    with pytest.raises(RegistryUnavailableError, match="unreachable") as unreachable:
        down.get_schema(schema_id)
    for caught in (refused, unreachable):
        assert all(s not in str(caught.value) for s in SECRETS)
        assert caught.value.__cause__ is None and caught.value.__suppress_context__


# -- end to end ---------------------------------------------------------------------------------------
def _ingest(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("SCHEMA_REGISTRY_USER_INFO", "KAFKA_SASL_JAAS_CONFIG")}
    return subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(config)], capture_output=True,
                          text=True, env={**clean, **env}, timeout=600)


@pytest.mark.spark
def test_secrets_never_appear_in_output_tables_logs_or_files(tmp_path: Path, registry: FakeRegistry) -> None:
    url, local = registry.url, registry.local
    workdir = tmp_path / "work"
    secrets_file = tmp_path / "secrets.yaml"  # outside workdir: everything under workdir is searched
    config = workdir / "config.yaml"
    workdir.mkdir()
    secrets_file.write_text("")  # configured, empty: the environment supplies the first run's secrets
    secrets_file.chmod(0o600)
    config.write_text(yaml.safe_dump({
        "workdir": ".", "secrets_file": str(secrets_file),
        "source": {"value_format": "avro", "registry": {"kind": "confluent", "url": url}},
        "tables": [{"name": "things", "topic": "sec.things"}]}))
    topic = Topic("sec.things")
    things = AvroTable(local, topic.name, ITEM_FIELDS)
    for i in range(1, 4):
        wire, target = item(i)
        topic.good(things.key(i), things.value("c", wire, 10 + i), target, i)
    topic.records.append(("unknown", things.key(9), b"\x00\x00\x00\x30\x39" + b"\x00" * 8))
    registry.publish()
    log = TopicLog(workdir / "topics")
    topic.produce(log)

    # 1. Right credentials from the environment: applied, the unknown schema id quarantined.
    first = _ingest(config, {"SCHEMA_REGISTRY_USER_INFO": f"{USER}:{PASSWORD}", "KAFKA_SASL_JAAS_CONFIG": JAAS,
                             "AWS_SECRET_ACCESS_KEY": AWS})
    assert first.returncode == 0, first.stdout + first.stderr
    cfg = load_config(config)
    rows = read_all(open_table(cfg.table_path("things"))).to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 2, 3]
    held = quarantine.read(cfg.tables_root / "_cdc_quarantine").to_pylist()
    assert [r["offset"] for r in held] == [3] and "unknown schema id 12345" in held[0]["reason"]

    # 2. Wrong credentials from the secrets file: the table stops with a clear error, nothing quarantined.
    secrets_file.write_text(yaml.safe_dump({"SCHEMA_REGISTRY_USER_INFO": f"{USER}:{WRONG}"}))
    secrets_file.chmod(0o600)
    wire, _ = item(5)
    log.append(topic.name, [topic_record(things.key(5), things.value("c", wire, 50))])
    second = _ingest(config, {"KAFKA_SASL_JAAS_CONFIG": JAAS})
    assert second.returncode == 3  # the registry refused the credentials: unavailable
    assert "HTTP 401" in second.stdout + second.stderr
    assert len(quarantine.read(cfg.tables_root / "_cdc_quarantine").to_pylist()) == 1  # an outage is not bad data

    # 3. No secret anywhere: process output, audit and quarantine rows, and every file the runs wrote.
    texts = [first.stdout, first.stderr, second.stdout, second.stderr,
             json.dumps(audit.read(cfg.tables_root / "_cdc_audit").to_pylist(), default=str),
             json.dumps(quarantine.read(cfg.tables_root / "_cdc_quarantine").to_pylist(), default=str)]
    for secret in SECRETS:
        assert not any(secret in t for t in texts), secret
        for path in workdir.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), (secret, path)


def topic_record(key: bytes, value: bytes) -> ProducerRecord:
    return ProducerRecord(0, key, value, 1_700_000_000_000)
