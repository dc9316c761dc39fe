"""``ingest init`` writes a configuration for one's own stack that loads as written, and ``ingest check``
says per check what holds and what to do, with an exit code a deploy script can use.

The checks against a real broker and registry (a wrong password, a stopped registry) are in
``tests/stack/test_check.py``; here: the files, a lake whose bucket does not exist (an S3 server on
loopback), a machine without Java, and the embedded default.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ingest.cli.outcome import Exit
from ingest.config import load_config
from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.ops.check import run_checks
from ingest.source.topiclog import ProducerRecord, TopicLog
from tests.decode.fixtures import (
    AVRO_ORDER_FIELDS,
    ORDERS_SCHEMA,
    avro_envelope_schema,
    envelope,
    json_key,
    json_message,
    optional,
    order_row,
    pg_source,
)


def _ingest(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env if env is not None else dict(os.environ), timeout=180, check=False)


def test_init_writes_a_configuration_for_ones_own_stack_that_loads_as_written(tmp_path: Path) -> None:
    done = _ingest("init", "pipeline.yaml", "--bootstrap-servers", "kafka-1.corp:9093", "--registry-url",
                   "https://registry.corp", "--lake", "s3://corp-lake/cdc", "--topic-pattern",
                   r"erp\.sales\.[^.]+", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    config = load_config(tmp_path / "pipeline.yaml")
    kafka = config.source.kafka
    assert kafka is not None and kafka.bootstrap_servers == "kafka-1.corp:9093"
    assert kafka.options["kafka.security.protocol"] == "SASL_SSL" and kafka.credentials_env == "KAFKA_SASL_JAAS_CONFIG"
    assert config.source.registry.url == "https://registry.corp" and config.source.value_format == "avro"
    assert config.tables_root.uri == "s3://corp-lake/cdc/tables"
    assert config.checkpoint_location.uri == "s3://corp-lake/cdc/checkpoints"
    assert config.discover is not None and config.discover.topic_pattern == r"erp\.sales\.[^.]+"
    [override] = config.tables
    assert (override.name, override.topic, override.delete_mode) == ("sales_customers", "erp.sales.customers", "soft")
    suite = json.loads((tmp_path / "expectations" / "sales_customers.json").read_text())
    assert suite["expectations"][0]["kwargs"] == {"column": "id"}
    text = (tmp_path / "pipeline.yaml").read_text()
    raw = yaml.safe_load(text)
    assert "password" not in json.dumps(raw).lower() and text.count("#") > 20  # commented, no secret in it


def test_init_replaces_nothing_unless_asked(tmp_path: Path) -> None:
    assert _ingest("init", cwd=tmp_path).returncode == 0
    again = _ingest("init", cwd=tmp_path)
    assert again.returncode == Exit.USAGE and "exists" in again.stderr and "--force" in again.stderr
    assert _ingest("init", "--force", "--value-format", "json", cwd=tmp_path).returncode == 0
    assert load_config(tmp_path / "ingest.yaml").source.value_format == "json"


def test_init_refusing_a_value_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    """It wrote the files, found the configuration invalid, and left them for the next init to refuse."""
    refused = _ingest("init", "--lake", "ftp://host/lake", "--dagster", "dg/location", cwd=tmp_path)
    assert refused.returncode == Exit.USAGE and "object store 'ftp' is not supported" in refused.stderr
    assert list(tmp_path.iterdir()) == []
    assert _ingest("init", cwd=tmp_path).returncode == 0
    kept = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    again = _ingest("init", "--force", "--topic-pattern", "([", cwd=tmp_path)
    assert again.returncode == Exit.USAGE and "not a regular expression" in again.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == kept


def test_init_writes_a_dagster_code_location_over_the_configuration(tmp_path: Path) -> None:
    done = _ingest("init", "--dagster", "location", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w",
                             "workspace.yaml"], cwd=tmp_path / "location", capture_output=True, text=True,
                            timeout=300, check=False)
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    assert "All code locations passed validation" in listed.stdout + listed.stderr


def _embedded(tmp_path: Path, **target: Any) -> Path:
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({"tables": [{"name": "t", "topic": "t"}], **({"target": target} if target else {})}))
    return path


def test_check_on_the_embedded_default_says_what_is_missing_line_by_line(tmp_path: Path) -> None:
    path = _embedded(tmp_path)
    done = _ingest("check", "-c", str(path), cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == Exit.UNAVAILABLE  # no topic yet
    assert [line.split(":")[0] for line in lines] == ["ok   java", "ok   jvm artifacts", "ok   source",
                                                      "FAIL topics", "ok   registry", "ok   keys", "ok   lake",
                                                      "ok   checkpoints", "ok   tables", "ok   quality"]
    assert "topic t is missing" in lines[3] and "->" in lines[3]
    subprocess.run([sys.executable, "-m", "ingest.cli", "produce", "t", "-c", str(path)], input='{"key": null}\n',
                   text=True, check=True, capture_output=True, cwd=tmp_path)
    ready = _ingest("check", "-c", str(path), "--format", "json", cwd=tmp_path)
    assert ready.returncode == Exit.OK, ready.stdout
    assert all(json.loads(line)["ok"] for line in ready.stdout.splitlines())


def test_check_names_a_topic_whose_changes_have_no_key_until_the_table_names_its_key(tmp_path: Path) -> None:
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({"tables": [{"name": "t", "topic": "t"}, {"name": "k", "topic": "k"}]}))

    def produce(topic: str, key: dict[str, Any] | None, value: dict[str, Any]) -> None:
        encoded = {"key": None if key is None else base64.b64encode(json.dumps(key).encode()).decode(),
                   "value": base64.b64encode(json.dumps(value).encode()).decode()}
        subprocess.run([sys.executable, "-m", "ingest.cli", "produce", topic, "-c", str(path)],
                       input=json.dumps(encoded), text=True, check=True, capture_output=True, cwd=tmp_path)

    produce("t", None, {"op": "c", "after": {"id": 1}, "source": {"lsn": 1}})
    produce("k", {"id": 1}, {"op": "c", "after": {"id": 1}, "source": {"lsn": 1}})
    produce("k", None, {"op": "t", "source": {"lsn": 2}})  # a truncate has no key: k is keyed all the same
    unkeyed = _ingest("check", "-c", str(path), cwd=tmp_path)
    [line] = [line for line in unkeyed.stdout.splitlines() if line.startswith("FAIL keys")]
    assert unkeyed.returncode != Exit.OK
    assert "t: none of the newest 1 changes in topic t has a Kafka key" in line
    assert "tables[].primary_key" in line and "#a-table-without-a-primary-key" in line
    path.write_text(yaml.safe_dump({"tables": [{"name": "t", "topic": "t", "primary_key": "id"}]}))
    keyed = _ingest("check", "-c", str(path), cwd=tmp_path)
    assert "ok   keys: no table is keyed by the message key" in keyed.stdout.splitlines(), keyed.stdout


def test_check_finds_a_lake_whose_bucket_does_not_exist(tmp_path: Path, s3: Any) -> None:
    path = _embedded(tmp_path, root="s3://no-such-bucket/lake", storage=s3.storage())
    found = {c.name: c for c in run_checks(load_config(path), only=lambda name: name in ("lake", "tables"))}
    assert not found["lake"].ok and "the bucket does not exist" in found["lake"].detail
    assert "s3://no-such-bucket/lake" in found["lake"].detail


def test_check_asks_a_store_that_does_not_answer_once_instead_of_riding_it_out(
        tmp_path: Path, monkeypatch: Any, refused_port: int) -> None:
    port = refused_port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    path = _embedded(tmp_path, root="s3://lake/cdc", storage={"endpoint_url": f"http://127.0.0.1:{port}",
                                                               "retry_seconds": 600})
    started = time.monotonic()
    found = list(run_checks(load_config(path), only=lambda name: name in ("lake", "checkpoints", "tables")))
    assert time.monotonic() - started < 120  # a run rides out each request for retry_seconds (600 s)
    assert [(c.name, c.ok) for c in found] == [("lake", False), ("checkpoints", True), ("tables", False)]
    assert "s3://lake/cdc" in found[0].detail and "cannot write" in found[0].detail
    assert found[2].detail == "not checked: the lake check failed"  # one line, however many tables


def test_check_loads_the_suites_of_a_lake_that_failed_its_check(tmp_path: Path, monkeypatch: Any,
                                                                refused_port: int) -> None:
    """The suite still loads; the table's columns are the lake's to say, so they are not checked. The
    quality check used to read each table's log itself, fail on the lake's error, and tell the user to
    correct the suite."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "t.json").write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]}))
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({
        "tables": [{"name": "t", "topic": "t", "expectations": "t"}],
        "quality": {"expectations_dir": str(tmp_path / "suites")},
        "target": {"root": "s3://lake/cdc", "storage": {"endpoint_url": f"http://127.0.0.1:{refused_port}"}}}))
    found = {c.name: c for c in run_checks(load_config(path), only=lambda name: name in ("lake", "quality"))}
    assert not found["lake"].ok
    assert found["quality"].ok and found["quality"].detail == (
        "t: suite t, 1 expectations; the columns it reads not checked: the lake check failed"), found["quality"]


