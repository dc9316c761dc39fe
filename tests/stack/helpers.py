"""Configurations, Kafka reads and the documented type tables for the stack tests."""

from __future__ import annotations

import io
import json
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from ingest.config import IngestConfig, load_config

REPO = Path(__file__).resolve().parents[2]
PREFIX = {"avro": "pgavro", "json": "pgjson"}
CONFIG_FILE = {"avro": REPO / "configs" / "stack.yaml", "json": REPO / "configs" / "stack-json.yaml"}


def stack_config(fmt: str, workdir: Path, *, schema: str | None = None,
                 tables: list[str] | None = None) -> IngestConfig:
    """configs/stack*.yaml with its own workdir, moved to another schema or to other tables.

    Args:
        fmt: ``avro`` or ``json``.
        workdir: the configuration's workdir.
        schema: source schema replacing ``shop`` in topics and source tables.
        tables: replace the configured tables by these (topics ``<prefix>.<schema>.<table>``).
    """
    config = load_config(CONFIG_FILE[fmt], workdir=workdir)
    specs = []
    if tables is not None:
        specs = [{"name": t, "topic": f"{PREFIX[fmt]}.{schema}.{t}"} for t in tables]
    else:
        for spec in config.tables:
            data = spec.model_dump(mode="json", exclude_defaults=True)
            if schema is not None:
                data["topic"] = data["topic"].replace(".shop.", f".{schema}.")
                if "source_table" in data:
                    data["source_table"] = data["source_table"].replace("shop.", f"{schema}.")
            specs.append(data)
    return config.model_copy(update={"tables": tuple(type(config.tables[0]).model_validate(s) for s in specs)})


def mariadb_config(workdir: Path, database: str) -> IngestConfig:
    """configs/stack-mariadb.yaml with its own workdir, its topics moved to another database."""
    config = load_config(REPO / "configs" / "stack-mariadb.yaml", workdir=workdir)
    specs = tuple(s.model_copy(update={"topic": s.topic.replace(".shop.", f".{database}.")}) for s in config.tables)
    return config.model_copy(update={"tables": specs})


