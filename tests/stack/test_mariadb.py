"""Every MariaDB type of docs/types-mysql.md, with edge values, through the real Debezium, Kafka and engine.

The stack's MariaDB 10.11 is captured by Debezium's MySQL connector (``mariaavro``, Avro). One module
fixture writes the probe rows in a session whose time zone is +05:30, changes them (updates, a
primary-key move, a delete, ADD COLUMN, a widening MODIFY), truncates a second table, and ingests
both once. The tests check what Debezium emitted and the Delta column types against the documented
ones, the values against hand-written expectations, and ``ingest verify --source-db mysql://...``
against MariaDB itself, which must also notice a change the engine has not applied.

Each run uses tables of its own name (``probe_<hex>``), so topics a previous run left are not read.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
import pytest
from deltalake import DeltaTable
from harness.mariadb import capture as maria_capture

from ingest.config import IngestConfig, TableSpec
from ingest.decode import MessageDecoder
from ingest.decode.registry import driver_registry
from ingest.lake.delta import open_table, read_all
from ingest.model import ChangeEvent, KafkaCoordinates
from ingest.stream.runner import Runner
from tests.harness import ingest_cli
from tests.stack.helpers import (
    avro_columns,
    change_count,
    config_file,
    documented_types,
    read_topic,
    stack_config,
    wait_until,
)

pytestmark = [pytest.mark.stack, pytest.mark.spark]

COLUMNS = """
  id BIGINT UNSIGNED PRIMARY KEY, c_tinyint TINYINT, c_tinyint_u TINYINT UNSIGNED, c_tinyint1 TINYINT(1),
  c_bool BOOLEAN, c_smallint SMALLINT, c_smallint_u SMALLINT UNSIGNED, c_mediumint MEDIUMINT, c_int INT,
  c_int_u INT UNSIGNED, c_bigint BIGINT, c_decimal DECIMAL(12,3), c_float FLOAT, c_double DOUBLE, c_bit1 BIT(1),
  c_bit BIT(10), c_char CHAR(3), c_varchar VARCHAR(40), c_text TEXT, c_enum ENUM('calm','busy'),
  c_set SET('a','b','c'), c_json JSON, c_binary BINARY(3), c_varbinary VARBINARY(8), c_blob BLOB, c_year YEAR,
  c_date DATE, c_time TIME(6), c_time0 TIME, c_datetime DATETIME(6), c_datetime3 DATETIME(3),
  c_datetime0 DATETIME, c_timestamp TIMESTAMP(6) NULL, c_timestamp0 TIMESTAMP NULL