def test_check_loads_each_tables_suite_as_a_run_would(tmp_path: Path) -> None:
    """A missing or invalid suite passed check, and the run then stopped on it."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "good.json").write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]}))
    (suites / "bad.json").write_text(json.dumps({"expectations": [{"type": "expect_column_to_be_lovely"}]}))
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({"quality": {"expectations_dir": "suites"}, "tables": [
        {"name": "a", "topic": "a", "expectations": "good"}, {"name": "b", "topic": "b", "expectations": "bad"},
        {"name": "c", "topic": "c", "expectations": "absent"}, {"name": "d", "topic": "d"}]}))
    found = [c for c in run_checks(load_config(path), only=lambda name: name == "quality")]
    assert [(c.ok, c.detail.split(":")[0]) for c in found] == [(True, "a"), (False, "b"), (False, "c")]
    assert found[0].detail == ("a: suite good, 1 expectations; the columns it reads are checked at the table's "
                               "first batch (no schema under a-value yet)")
    assert "expect_column_to_be_lovely is not a valid expectation" in found[1].detail
    assert f"file {suites / 'absent.json'} not found" in found[2].detail and "expectations_dir" in found[2].fix


def test_check_finds_columns_a_table_names_that_its_source_does_not_have(tmp_path: Path) -> None:
    """A misspelled primary_key sent every change to quarantine and a misspelled exclude kept the column;
    check passed both. ``after`` names its struct by reference, as AvroConverter writes it."""
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({"tables": [
        {"name": "orders", "topic": "orders", "primary_key": "idd", "columns": {"exclude": ["Notes"]}},
        {"name": "flat", "topic": "flat", "primary_key": ["id"], "columns": {"include": ["customer"]}},
        {"name": "plain", "topic": "plain"}, {"name": "later", "topic": "later", "primary_key": "id"}]}))
    config = load_config(path)
    registry = EmbeddedSchemaRegistry(config.registry_dir)
    registry.register("orders-value", avro_envelope_schema(AVRO_ORDER_FIELDS[:1]))
    registry.register("orders-value", avro_envelope_schema(AVRO_ORDER_FIELDS))  # the newest is checked
    registry.register("flat-value", {"type": "record", "name": "Row", "fields": [
        *AVRO_ORDER_FIELDS, {"name": "__op", "type": optional("string"), "default": None}]})
    found = [c for c in run_checks(config, only=lambda name: name == "columns")]
    assert [(c.ok, c.detail.split(":")[0]) for c in found] == [(False, "orders"), (True, "flat"), (True, "later")]
    assert found[0].detail == ("orders: primary_key names idd; columns.exclude names Notes, not in the newest "
                               "schema under orders-value (its columns: id, customer, amount, placed_at, notes)")
    assert "primary_key" in found[0].fix
    assert found[1].detail == ("flat: primary_key (id), columns.include (customer) found in the newest schema "
                               "under flat-value")
    assert found[2].detail == "later: not checked, no schema under later-value yet"


def test_check_reads_the_columns_of_a_json_topic_from_its_newest_change(tmp_path: Path) -> None:
    """JSON messages name their own columns: the newest change of the topic's partitions says them, past a
    tombstone, whether the message carries its schema or not."""
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({"source": {"value_format": "json"}, "tables": [
        {"name": "orders", "topic": "orders", "primary_key": "idd"},
        {"name": "later", "topic": "later", "primary_key": "id"}]}))
    config = load_config(path)
    log = TopicLog(config.log_dir)
    log.create_topic("orders", 2)
    row = {"id": 1, "customer": "Ada"}
    older = json_message(envelope("c", after=row, source=pg_source(lsn=10, committed=1_000)), wrap=False)
    log.append("orders", [ProducerRecord(0, json_key(1), older, 1_000)])
    newest = json_message(envelope("c", after=order_row(2), source=pg_source(lsn=20, committed=2_000)), ORDERS_SCHEMA)
    log.append("orders", [ProducerRecord(1, json_key(2), newest, 2_000), ProducerRecord(1, json_key(2), None, 3_000)])
    found = [(c.ok, c.detail) for c in run_checks(config, only=lambda name: name == "columns")]
    assert found == [(False, "orders: primary_key names idd, not in the newest change in topic orders (its columns: "
                             "id, customer, amount, placed_at, notes)"),
                     (True, "later: not checked, no change in topic later yet")]
    log.append("orders", [ProducerRecord(0, json_key(1), older, 4_000)])  # newer than the rest: it decides
    assert next(run_checks(config, only=lambda name: name == "columns")).detail.endswith("(its columns: id, customer)")
    log.create_topic("later", 1)  # Avro where JSON is configured: nothing decodes, and check says so
    log.append("later", [ProducerRecord(0, None, b"\x00\x00\x00\x00\x01\x02", 5_000)])
    late = [c for c in run_checks(config, only=lambda name: name == "columns")][1]
    assert not late.ok and late.detail.startswith("later: none of the newest 1 records of topic later is a change "
                                                  "as a run decodes it (1 refused: "), late.detail
    assert late.fix == "check tables[].topic and source.value_format"


def test_check_finds_a_suite_reading_a_column_the_new_tables_source_does_not_have(tmp_path: Path) -> None:
    """Before a table's first commit, check passed a suite that read a misspelled column, and the first run
    then stopped the table at its first batch. Now the suite's columns are checked against the columns the
    table will take from its topic's newest schema, as ``columns.include``/``exclude`` leave them."""
    suites = tmp_path / "suites"
    suites.mkdir()
    for name, column in (("typo", "amout"), ("dropped", "notes"), ("fine", "amount"), ("key", "id")):
        (suites / f"{name}.json").write_text(json.dumps({"expectations": [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": column}}]}))
    path = tmp_path / "ingest.yaml"
    path.write_text(yaml.safe_dump({"quality": {"expectations_dir": "suites"}, "tables": [
        {"name": "orders", "topic": "orders", "expectations": "typo"},
        {"name": "private", "topic": "private", "primary_key": "id", "columns": {"exclude": ["notes"]},
         "expectations": "dropped"},
        {"name": "amounts", "topic": "amounts", "primary_key": "id", "columns": {"include": ["amount"]},
         "expectations": "fine"},
        # keyed by the message key, which the row does not say: a column include leaves out may be the key's
        {"name": "keyed", "topic": "keyed", "columns": {"include": ["amount"]}, "expectations": "key"},
        {"name": "later", "topic": "later", "expectations": "fine"}]}))
    config = load_config(path)
    registry = EmbeddedSchemaRegistry(config.registry_dir)
    for topic in ("orders", "private", "amounts", "keyed"):
        registry.register(f"{topic}-value", avro_envelope_schema(AVRO_ORDER_FIELDS))
    found = [c for c in run_checks(config, only=lambda name: name == "quality")]
    assert [(c.ok, c.detail.split(":")[0]) for c in found] == [
        (False, "orders"), (False, "private"), (True, "amounts"), (True, "keyed"), (True, "later")]
    assert found[0].detail == (
        f"orders: table 'orders': suite 'typo' ({suites / 'typo.json'}) names columns the newest schema under "
        "orders-value does not have: expect_column_values_to_not_be_null(amout) reads ['amout'] (columns: ['amount', "
        "'customer', 'id', 'notes', 'placed_at'])")
    assert "correct the suite" in found[0].fix
    assert ("names columns the newest schema under private-value (less what columns.exclude leaves out) does not "
            "have: expect_column_values_to_not_be_null(notes) reads ['notes'] (columns: ['amount', 'customer', 'id', "
            "'placed_at'])") in found[1].detail
    assert found[2].detail == ("amounts: suite fine, 1 expectations; the columns it reads are in the newest schema "
                               "under amounts-value")
    assert found[3].detail.endswith("the columns it reads are in the newest schema under keyed-value")
    assert found[4].detail.endswith("checked at the table's first batch (no schema under later-value yet)")


def test_check_finds_a_machine_without_java(tmp_path: Path) -> None:
    path = _embedded(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path / "no-java-here")
    done = _ingest("check", "-c", str(path), cwd=tmp_path, env=env)
    java = done.stdout.splitlines()[0]
    assert done.returncode == Exit.UNAVAILABLE and java.startswith("FAIL java") and "Java 17 is required" in java


def test_check_says_where_a_run_could_not_send_its_signals(tmp_path: Path, monkeypatch: Any) -> None:
    """With ``reread_suspect_reads`` a run writes signals: into a signal table, whose database's
    address must be set and answer (the real answer: tests/stack/test_resnapshot.py), or to a topic."""
    kafka = {"bootstrap_servers": "127.0.0.1:1", "reread_suspect_reads": True, "signal_table": "cdc.debezium_signal"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"workdir": str(tmp_path / "w"), "source": {"kind": "kafka", "kafka": kafka},
                                    "tables": [{"name": "t", "topic": "db.public.t"}]}))
    config = load_config(path)
    monkeypatch.delenv("CDC_SIGNAL_DB", raising=False)

    def signals() -> list[Any]:
        return list(run_checks(config, only=lambda name: name == "signals"))

    (found,) = signals()
    assert not found.ok and "CDC_SIGNAL_DB (the environment or the secrets file) names no database" in found.detail
    assert "source.kafka.signal_db_env" in found.fix
    monkeypatch.setenv("CDC_SIGNAL_DB", "host=127.0.0.1 port=1 dbname=cdc user=u password=hunter2-secret "
                                        "connect_timeout=2")
    (found,) = signals()
    assert not found.ok and found.detail.startswith("signal table cdc.debezium_signal: ")
    assert "hunter2-secret" not in found.detail and "\n" not in found.detail
    # without the database's client library: one line naming the extra
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "ingest.verify.pg_source", raising=False)
    monkeypatch.delattr("ingest.verify.pg_source", raising=False)
    (found,) = signals()
    assert not found.ok and "pip install 'cdc-lakehouse-ingest[postgres]'" in found.detail
    off = config.model_copy(update={"source": config.source.model_copy(update={
        "kafka": config.source.kafka.model_copy(update={"reread_suspect_reads": False})})})
    assert list(run_checks(off, only=lambda name: name == "signals")) == []


def test_check_lists_the_topics_once_and_skips_what_needs_a_source_that_did_not_answer(tmp_path: Path,
                                                                                       monkeypatch: Any) -> None:
    """The source, topics and signal-topic checks share one listing of the broker's topics; when the
    broker does not answer, the checks that would list them again (each waiting its timeout) say so."""
    from ingest.source.kafka_admin import KafkaAdmin

    kafka = {"bootstrap_servers": "127.0.0.1:1", "reread_suspect_reads": True}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"workdir": str(tmp_path / "w"), "source": {"kind": "kafka", "kafka": kafka},
                                    "tables": [{"name": "t", "topic": "db.public.t"}]}))
    config = load_config(path)
    wanted = ("source", "topics", "signals")
    listings: list[str] = []

    def listed(admin: KafkaAdmin) -> list[str]:
        listings.append(admin.describe())
        return ["db.public.t", "db-signal"]

    monkeypatch.setattr(KafkaAdmin, "topics", listed)
    found = {c.name: c for c in run_checks(config, only=lambda name: name in wanted)}
    assert len(listings) == 1 and all(c.ok for c in found.values()), (listings, found)

    def refused(admin: KafkaAdmin) -> list[str]:
        listings.append(admin.describe())
        raise ConnectionError("no broker at 127.0.0.1:1")

    monkeypatch.setattr(KafkaAdmin, "topics", refused)
    listings.clear()
    found = {c.name: c for c in run_checks(config, only=lambda name: name in wanted)}
    assert len(listings) == 1 and not any(c.ok for c in found.values()), (listings, found)
    assert found["signals"].detail == found["topics"].detail == "not checked: the source check failed"
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "t.json").write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]}))
    path.write_text(yaml.safe_dump({"workdir": str(tmp_path / "w"), "source": {
        "kind": "kafka", "kafka": kafka, "value_format": "json"}, "tables": [
        {"name": "t", "topic": "db.public.t", "primary_key": "id", "expectations": "t"}],
        "quality": {"expectations_dir": str(tmp_path / "suites")}}))
    found = {c.name: c for c in run_checks(load_config(path),
                                           only=lambda name: name in ("source", "columns", "quality"))}
    assert found["columns"].detail == "not checked: the source check failed"  # its newest change is in Kafka
    # the suite still loads; the columns it reads are not asked of the source again
    assert found["quality"].ok and found["quality"].detail == (
        "t: suite t, 1 expectations; the columns it reads not checked: the source check failed")