def write_config(config: IngestConfig, path: Path) -> Path:
    """The configuration as a YAML file (for the command line)."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    data["workdir"] = str(config.workdir)
    data.pop("quality", None)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fresh_schema(stack: Any, dsn: str, schema: str, topics: list[str], *statements: str) -> None:
    """Drop ``schema`` and ``topics`` (a previous run's), create the schema, run ``statements`` in it,
    and wait until Debezium has captured them."""
    import psycopg

    from ingest.verify.capture import delete_topics, wait_for_capture

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        delete_topics(stack.bootstrap_servers(), topics)
        conn.execute(f"CREATE SCHEMA {schema}")
        for statement in statements:
            conn.execute(statement)
    # The stack's PostgreSQL connectors by their slots: on a fresh stack a slot is not active until its
    # connector streams, and a wait for every slot passes over an inactive one.
    slots = [c["slot.name"] for c in map(stack.connector_template, stack.settings.connectors) if "slot.name" in c]
    assert wait_for_capture(dsn, timeout=120, on_stall=stack.unstick_capture, slots=slots).ok


@contextmanager
def own_connector(stack: Any, template: str, name: str, settings: dict[str, str]) -> Iterator[str]:
    """A connector of its own for one test, yielding its topic prefix ``name``: the stack's connector
    ``template`` (``pgjson``, ``pgavro``, ``mariaavro``) with a slot, server id and schema history of its
    own and ``settings`` over it, running. At the end it is deleted with its replication slot and its
    topics. ``name`` should be new in each run: Connect keeps a connector's offsets after it is deleted.
    """
    from ingest.verify.capture import delete_topics

    base = stack.connector_template(template)
    config = {**base, "topic.prefix": name, "signal.enabled.channels": "source"}
    if "slot.name" in base:
        config["slot.name"] = f"{name}_slot"
    if "database.server.id" in base:
        # MariaDB drops a replica's connection when another one takes its server id: one of its own
        config["database.server.id"] = str(10_000 + zlib.crc32(name.encode()) % 1_000_000)
        config["schema.history.internal.file.filename"] = base["schema.history.internal.file.filename"].replace(
            template, name)
    connect = stack._connect()
    connect.register(name, {**config, **settings})
    try:
        stack.wait_connectors([name])
        yield name
    finally:
        requests.delete(f"{connect.url}/connectors/{name}", timeout=30)
        if "slot.name" in base:
            import psycopg

            with psycopg.connect(stack.pg_dsn(), autocommit=True) as conn:
                wait_until("the deleted connector's slot to go inactive", lambda: not conn.execute(
                    "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (config["slot.name"],)
                ).fetchone())
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE slot_name = %s", (config["slot.name"],))
        # A stopping task can still send a heartbeat or a change, which creates its topic again.
        wait_until(f"connector {name} to be gone", lambda: requests.get(
            f"{connect.url}/connectors/{name}", timeout=30).status_code == 404)
        for _ in range(10):
            if not delete_topics(stack.bootstrap_servers(), _topics(stack, name)):
                break
            time.sleep(2)


def _topics(stack: Any, prefix: str) -> list[str]:
    """The topics a connector of topic prefix ``prefix`` writes."""
    from confluent_kafka.admin import AdminClient

    listed = AdminClient({"bootstrap.servers": stack.bootstrap_servers()}).list_topics(timeout=10).topics
    return [t for t in listed if t == prefix or t.startswith(f"{prefix}.") or t == f"__debezium-heartbeat.{prefix}"]


def run_and_verify(config: Path, dsn: str) -> str:
    """``ingest run``, then ``ingest verify --source-db dsn``, which must find every table equal: its
    report, its lines joined (a table's note wraps)."""
    from tests.harness import ingest_cli

    run = ingest_cli("run", "-c", str(config))
    assert run.returncode == 0, run.stdout + run.stderr
    verify = ingest_cli("verify", "-c", str(config), "--source-db", dsn)
    assert verify.returncode == 0 and "every table equals its source table" in verify.stdout, \
        verify.stdout + verify.stderr
    return " ".join(verify.stdout.split())


def config_file(config: IngestConfig, path: Path) -> Path:
    """The whole configuration as a YAML file, as a user would write it (for the command line)."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return path


def _settings() -> Any:
    """The stack's settings, from the environment (``STACK_*_PORT`` move its servers)."""
    from harness.stack.settings import StackSettings

    return StackSettings.from_env()


def read_topic(topic: str, bootstrap: str | None = None, timeout: float = 5.0) -> list[tuple[Any, Any]]:
    """Every ``(key, value)`` of a one-partition topic, raw bytes (default: the stack's broker)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap or _settings().bootstrap_servers(), "group.id": "tests-stack",
                         "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
        consumer.assign([TopicPartition(topic, 0, low)])
        out: list[tuple[Any, Any]] = []
        while len(out) < high - low:
            message = consumer.poll(timeout)
            if message is None:
                break
            if message.error() is None:
                out.append((message.key(), message.value()))
        return out
    finally:
        consumer.close()


def change_count(topic: str) -> int:
    """Records in ``topic`` that are not tombstones (0 while the topic does not exist)."""
    from confluent_kafka import KafkaException

    try:
        return sum(1 for _key, value in read_topic(topic) if value is not None)
    except KafkaException:  # the topic is not there yet
        return 0


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 90) -> None:
    """Poll ``condition`` every half second; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} after {timeout:.0f} s")
        time.sleep(0.5)


def json_events(topic: str) -> list[dict[str, Any]]:
    """The JsonConverter envelopes (``schema`` and ``payload``) of a topic, tombstones left out."""
    return [json.loads(v) for _, v in read_topic(topic) if v is not None]


def documented_types(page: str) -> list[dict[str, str]]:
    """The rows of a docs page's type table that name a probe column, cells by header (the first
    backticked token of each cell)."""
    lines = [ln for ln in (REPO / "docs" / page).read_text().splitlines() if ln.startswith("|")]
    header = [c.strip().replace("`", "") for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            continue
        token = {h: (m.group(1) if (m := re.search(r"`([^`]*)`", c)) else "")
                 for h, c in zip(header, cells, strict=True)}
        if token.get("probe column"):
            rows.append(token)
    return rows


def _writer_schema(value: bytes, known: dict[int, Any]) -> Any:
    """The writer schema (its JSON, parsed) of a Confluent-framed Avro value, from the stack's registry
    unless ``known`` holds it by id (it then does)."""
    schema_id = struct.unpack(">bI", value[:5])[1]
    if schema_id not in known:
        response = requests.get(f"{_settings().registry_url()}/apis/ccompat/v7/schemas/ids/{schema_id}", timeout=10)
        known[schema_id] = json.loads(response.json()["schema"])
    return known[schema_id]


def avro_history(topic: str, key: str, values: set[Any]) -> dict[Any, list[dict[str, Any]]]:
    """What the topic holds for some keys, in its order: each change's index, op, row after (or before)
    and Debezium ``source`` block (the stack's registry, Confluent framing). For a failing test's
    message: which changes of a key Debezium emitted, and where."""
    import fastavro

    known: dict[int, Any] = {}
    parsed: dict[int, Any] = {}  # by id of the JSON schema: fastavro's parse, once
    history: dict[Any, list[dict[str, Any]]] = {v: [] for v in values}
    for index, (_key, value) in enumerate(read_topic(topic)):
        if value is None:
            continue
        schema = _writer_schema(value, known)
        if id(schema) not in parsed:
            parsed[id(schema)] = fastavro.parse_schema(schema)
        event = fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed[id(schema)])
        row = event["after"] or event["before"] or {}
        if row.get(key) in history:
            noise = ("version", "name", "db", "schema", "table", "connector", "ts_us", "ts_ns")
            source = {k: v for k, v in event["source"].items() if v is not None and k not in noise}
            history[row[key]].append({"index": index, "op": event["op"], "row": row, "source": source})
    return history


def avro_columns(topic: str) -> dict[str, tuple[str, str | None]]:
    """Column -> (Avro type, connect.name) from the writer schema of the topic's first message (the
    stack's registry, Confluent framing)."""
    envelope = _writer_schema(read_topic(topic)[0][1], {})
    before = next(f for f in envelope["fields"] if f["name"] == "before")
    record = next(t for t in before["type"] if t != "null")
    out = {}
    for field in record["fields"]:
        typ = field["type"]
        typ = next(t for t in typ if t != "null") if isinstance(typ, list) else typ
        out[field["name"]] = (typ, None) if isinstance(typ, str) else (typ["type"], typ.get("connect.name"))
    return out


def stale_reads(history: dict[Any, list[dict[str, Any]]]) -> set[Any]:
    """The keys of ``history`` (:func:`avro_history`) whose last change in the topic is an incremental
    snapshot read emitted after a streamed change of the key that it does not hold: a chunk read while
    that change was committed in PostgreSQL's WAL, and streamed, but not yet visible to other sessions
    (docs/operations.md, "Re-reading one table from the source")."""
    stale = set()
    for key, changes in history.items():
        if not changes or changes[-1]["op"] != "r" or changes[-1]["source"].get("snapshot") != "incremental":
            continue
        streamed = [c for c in changes[:-1] if c["op"] in ("c", "u", "d") and c["source"].get("snapshot") == "false"]
        if streamed and (streamed[-1]["op"] == "d" or streamed[-1]["row"] != changes[-1]["row"]):
            stale.add(key)
    return stale


def topic_ends(stack: Any, topic: str) -> dict[int, int]:
    """The end offset of each of ``topic``'s partitions, as Kafka has them now (``{}``: no such topic)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap_servers(), "group.id": "stack-tests-ends"})
    try:
        found = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if found is None or found.error is not None:
            return {}
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in found.partitions}
    finally:
        consumer.close()


def reread_until_equal(stack: Any, config: Path, dsn: str, table: str, source_table: str, topic: str,
                       rows: int) -> None:
    """The runbooks' re-read of one table from the database: ``ingest resnapshot`` (which names the
    ``source_table`` it asked for), a wait until Debezium has written its ``rows`` into ``topic`` again, a
    run, and ``ingest verify --source-db`` equal (nothing ingests after that run, so verify's wait for
    the tables is short)."""
    import time

    from tests.harness import ingest_cli

    before = sum(topic_ends(stack, topic).values())
    asked = ingest_cli("resnapshot", table, "-c", str(config), timeout=120)
    assert asked.returncode == 0 and source_table in asked.stdout, asked.stdout + asked.stderr
    deadline = time.monotonic() + 180
    while sum(topic_ends(stack, topic).values()) < before + rows:
        assert time.monotonic() < deadline, f"Debezium did not re-read {table} within 180 s"
        time.sleep(2)
    done = ingest_cli("run", "-c", str(config))
    assert done.returncode == 0, done.stderr[-2000:]
    verify = ingest_cli("verify", "-c", str(config), "--source-db", dsn, "--wait", "10")
    assert verify.returncode == 0, verify.stdout + verify.stderr
