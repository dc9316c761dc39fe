"""Source tables without a primary key, on the stack (docs/operations.md#a-table-without-a-primary-key).

Debezium keys a change by the table's primary key, or by the unique index PostgreSQL uses as the
table's replica identity; without either, the message has no Kafka key. ``ingest check`` names such
a table before a run, and a run holds its changes in quarantine with that reason. Once the table
names its key in ``tables[].primary_key``, the replay applies them. With ``REPLICA IDENTITY FULL``,
an update of those columns moves the row, and the old key's row goes. ``verify --source-db``
compares each table by the key the lake is keyed by, and refuses a configured key that the source
holds twice. A MariaDB table without a primary key takes the same way. Debezium's own
``message.key.columns`` keys such a table without ``primary_key``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from ingest.config import TableSpec
from tests.harness import ingest_cli
from tests.stack.helpers import (
    PREFIX,
    change_count,
    config_file,
    fresh_schema,
    json_events,
    mariadb_config,
    own_connector,
    run_and_verify,
    stack_config,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.stack]

SCHEMA = "keyless"  # a previous run's schema and topics are dropped first
TABLES = ("logs", "full", "uniq")
#: incompressible text over PostgreSQL's TOAST threshold: stored out of line, and sent as the
#: placeholder by an update that leaves it unchanged
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g)"


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_a_table_without_a_primary_key_is_named_held_then_applied_by_its_configured_key(
        stack: Any, pg_dsn: str, tmp_path: Path, fmt: str) -> None:
    s = SCHEMA
    fresh_schema(
        stack, pg_dsn, s, [f"{prefix}.{s}.{t}" for prefix in PREFIX.values() for t in TABLES],
        f"CREATE TABLE {s}.logs (id integer, note text)",
        f"CREATE TABLE {s}.full (id integer, v integer, big text)",
        f"ALTER TABLE {s}.full REPLICA IDENTITY FULL",
        f"CREATE TABLE {s}.uniq (id integer NOT NULL, note text)",
        f"CREATE UNIQUE INDEX uniq_id ON {s}.uniq (id)",
        f"ALTER TABLE {s}.uniq REPLICA IDENTITY USING INDEX uniq_id",
        f"INSERT INTO {s}.logs VALUES (1, 'a'), (2, 'b'), (2, 'b')",  # the same row twice
        f"INSERT INTO {s}.full SELECT g, 0, {BIG} FROM generate_series(1, 3) g",
        f"INSERT INTO {s}.uniq VALUES (1, 'a'), (2, 'b')",
        f"UPDATE {s}.uniq SET note = 'x' WHERE id = 1",
        f"DELETE FROM {s}.uniq WHERE id = 2")
    config = write_config(stack_config(fmt, tmp_path / "work", schema=s, tables=list(TABLES)), tmp_path / "c.yaml")
    prefix = PREFIX[fmt]

    check = ingest_cli("check", "-c", str(config))
    keys = [line for line in check.stdout.splitlines() if line.split(":")[0].endswith("keys")]
    assert check.returncode != 0 and len(keys) == 2, check.stdout + check.stderr
    assert all(line.startswith("FAIL") and "has a Kafka key" in line for line in keys), keys
    assert {line.split(":")[1].strip() for line in keys} == {"logs", "full"}

    run = ingest_cli("run", "-c", str(config))
    assert run.returncode == 0, run.stdout + run.stderr
    held = ingest_cli("quarantine", "list", "-c", str(config), "--format", "json")
    assert held.returncode == 0, held.stdout + held.stderr
    assert "the message has no Kafka key" in held.stdout and "uniq" not in held.stdout

    # The fix: name the key, replay what was held; then the key of two rows moves, one with its
    # TOASTed value unchanged (stored out of line, it arrives whole all the same: REPLICA IDENTITY
    # FULL makes it part of the identity), and one row moves onto a key deleted before.
    data = yaml.safe_load(config.read_text())
    for table in data["tables"]:
        if table["name"] in ("logs", "full"):
            table["primary_key"] = "id"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    for table in ("logs", "full"):
        replay = ingest_cli("quarantine", "replay", "-c", str(config), "-t", table)
        assert replay.returncode == 0 and "0 still held" in replay.stdout, replay.stdout + replay.stderr
    before = change_count(f"{prefix}.{s}.full")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {s}.full SET id = 10 WHERE id = 1")
        conn.execute(f"UPDATE {s}.full SET id = 11, v = 1 WHERE id = 2")
        conn.execute(f"DELETE FROM {s}.full WHERE id = 3")
        conn.execute(f"UPDATE {s}.full SET id = 3 WHERE id = 10")
    wait_until(f"four more changes in {prefix}.{s}.full", lambda: change_count(f"{prefix}.{s}.full") >= before + 4)
    run = ingest_cli("run", "-c", str(config))
    assert run.returncode == 0, run.stdout + run.stderr

    verify = ingest_cli("verify", "-c", str(config), "--source-db", pg_dsn)
    assert verify.returncode != 0, verify.stdout + verify.stderr
    lines = {line.split("│")[1].strip(): line for line in verify.stdout.splitlines() if line.count("│") > 3}
    assert "equal" in lines["full"] and "equal" in lines["uniq"], verify.stdout
    assert "the key (id) is not unique in the source table" in verify.stdout, verify.stdout
    query = ingest_cli("query", "-c", str(config), "--format", "json",
                       'SELECT id, v, md5(big) AS big, _cdc_unknown_columns AS unknown FROM "full" ORDER BY id')
    assert query.returncode == 0, query.stdout + query.stderr
    with psycopg.connect(pg_dsn) as conn:
        source = conn.execute(f"SELECT id, v, md5(big) FROM {s}.full ORDER BY id").fetchall()
    lake = list(map(_json, query.stdout.splitlines()))
    assert [(r["id"], r["v"], r["big"]) for r in lake] == [tuple(r) for r in source]
    assert not any(r["unknown"] for r in lake)
    assert [r[0] for r in source] == [3, 11]


def _json(line: str) -> dict[str, Any]:
    import json

    return dict(json.loads(line))


def test_message_key_columns_key_a_table_without_a_primary_key(stack: Any, pg_dsn: str, tmp_path: Path) -> None:
    """Debezium's ``message.key.columns`` keys the table instead of ``primary_key``: an update of those
    columns arrives as a delete of the old key, its tombstone and a create of the new one."""
    s = SCHEMA + "_mk"
    name = f"keyless{uuid.uuid4().hex[:6]}"
    fresh_schema(stack, pg_dsn, s, [f"{prefix}.{s}.t" for prefix in PREFIX.values()],
                 f"CREATE TABLE {s}.t (id integer, v integer, big text)",
                 f"ALTER TABLE {s}.t REPLICA IDENTITY FULL",
                 f"INSERT INTO {s}.t SELECT g, 0, {BIG} FROM generate_series(1, 3) g")
    with own_connector(stack, PREFIX["json"], name, {"table.include.list": f"{s}.t",
                                                     "message.key.columns": f"{s}.t:id"}):
        topic = f"{name}.{s}.t"
        wait_until(f"the snapshot in {topic}", lambda: change_count(topic) >= 3, timeout=120)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {s}.t SET id = 10 WHERE id = 1")
            conn.execute(f"UPDATE {s}.t SET id = 11, v = 1 WHERE id = 2")
            conn.execute(f"DELETE FROM {s}.t WHERE id = 3")
            conn.execute(f"UPDATE {s}.t SET id = 3 WHERE id = 10")
        wait_until(f"the changes in {topic}", lambda: change_count(topic) >= 10)
        ops = [(e["payload"]["op"], (e["payload"]["before"] or e["payload"]["after"])["id"])
               for e in json_events(topic)[3:]]
        assert ops == [("d", 1), ("c", 10), ("d", 2), ("c", 11), ("d", 3), ("d", 10), ("c", 3)]

        settings = stack_config("json", tmp_path / "work", schema=s, tables=["t"])
        spec = settings.tables[0].model_copy(update={"topic": topic})  # no primary_key
        config = write_config(settings.model_copy(update={"tables": (spec,)}), tmp_path / "c.yaml")
        run_and_verify(config, pg_dsn)
        query = ingest_cli("query", "-c", str(config), "--format", "json",
                           "SELECT id, v, md5(big) AS big, _cdc_unknown_columns AS unknown FROM t ORDER BY id")
        assert query.returncode == 0, query.stdout + query.stderr
        with psycopg.connect(pg_dsn) as conn:
            source = conn.execute(f"SELECT id, v, md5(big), NULL FROM {s}.t ORDER BY id").fetchall()
        assert [tuple(_json(line).values()) for line in query.stdout.splitlines()] == [tuple(r) for r in source]


def test_a_mariadb_table_without_a_primary_key_moves_its_rows_by_the_configured_key(
        stack: Any, tmp_path: Path) -> None:
    """MySQL's full row image (MariaDB's default) gives every update its before image."""
    s = stack.settings
    name = f"keyless_{uuid.uuid4().hex[:8]}"  # a table of its own: no topic of a previous run is read
    conn = stack.component("mariadb").connect(s.mariadb_db)
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {name} (id INT, v INT)")
        cur.execute(f"INSERT INTO {name} VALUES (1, 0), (2, 0), (3, 0)")
        cur.execute(f"UPDATE {name} SET id = 10 WHERE id = 1")
        cur.execute(f"DELETE FROM {name} WHERE id = 2")
        cur.execute(f"UPDATE {name} SET id = 2, v = 5 WHERE id = 3")  # onto the key deleted before
    conn.commit()
    topic = f"mariaavro.{s.mariadb_db}.{name}"
    wait_until(f"six changes in {topic}", lambda: change_count(topic) >= 6, timeout=120)
    config = mariadb_config(tmp_path / "work", s.mariadb_db)
    config = config.model_copy(update={"tables": (TableSpec(name="k", topic=topic, primary_key=("id",)),)})
    path = config_file(config, tmp_path / "c.yaml")
    run = ingest_cli("run", "-c", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    verify = ingest_cli("verify", "-c", str(path), "--source-db", s.mariadb_url())
    assert verify.returncode == 0 and "every table equals its source table" in verify.stdout, \
        verify.stdout + verify.stderr