"""
MAX_U64 = 2**64 - 1
ROW_MAX = (
    f"({MAX_U64}, 127, 255, 1, TRUE, 32767, 65535, 8388607, 2147483647, 4294967295, 9223372036854775807, "
    "999999999.999, 1.5, -2.5e300, b'1', b'1010101010', 'x', 'emoji 😀 𝄞', 'äöü', 'busy', 'a,c', "
    "'{\"k\": [1, 2.5], \"ü\": null}', X'00FF', X'00', X'00FF10', 2155, '9999-12-31', '838:59:59.000000', "
    "'-838:59:59', '9999-12-31 23:59:59.999999', '1000-01-01 00:00:00.001', '1970-01-01 00:00:00', "
    "'1970-01-01 05:30:01.000001', '2038-01-19 08:44:07')"
)
ROW_MIN = (
    "(1, -128, 0, 0, FALSE, -32768, 0, -8388608, -2147483648, 0, -9223372036854775808, -999999999.999, -0.25, "
    "0.0, b'0', b'0', '', '', '', 'calm', '', '[]', X'', X'', X'', 1901, '1000-01-01', '-838:59:59.000000', "
    "'00:00:00', '1000-01-01 00:00:00.000001', '2000-02-29 12:00:00.5', '2000-01-01 00:00:00', "
    "'2000-01-01 00:00:00', '2000-01-01 00:00:00')"
)
NULLS = "(2" + ", NULL" * 33 + ")"
#: Zero dates and years below 100, as MariaDB's default sql_mode accepts them (docs/types-mysql.md).
DATES = """(id INT PRIMARY KEY, d_null DATE NULL, d_nn DATE NOT NULL, d_default DATE NOT NULL DEFAULT '2000-02-02',
  dt_null DATETIME NULL, dt_nn DATETIME(3) NOT NULL, dt_now DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
  ts_null TIMESTAMP NULL, ts_default TIMESTAMP NOT NULL DEFAULT '2000-03-03 00:00:00', d_year DATE NULL)"""
DATE_ROWS = (
    "(1, '0000-00-00', '0000-00-00', '0000-00-00', '0000-00-00', '0000-00-00', '0000-00-00', '0000-00-00 00:00:00', "
    "'0000-00-00 00:00:00', '0001-01-01'), "
    "(2, '2024-00-00', '2024-02-00', '2024-00-01', '2024-02-00 10:00:00', '2024-02-00 10:00:00', "
    "'2024-02-00 10:00:00', NULL, '2000-01-01 05:30:00', '0069-12-31')"
)
#: Spatial columns: Debezium's Point struct for a POINT, its Geometry struct for the others; SRID 0 is null.
SHAPES = """(id INT PRIMARY KEY, p POINT, g GEOMETRY, l LINESTRING, p_srid POINT)"""
SHAPE_ROWS = (
    "(1, POINT(1.5, -2), ST_GeomFromText('POLYGON((0 0,1 0,1 1,0 0))'), ST_GeomFromText('LINESTRING(0 0,1 1,2 0)'), "
    "ST_GeomFromText('POINT(10 20)', 4326)), "
    "(2, POINT(-0.1, 1e300), ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 1),LINESTRING(0 0,1 1))'), NULL, NULL)"
)
MOVED = ("(3, 3, 3, 1, TRUE, 3, 3, 3, 3, 3, 3, 3.5, 3.0, 3.0, b'1', b'11', 'abc', 'three', 't', 'calm', 'b', "
         "'{}', X'01', X'01', X'01', 2000, '2000-01-01', '00:00:03', '00:00:03', '2000-01-01 00:00:03', "
         "'2000-01-01 00:00:03', '2000-01-01 00:00:03', '2000-01-01 00:00:03', '2000-01-01 00:00:03')")


@dataclass
class Probe:
    """The ingested probe: its configuration, file, table names and topics."""

    config: IngestConfig
    path: Path
    table: str
    truncated: str
    dates: str
    shapes: str
    conn: pymysql.connections.Connection


DOCUMENTED = documented_types("types-mysql.md")


def _wait_for_events(topic: str, at_least: int) -> None:
    wait_until(f"Debezium wrote fewer than {at_least} events to {topic}", lambda: change_count(topic) >= at_least,
               timeout=120)


@pytest.fixture(scope="module")
def probe(stack: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = stack.settings
    name = f"probe_{uuid.uuid4().hex[:8]}"
    table, truncated, dates, shapes = name, f"{name}_trunc", f"{name}_dates", f"{name}_shapes"
    conn = stack.component("mariadb").connect(s.mariadb_db)
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+05:30'")
        cur.execute(f"CREATE TABLE {table} ({COLUMNS}) CHARACTER SET utf8mb4")
        for row in (ROW_MAX, ROW_MIN, NULLS, MOVED):
            cur.execute(f"INSERT INTO {table} VALUES {row}")
        cur.execute(f"UPDATE {table} SET c_text = 'changed ✓', c_timestamp = '2030-01-01 00:00:00.5' WHERE id = 1")
        cur.execute(f"UPDATE {table} SET id = 10 WHERE id = 3")  # a key move: delete, tombstone, create
        cur.execute(f"DELETE FROM {table} WHERE id = 2")
        # No DEFAULT: MariaDB would fill existing rows with it without writing them (docs/types-mysql.md).
        cur.execute(f"ALTER TABLE {table} ADD COLUMN c_note VARCHAR(10), MODIFY c_varchar VARCHAR(200)")
        cur.execute(f"INSERT INTO {table} (id, c_varchar, c_note) VALUES (20, REPEAT('w', 150), 'added')")
        cur.execute(f"UPDATE {table} SET c_note = 'later' WHERE id = 1")
        # With a DEFAULT, then every row changed, so the table can equal MariaDB: Debezium's schema
        # states the default (test_a_default_is_read_from_the_avro_schema).
        cur.execute(f"ALTER TABLE {table} ADD COLUMN c_flag CHAR(1) NOT NULL DEFAULT 'y'")
        cur.execute(f"UPDATE {table} SET c_flag = 'n'")
        cur.execute(f"CREATE TABLE {truncated} (id INT PRIMARY KEY, v VARCHAR(5))")
        cur.execute(f"INSERT INTO {truncated} VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        cur.execute(f"TRUNCATE TABLE {truncated}")
        cur.execute(f"INSERT INTO {truncated} VALUES (4, 'd')")
        cur.execute(f"CREATE TABLE {dates} {DATES}")
        cur.execute(f"INSERT INTO {dates} VALUES {DATE_ROWS}")
        cur.execute(f"CREATE TABLE {shapes} {SHAPES}")
        cur.execute(f"INSERT INTO {shapes} VALUES {SHAPE_ROWS}")
    topic = f"mariaavro.{s.mariadb_db}.{table}"
    config = stack_config("avro", tmp_path_factory.mktemp("mariadb"))
    config = config.model_copy(update={"tables": (
        TableSpec(name="probe", topic=topic),
        TableSpec(name="truncated", topic=f"mariaavro.{s.mariadb_db}.{truncated}"),
        TableSpec(name="dates", topic=f"mariaavro.{s.mariadb_db}.{dates}"),
        TableSpec(name="shapes", topic=f"mariaavro.{s.mariadb_db}.{shapes}"))})
    path = config_file(config, tmp_path_factory.mktemp("mariadb-config") / "config.yaml")
    _wait_for_events(topic, 4 + 1 + 2 + 1 + 1 + 1 + 4)
    _wait_for_events(f"mariaavro.{s.mariadb_db}.{truncated}", 5)
    _wait_for_events(f"mariaavro.{s.mariadb_db}.{dates}", 2)
    _wait_for_events(f"mariaavro.{s.mariadb_db}.{shapes}", 2)
    report = Runner(config, spark=spark).run()
    assert not report.failed, {n: t.error for n, t in report.tables.items()}
    yield Probe(config, path, table, truncated, dates, shapes, conn)
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE {table}, {truncated}, {dates}, {shapes}")
    conn.close()


def _rows(probe: Probe, table: str = "probe") -> dict[Any, dict[str, Any]]:
    delta = open_table(probe.config.table_path(table))
    assert delta is not None, f"{table}: no Delta table"
    return {r["id"]: r for r in read_all(delta).to_pylist() if not r.get("_cdc_deleted")}


def test_docs_list_every_probe_column() -> None:
    documented = {row["probe column"] for row in DOCUMENTED}
    columns = set(re.findall(r"\b(c_\w+|id) [A-Z]", COLUMNS))
    assert columns == documented, f"probe columns and docs/types-mysql.md differ: {columns ^ documented}"


@pytest.mark.parametrize("row", DOCUMENTED, ids=[r["probe column"] for r in DOCUMENTED])
def test_debezium_emits_what_the_docs_say(probe: Probe, row: dict[str, str]) -> None:
    schema = avro_columns(probe.config.tables[0].topic)
    assert schema[row["probe column"]] == (row["Avro type"], row["semantic name"] or None)


def test_delta_types_are_the_documented_ones(probe: Probe) -> None:
    delta = DeltaTable(str(probe.config.table_path("probe")))
    types = {f.name: f.type.type for f in delta.schema().fields if hasattr(f.type, "type")}
    wrong = {r["probe column"]: (types.get(r["probe column"]), r["Delta type"]) for r in DOCUMENTED
             if types.get(r["probe column"]) != r["Delta type"]}
    assert not wrong, f"column: (Delta type, documented type): {wrong}"


def test_edge_values_as_the_engine_writes_them(probe: Probe) -> None:
    rows = _rows(probe)
    assert sorted(rows) == [1, 10, 20, MAX_U64]
    top, low = rows[MAX_U64], rows[1]
    assert (top["c_tinyint"], top["c_tinyint_u"], top["c_smallint_u"], top["c_int_u"]) == (127, 255, 65535, 2**32 - 1)
    assert top["c_bigint"] == 2**63 - 1 and low["c_bigint"] == -(2**63) and low["c_mediumint"] == -8388608
    assert top["c_decimal"] == Decimal("999999999.999") and low["c_decimal"] == Decimal("-999999999.999")
    assert top["c_tinyint1"] == 1 and top["c_bool"] is True and low["c_bool"] is False
    assert top["c_float"] == 1.5 and low["c_float"] == -0.25 and top["c_double"] == -2.5e300
    assert top["c_bit1"] is True and top["c_bit"] == b"\xaa\x02" and low["c_bit"] == b"\x00\x00"
    assert top["c_char"] == "x" and top["c_varchar"] == "emoji 😀 𝄞" and low["c_text"] == "changed ✓"
    assert top["c_enum"] == "busy" and top["c_set"] == "a,c" and low["c_set"] == ""
    assert json.loads(top["c_json"]) == {"k": [1, 2.5], "ü": None}
    assert top["c_binary"] == b"\x00\xff\x00" and top["c_varbinary"] == b"\x00" and low["c_blob"] == b""
    assert top["c_year"] == 2155 and low["c_year"] == 1901
    assert top["c_date"] == date(9999, 12, 31) and low["c_date"] == date(1000, 1, 1)
    assert top["c_time"] == 3_020_399_000_000 and top["c_time0"] == -3_020_399_000_000
    assert top["c_datetime"] == datetime(9999, 12, 31, 23, 59, 59, 999999) and top["c_datetime"].tzinfo is None
    assert top["c_datetime3"] == datetime(1000, 1, 1, 0, 0, 0, 1000)
    assert low["c_datetime3"] == datetime(2000, 2, 29, 12, 0, 0, 500000)
    # written at +05:30: the instants in UTC
    assert top["c_timestamp"] == datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=UTC)
    assert top["c_timestamp0"] == datetime(2038, 1, 19, 3, 14, 7, tzinfo=UTC)
    assert low["c_timestamp"] == datetime(2029, 12, 31, 18, 30, 0, 500000, tzinfo=UTC)
    assert rows[10]["c_varchar"] == "three" and rows[10]["c_note"] is None
    assert rows[20]["c_varchar"] == "w" * 150 and rows[20]["c_note"] == "added" and low["c_note"] == "later"


def test_truncate_empties_the_table(probe: Probe) -> None:
    assert sorted(_rows(probe, "truncated")) == [4]


def test_zero_dates_and_early_years_arrive_as_debezium_sends_them(probe: Probe) -> None:
    """A zero date, or one with a zero month or day, arrives as null in a nullable DATE or DATETIME,
    else as the column's default date, else as the epoch; a zero TIMESTAMP as the epoch in any column.
    Years below 100 keep their year with enable.time.adjuster=false (its default adds 2000 or 1900).
    The verify test below finds the table equal to MariaDB: verify reads zero dates the same way."""
    epoch, utc_epoch = datetime(1970, 1, 1), datetime(1970, 1, 1, tzinfo=UTC)
    columns = ("d_null", "d_nn", "d_default", "dt_null", "dt_nn", "dt_now", "ts_null", "ts_default", "d_year")
    assert {n: tuple(r[c] for c in columns) for n, r in _rows(probe, "dates").items()} == {
        1: (None, epoch.date(), date(2000, 2, 2), None, epoch, epoch, utc_epoch, utc_epoch, date(1, 1, 1)),
        2: (None, epoch.date(), date(2000, 2, 2), None, epoch, epoch, None, datetime(2000, 1, 1, tzinfo=UTC),
            date(69, 12, 31)),
    }


def test_spatial_values_arrive_as_debeziums_structs(probe: Probe) -> None:
    """A POINT as Debezium's Point struct (coordinates, WKB, SRID), other spatial types as its Geometry
    struct; SRID 0 arrives as null. The verify test below finds the table equal to MariaDB, which
    reads each stored value (the SRID, then the WKB) the same way."""
    rows = {n: {c: None if r[c] is None else json.loads(r[c]) for c in ("p", "g", "l", "p_srid")}
            for n, r in _rows(probe, "shapes").items()}
    assert rows[1]["p"] == {"x": 1.5, "y": -2.0, "srid": None, "wkb": "AQEAAAAAAAAAAAD4PwAAAAAAAADA"}
    assert rows[1]["p_srid"] == {"x": 10.0, "y": 20.0, "srid": 4326, "wkb": "AQEAAAAAAAAAAAAkQAAAAAAAADRA"}
    assert set(rows[1]["g"]) == {"wkb", "srid"} and rows[1]["g"]["wkb"].startswith("AQMAAAA")  # a polygon
    assert rows[2]["p"]["y"] == 1e300 and rows[2]["l"] is None and rows[2]["p_srid"] is None


def test_verify_finds_every_table_equal_to_mariadb_then_a_change_not_applied(probe: Probe, stack: Any) -> None:
    url = stack.settings.mariadb_url()
    verify = ingest_cli("verify", "-c", str(probe.path), "--source-db", url, "--wait", "60")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "every table equals its source table" in verify.stdout
    assert "not compared" not in verify.stdout  # every column of every probe table, spatial ones included
    assert stack.settings.credentials.mariadb_password not in verify.stdout + verify.stderr

    with probe.conn.cursor() as cur:
        cur.execute(f"UPDATE {probe.table} SET c_set = 'b', c_bit = b'1' WHERE id = {MAX_U64}")
    _wait_for_events(probe.config.tables[0].topic, 11)
    verify = ingest_cli("verify", "-c", str(probe.path), "--source-db", url, "--wait", "3", "-t", "probe")
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert "1 different" in verify.stdout and "column 'c_set' expected 'b', got 'a,c'" in verify.stdout


def test_a_default_is_read_from_the_avro_schema(probe: Probe) -> None:
    """Adding a column with a default fills MariaDB's rows without a binlog event; the engine names the
    default, read from the schema Debezium registered, when such a column reaches an existing table
    (docs/operations.md#a-column-added-with-a-default)."""
    decoder = MessageDecoder(value_format="avro", registry=driver_registry(probe.config))
    key, value = read_topic(probe.config.tables[0].topic)[-1]
    event = decoder.decode(key, value, KafkaCoordinates(probe.config.tables[0].topic, 0, 0, 0))
    assert isinstance(event, ChangeEvent) and event.after is not None and event.after["c_flag"] == "n"
    defaults = {c.name: c.default for c in event.columns}
    assert defaults["c_flag"] == "'y'" and defaults["c_note"] is None, defaults


def test_generated_columns_arrive_with_their_values(stack: Any, tmp_path: Path) -> None:
    """MariaDB's binlog carries a generated column's value, stored or virtual (PostgreSQL publishes
    none: docs/types.md), so the Delta table has it, and equals MariaDB."""
    s = stack.settings
    name = f"derived_{uuid.uuid4().hex[:8]}"  # a table of its own: no topic of a previous run is read
    with stack.component("mariadb").connect(s.mariadb_db) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {name} (id INT PRIMARY KEY, price DECIMAL(10,2), qty INT, "
                    "total DECIMAL(12,2) AS (price * qty) STORED, half DECIMAL(12,2) AS (price / 2) VIRTUAL)")
        cur.execute(f"INSERT INTO {name} (id, price, qty) VALUES (1, 2.50, 4), (2, 1.00, 3)")
        cur.execute(f"UPDATE {name} SET qty = 5 WHERE id = 1")
        conn.commit()
    topic = f"mariaavro.{s.mariadb_db}.{name}"
    _wait_for_events(topic, 3)
    config = stack_config("avro", tmp_path / "work")
    config = config.model_copy(update={"tables": (TableSpec(name="derived", topic=topic),)})
    path = config_file(config, tmp_path / "config.yaml")
    run = ingest_cli("run", "-c", str(path))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["id"]: (r["total"], r["half"]) for r in read_all(open_table(config.table_path("derived"))).to_pylist()}
    assert rows == {1: (Decimal("12.50"), Decimal("1.25")), 2: (Decimal("3.00"), Decimal("0.50"))}
    verify = ingest_cli("verify", "-c", str(path), "--source-db", s.mariadb_url())
    assert verify.returncode == 0 and "every table equals its source table" in verify.stdout, \
        verify.stdout + verify.stderr


def test_a_stopped_stack_leaves_the_mariadb_connector_with_nothing_to_skip(stack: Any) -> None:
    """docs/stack.md: the stack's connector takes a DDL's GTID as a transaction's begin and counts each
    later event as one a restart must skip, so ``down`` first has it commit an offset at or past a row
    transaction after the DDL (the capture marker), which ends the count."""
    maria = stack.component("mariadb")
    with maria.connect() as conn, conn.cursor() as cur:
        cur.execute("CREATE DATABASE IF NOT EXISTS settle_probe")  # a standalone GTID: a count starts
    after_ddl = maria_capture.binlog_position(*maria.admin("SHOW MASTER STATUS").split()[:2])
    assert stack.settle_mariadb_offset()
    offset = stack.component("connect").offsets("mariaavro")[0]["offset"]
    assert maria_capture.binlog_position(offset["file"], offset["pos"]) >= after_ddl, offset
