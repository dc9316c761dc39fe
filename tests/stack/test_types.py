"""Every PostgreSQL type of docs/types.md, with edge values, through the real Debezium, Kafka and engine.

One module fixture writes the rows once (schema ``typeprobe``; its topics are deleted first, so
every run starts from empty topics), waits until Debezium has captured them, then each format is
ingested once into its own workdir. The tests then check, per format: what Debezium emitted
against the documented Connect/JSON/Avro types, the Delta column types against the documented
ones, and the Delta values against hand-written expectations and against a SELECT of the source.
"""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from harness.postgres.values import large_text

from ingest.config import IngestConfig
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.records import quarantine
from ingest.stream.runner import Runner
from ingest.verify import pg_source
from ingest.verify.capture import delete_topics, wait_for_capture
from ingest.verify.source_db import check_table
from tests.stack.helpers import PREFIX, avro_columns, documented_types, json_events, stack_config

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "typeprobe"
TABLES = ["edge", "toast_pk", "floats", "special", "lost", "quirks", "spans", "clock", "eras", "derived"]
FLOAT_COLUMNS = ("c_real", "c_double")
# Random text, so PostgreSQL cannot compress it below its ~2 kB TOAST threshold: stored out of line.
BIG = large_text(random.Random(7))
BIG2 = large_text(random.Random(8))
DDL = """
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE EXTENSION IF NOT EXISTS citext;
CREATE EXTENSION IF NOT EXISTS ltree;
CREATE TYPE typeprobe.mood AS ENUM ('happy', 'sad', 'ünïcode');
CREATE DOMAIN typeprobe.positive AS numeric(10,2) CHECK (VALUE > 0);
CREATE TABLE typeprobe.edge (
    id integer PRIMARY KEY, c_smallint smallint, c_bigint bigint, c_numeric_12_2 numeric(12,2), c_numeric numeric,
    c_timestamptz timestamptz, c_timestamp timestamp, c_timestamp3 timestamp(3), c_date date, c_time time,
    c_time3 time(3), c_timetz timetz, c_interval interval, c_jsonb jsonb, c_json json, c_uuid uuid,
    c_enum typeprobe.mood, c_bytea bytea, c_text_array text[], c_int_array integer[], c_text text,
    c_varchar varchar(10), c_char char(3), c_boolean boolean, c_big text, c_date_array date[],
    c_numeric_array numeric(12,2)[], c_vsd_array numeric[], c_timestamp_array timestamp[],
    c_timestamptz_array timestamptz[], c_uuid_array uuid[], c_time_array time[], c_inet inet, c_cidr cidr,
    c_macaddr macaddr, c_money money, c_domain typeprobe.positive, c_int4range int4range, c_daterange daterange,
    c_tsrange tsrange, c_tstzrange tstzrange, c_bit bit(10), c_bit1 bit(1), c_varbit bit varying(20), c_xml xml,
    c_tsvector tsvector, c_hstore hstore, c_citext citext, c_ltree ltree, c_oid oid, c_char1 "char", c_point point);
CREATE TABLE typeprobe.toast_pk (id integer PRIMARY KEY, note text, c_big text);
CREATE TABLE typeprobe.floats (id integer PRIMARY KEY, c_real real, c_double double precision);
CREATE TABLE typeprobe.lost (id integer PRIMARY KEY, nan_array numeric[], matrix integer[][], moods typeprobe.mood[],
    pg_name name);
CREATE TABLE typeprobe.quirks (id integer PRIMARY KEY, old_stamps timestamp[], dates date[], stamps timestamptz[]);
CREATE TABLE typeprobe.spans (id integer PRIMARY KEY, i interval, r tstzrange, p point, ts time[]);
CREATE TABLE typeprobe.eras (id integer PRIMARY KEY, d date, ts timestamp, tstz timestamptz);
CREATE TABLE typeprobe.clock (id integer PRIMARY KEY, t time, t3 time(3), tz timetz, ta time[], tza timetz[]);
CREATE TABLE typeprobe.derived (id integer PRIMARY KEY, price numeric(10,2), qty integer,
    total numeric(12,2) GENERATED ALWAYS AS (price * qty) STORED, n integer GENERATED ALWAYS AS IDENTITY);
CREATE TABLE typeprobe.special (id integer PRIMARY KEY, c_timestamp timestamp, c_timestamp3 timestamp(3),
    c_timestamptz timestamptz, c_date date, c_numeric numeric, c_numeric_12_2 numeric(12,2));
"""
ROW_1 = """INSERT INTO typeprobe.edge VALUES (1, -32768, -9223372036854775808, -1234567890.12,
  -123456789012345678.123456789012345678, '1969-07-20 20:17:40.123456+00', '1900-01-01 00:00:00.000001',
  '1960-02-29 12:00:00.5', '0001-01-01', '23:59:59.999999', '23:59:59.999', '23:59:59.999999+05:30',
  '1 year 2 mons 3 days 04:05:06.789', '{"ü": [1, 2.50, null], "a": {"b": "✓"}, "big": 1e400}',
  '{"x" :  1}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'ünïcode', '\\x00ff00', '{}', '{}', '', 'äöü€ 🚀',
  'x', false, %s, '{2024-02-29,NULL,0001-01-01,9999-12-31}', '{1.50,-2.25,NULL}', '{1.5,100,-0.000001}',
  '{"2024-02-29 12:00:00.5",infinity,-infinity,"1970-01-01 00:00:00.000001"}',
  '{"2024-02-29 13:00:00.25+01",infinity,"1999-12-31 23:59:59.123456-08"}',
  '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}', '{12:00:01.5,NULL}', '10.0.0.1', '192.168.0.0/24',
  '08:00:2b:01:02:03', '-92233720368547758.08', 12.50, '[1,10)', '[2024-01-01,2024-02-29]',
  '["2024-02-29 12:00","2024-03-01 00:00:00.5")', '[2024-01-01 00:00+05:30,)', B'1000000001', B'1',
  B'10000000000000000001', '<a b="ü">x &amp; y</a>', 'a fat cat', 'a=>1, "b c"=>NULL, ü=>"✓"', 'MiXeD ✓',
  'top.science.astro', 4294967295, 'x', '(1.5,-2)')"""
ROW_3 = """INSERT INTO typeprobe.edge VALUES (3, 32767, 9223372036854775807, 9999999999.99,
  0.000000000000000001, '9999-12-31 23:59:59.999999+00', '2262-04-11 23:47:16.854775', '1970-01-01 00:00:00',
  '9999-12-31', '00:00:00', '00:00:00.001', '00:00:00-08:00', '-3 days', '[]', 'null',
  '00000000-0000-0000-0000-000000000000', 'happy', '', '{"a,b", NULL, "c\\"d", "ü"}', '{1, NULL, -3}',
  'it''s; DROP TABLE x; --', 'abcdefghij', 'abc', true, 'short', '{}', '{}', '{}', '{}', '{}', '{}', '{}',
  '::1', '2001:db8::/32', '00:00:00:00:00:00', '92233720368547758.07', 0.01, 'empty', '(,)', 'empty', '(,)',
  B'0000000000', B'0', B'', '<r/>', '', '', '', '', 0, '', '(0,0)')"""
STATEMENTS = [
    ("INSERT INTO typeprobe.edge (id) VALUES (2)", None),
    ("UPDATE typeprobe.edge SET c_text = 'updated ✓' WHERE id = 1", None),  # c_big unchanged: TOAST placeholder
    ("INSERT INTO typeprobe.edge (id, c_text) VALUES (5, 'to be deleted')", None),
    ("DELETE FROM typeprobe.edge WHERE id = 5", None),
    ("INSERT INTO typeprobe.edge (id, c_text, c_big) VALUES (6, 'moves', 'small')", None),
    ("UPDATE typeprobe.edge SET id = 60 WHERE id = 6", None),
    ("INSERT INTO typeprobe.toast_pk VALUES (1, 'n', %s)", BIG2),
    # moves of a TOASTed row: the new key's value comes from the old key's row
    ("UPDATE typeprobe.toast_pk SET id = 2 WHERE id = 1", None),
    ("UPDATE typeprobe.toast_pk SET id = 3, note = 'm' WHERE id = 2", None),
    ("UPDATE typeprobe.toast_pk SET note = 'k' WHERE id = 3", None),
    ("INSERT INTO typeprobe.floats VALUES (1, -1.5, 1.0000000000000002), (2, 'Infinity', '-Infinity'), "
     "(3, NULL, -0.1)", None),
    ("INSERT INTO typeprobe.lost VALUES (1, '{1.5,NaN}', '{{1,2},{3,4}}', '{happy,NULL}', 'pg_name')", None),
    ("INSERT INTO typeprobe.quirks VALUES (1, '{\"1500-06-01 12:00\"}', NULL, NULL), (2, NULL, '{infinity}', NULL), "
     "(3, NULL, NULL, '{-infinity}')", None),
    # Intervals whose MicroDuration takes Debezium's floating-point steps: fractions, signs, extremes.
    ("INSERT INTO typeprobe.spans VALUES (1, '1 year 2 mons 3 days 04:05:06.789', "
     "'[2024-01-01 00:00+05:30,2024-06-01 12:00:00.5-08)', '(1.5,-2)', '{12:00:01.5,NULL}'), "
     "(2, '-1 years -2 mons +3 days -04:05:06.000001', '(,2024-01-01 00:00+00]', '(-0.1,1e300)', '{}'), "
     "(3, '0.000001 seconds', 'empty', '(0,-0)', '{00:00:00,23:59:59.999999}'), "
     "(4, '-0.000001 seconds', '[-infinity,infinity]', '(1e-300,3.141592653589793)', NULL), "
     "(5, '178000000 years', NULL, NULL, NULL), (6, '-178000000 years', NULL, NULL, NULL), "
     "(7, '1 mon -1 sec', NULL, NULL, NULL), (8, '100000 hours', NULL, NULL, NULL), "
     "(9, '7 days 0.3 sec', NULL, NULL, NULL), (10, '2147483647 days', NULL, NULL, NULL), "
     "(11, '29 days 23:59:59.999999', NULL, NULL, NULL), (12, NULL, NULL, NULL, NULL)", None),
    ("INSERT INTO typeprobe.spans SELECT g, make_interval(months => (g * 7919) % 2000 - 1000, "
     "days => (g * 104729) % 100 - 50, hours => g % 50 - 25, mins => g % 61, secs => (g * 7877) % 100000007 / 1e6), "
     "tstzrange(timestamptz '2000-01-01 00:00:00.123456+00' + g * interval '1 day 0.000007 sec', NULL, '(]'), "
     "point(g / 7.0, -g / 3.0), ARRAY[make_time(g % 24, g % 60, g / 1000.0)] FROM generate_series(13, 212) g", None),
    # Years PostgreSQL holds and Python and Delta do not: after 9999, and BC.
    ("INSERT INTO typeprobe.eras VALUES (1, '10000-01-01', NULL, NULL), (2, NULL, '0044-03-15 12:00 BC', NULL), "
     "(3, NULL, NULL, '294276-12-31 23:59:59+00'), (4, '9999-12-31', '9999-12-31 23:59:59.999999', "
     "'0001-01-01 00:00:00+00')", None),
    # PostgreSQL's 24:00:00, which Python's time cannot hold, and offsets that take a timetz past midnight UTC.
    ("INSERT INTO typeprobe.clock VALUES (1, '24:00:00', '24:00:00', '24:00:00+00', '{24:00:00,NULL}', "
     "'{24:00:00+02}'), (2, '00:00:00', '23:59:59.999', '00:00:00-14:59', '{00:00:00}', "
     "'{23:59:59.999999+14:59,12:00:00-09:30}'), (3, '12:34:56.789123', NULL, '12:00:00.5+00', '{}', '{}'), "
     "(4, NULL, NULL, NULL, NULL, NULL)", None),
    ("INSERT INTO typeprobe.derived (id, price, qty) VALUES (1, 2.50, 4), (2, 1.00, 3)", None),
    ("UPDATE typeprobe.derived SET qty = 5 WHERE id = 1", None),
    ("INSERT INTO typeprobe.special VALUES (1, 'infinity', 'infinity', 'infinity', 'infinity', 'NaN', 'NaN'), "
     "(2, '-infinity', '-infinity', '-infinity', '-infinity', '-Infinity', 1.5), "
     "(3, '2024-02-29 12:00', '2024-02-29 12:00', '2024-02-29 12:00+00', '2024-02-29', 2.5, 2.5)", None),
]


DOCUMENTED = documented_types("types.md")


@pytest.fixture(scope="module")
def probe(pg_dsn: str, stack: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, IngestConfig]:
    """Write the probe rows once, let Debezium capture them, ingest both formats."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS typeprobe CASCADE")
        delete_topics(stack.bootstrap_servers(), [f"{p}.{SCHEMA}.{t}" for p in PREFIX.values() for t in TABLES])
        conn.execute("CREATE SCHEMA typeprobe")
        conn.execute(DDL.encode())
        conn.execute(ROW_1.encode(), (BIG,))
        conn.execute(ROW_3.encode())
        for statement, param in STATEMENTS:
            conn.execute(statement.encode(), (param,) if param is not None else None)
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok
    configs = {}
    for fmt in PREFIX:
        config = stack_config(fmt, tmp_path_factory.mktemp(f"types-{fmt}"), schema=SCHEMA, tables=TABLES)
        report = Runner(config, spark=spark).run()
        assert not report.failed, {n: t.error for n, t in report.tables.items()}
        configs[fmt] = config
    return configs


def _delta_rows(config: IngestConfig, table: str) -> dict[int, dict[str, Any]]:
    delta = open_table(config.table_path(table))
    assert delta is not None, f"{table}: no Delta table"
    return {r["id"]: r for r in read_all(delta).to_pylist()}


def _json_schema(table: str) -> dict[str, tuple[str, str | None]]:
    """Column -> (JSON schema type, semantic name) of the ``after`` image, from the table's first message."""
    envelope = json_events(f"{PREFIX['json']}.{SCHEMA}.{table}")[0]["schema"]
    after = next(f for f in envelope["fields"] if f["field"] == "after")
    return {f["field"]: (f["type"], f.get("name")) for f in after["fields"]}


def test_docs_list_every_probe_column() -> None:
    documented = {row["probe column"] for row in DOCUMENTED}
    columns = set(re.findall(r"\b(c_\w+|id) \w", DDL))
    assert columns - {"id"} <= documented, f"columns without a row in docs/types.md: {columns - documented}"


@pytest.mark.parametrize("row", DOCUMENTED, ids=[f"{r['PostgreSQL']}-{r['probe column']}" for r in DOCUMENTED])
def test_debezium_emits_what_the_docs_say(probe: dict[str, IngestConfig], row: dict[str, str]) -> None:
    table = "floats" if row["probe column"] in FLOAT_COLUMNS else "edge"
    column, semantic = row["probe column"], row["semantic name"] or None
    assert _json_schema(table)[column] == (row["JSON schema type"], semantic)
    assert avro_columns(f"{PREFIX['avro']}.{SCHEMA}.{table}")[column] == (row["Avro type"], semantic)


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_delta_types_are_the_documented_ones(probe: dict[str, IngestConfig], fmt: str) -> None:
    delta = DeltaTable(str(probe[fmt].table_path("edge")))
    types = {f.name: f.type.type for f in delta.schema().fields if hasattr(f.type, "type")}
    wrong = {r["probe column"]: (types.get(r["probe column"]), r["Delta type"]) for r in DOCUMENTED
             if r["probe column"] in types and types[r["probe column"]] != r["Delta type"]}
    assert not wrong, f"column: (Delta type, documented type): {wrong}"
    documented_edge = {r["probe column"] for r in DOCUMENTED} - set(FLOAT_COLUMNS)
    assert documented_edge <= set(types)


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_edge_values_as_the_engine_writes_them(probe: dict[str, IngestConfig], fmt: str) -> None:
    rows = _delta_rows(probe[fmt], "edge")
    assert sorted(rows) == [1, 2, 3, 60]
    one, three = rows[1], rows[3]
    assert one["c_smallint"] == -32768 and one["c_bigint"] == -(2**63)
    assert one["c_numeric_12_2"] == Decimal("-1234567890.12")
    assert one["c_numeric"] == Decimal("-123456789012345678.123456789012345678")
    assert three["c_numeric"] == Decimal("0.000000000000000001")
    assert one["c_timestamptz"] == datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC)
    assert one["c_timestamp"] == datetime(1900, 1, 1, 0, 0, 0, 1) and one["c_timestamp"].tzinfo is None
    assert one["c_timestamp3"] == datetime(1960, 2, 29, 12, 0, 0, 500000)
    assert three["c_timestamptz"] == datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert one["c_date"] == date(1, 1, 1) and three["c_date"] == date(9999, 12, 31)
    assert one["c_time"] == 86_399_999_999 and three["c_time"] == 0
    assert one["c_time3"] == 86_399_999_000 and three["c_time3"] == 1000
    assert one["c_timetz"] == "18:29:59.999999Z" and three["c_timetz"] == "08:00:00Z"
    assert one["c_interval"] == 37_091_106_789_000  # Debezium: a month is 30.4375 days
    assert json.loads(one["c_jsonb"], parse_float=Decimal) == {"a": {"b": "✓"}, "big": Decimal("1e400"),
                                                             "ü": [1, Decimal("2.50"), None]}
    assert one["c_json"] == '{"x" :  1}'  # json keeps its text as written
    assert one["c_uuid"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" and one["c_enum"] == "ünïcode"
    assert one["c_bytea"] == b"\x00\xff\x00" and three["c_bytea"] == b""
    assert one["c_text_array"] == "[]" and one["c_int_array"] == "[]"
    assert json.loads(three["c_text_array"]) == ["a,b", None, 'c"d', "ü"]
    assert three["c_int_array"] == "[1, null, -3]"
    assert one["c_text"] == "updated ✓" and one["c_varchar"] == "äöü€ 🚀" and one["c_char"] == "x  "
    assert three["c_text"] == "it's; DROP TABLE x; --" and one["c_boolean"] is False
    assert all(v is None for k, v in rows[2].items() if not k.startswith("_cdc_") and k != "id")
    # The update left c_big unchanged: Debezium sent a placeholder and the engine kept the stored value.
    assert one["c_big"] == BIG and not one["_cdc_unknown_columns"]
    assert rows[60]["c_text"] == "moves" and rows[60]["c_big"] == "small"
    # Arrays of a semantic type: each element as a column of its type, JSON as PostgreSQL prints it.
    assert one["c_date_array"] == '["2024-02-29", null, "0001-01-01", "9999-12-31"]'
    assert one["c_numeric_array"] == "[1.50, -2.25, null]" and one["c_vsd_array"] == "[1.5, 100, -0.000001]"
    assert one["c_timestamp_array"] == ('["2024-02-29T12:00:00.5", "9999-12-31T23:59:59", "0001-01-01T00:00:00", '
                                        '"1970-01-01T00:00:00.000001"]')
    assert one["c_timestamptz_array"] == ('["2024-02-29T12:00:00.25+00:00", "9999-12-31T23:59:59+00:00", '
                                          '"2000-01-01T07:59:59.123456+00:00"]')
    assert one["c_uuid_array"] == '["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", null]'
    assert one["c_time_array"] == "[43201500000, null]"
    assert all(three[c] == "[]" for c in ("c_date_array", "c_numeric_array", "c_vsd_array", "c_timestamp_array",
                                          "c_timestamptz_array", "c_uuid_array", "c_time_array"))
    # Types sent as PostgreSQL prints them; money and a domain over numeric(10,2) as decimals; bits as
    # Java's BitSet bytes (least significant byte first, none above the highest set bit).
    assert (one["c_inet"], three["c_inet"]) == ("10.0.0.1", "::1")  # a host's address without /32 or /128
    assert (one["c_cidr"], three["c_cidr"]) == ("192.168.0.0/24", "2001:db8::/32")
    assert (one["c_macaddr"], three["c_macaddr"]) == ("08:00:2b:01:02:03", "00:00:00:00:00:00")
    assert (one["c_money"], three["c_money"]) == (Decimal("-92233720368547758.08"), Decimal("92233720368547758.07"))
    assert (one["c_domain"], three["c_domain"]) == (Decimal("12.50"), Decimal("0.01"))
    assert (one["c_int4range"], three["c_int4range"]) == ("[1,10)", "empty")
    assert (one["c_daterange"], three["c_daterange"]) == ("[2024-01-01,2024-03-01)", "(,)")  # made canonical
    assert (one["c_tsrange"], three["c_tsrange"]) == ('["2024-02-29 12:00:00","2024-03-01 00:00:00.5")', "empty")
    assert (one["c_tstzrange"], three["c_tstzrange"]) == ('["2023-12-31 18:30:00+00",)', "(,)")  # UTC session
    assert (one["c_bit"], three["c_bit"]) == (b"\x01\x02", b"")  # B'1000000001' = 513; all zeros: no bytes
    assert (one["c_bit1"], three["c_bit1"]) == (True, False)
    assert (one["c_varbit"], three["c_varbit"]) == (b"\x01\x00\x08", b"")  # 2^19 + 1
    assert (one["c_xml"], three["c_xml"]) == ('<a b="ü">x &amp; y</a>', "<r/>")
    assert (one["c_tsvector"], three["c_tsvector"]) == ("'a' 'cat' 'fat'", "")
    assert json.loads(one["c_hstore"]) == {"a": "1", "b c": None, "ü": "✓"} and three["c_hstore"] == "{}"
    assert (one["c_citext"], three["c_citext"]) == ("MiXeD ✓", "")
    assert (one["c_ltree"], three["c_ltree"]) == ("top.science.astro", "")
    assert (one["c_oid"], three["c_oid"]) == (4294967295, 0)
    assert (one["c_char1"], three["c_char1"]) == ("x", "")
    assert json.loads(one["c_point"]) == {"x": 1.5, "y": -2.0, "srid": None, "wkb": "AQEAAAAAAAAAAAD4PwAAAAAAAADA"}


def test_debezium_really_sent_the_unchanged_toast_placeholder(probe: dict[str, IngestConfig]) -> None:
    updates = [e["payload"] for e in json_events(f"{PREFIX['json']}.{SCHEMA}.edge") if e["payload"]["op"] == "u"]
    assert [u["after"]["c_big"] for u in updates if u["after"]["id"] == 1] == ["__debezium_unavailable_value"]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_edge_table_equals_its_source(probe: dict[str, IngestConfig], fmt: str, pg_dsn: str) -> None:
    config = probe[fmt]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("edge"), conn, pg_source)
    assert check.error is None
    assert check.verification is not None and check.verification.ok, check.verification.examples
    assert check.verification.expected_rows == 4
    assert not [note for note in check.notes if "not compared" in note]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_intervals_ranges_points_and_time_arrays_equal_their_source(probe: dict[str, IngestConfig], fmt: str,
                                                                   pg_dsn: str) -> None:
    """verify computes an interval's microseconds as Debezium does (a month is 30.4375 days, in its
    floating-point steps), reads a tstzrange as instants and a point as Debezium's struct: 212 rows of
    fractions, signs and extremes equal what Debezium sent. Debezium truncates a time[] element to
    milliseconds (docs/types.md), which verify reports."""
    rows = _delta_rows(probe[fmt], "spans")
    assert (rows[1]["i"], rows[3]["i"], rows[4]["i"]) == (37_091_106_789_000, 1, -1)
    assert (rows[5]["i"], rows[6]["i"]) == (2**63 - 1, -(2**63))  # beyond a long: Java's cast saturates
    assert json.loads(rows[1]["ts"]) == [43_201_500_000, None]
    config = probe[fmt]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("spans"), conn, pg_source)
    assert check.verification is not None and check.verification.expected_rows == 212 and not check.notes
    assert check.verification.examples == [
        "spans (id=3): column 'ts' expected '[0,86399999999]', got '[0, 86399999000]'"]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_years_beyond_delta_go_to_quarantine_and_verify_names_them(probe: dict[str, IngestConfig], fmt: str,
                                                                   pg_dsn: str) -> None:
    """A date or timestamp after year 9999 or before year 1 has no Delta value: the engine quarantines
    the change with its reason. verify compared nothing of such a table before (psycopg cannot load the
    value: "date too large"); it now reads the table, and names the quarantined message behind each row."""
    config = probe[fmt]
    rows = _delta_rows(config, "eras")
    assert list(rows) == [4]
    assert (rows[4]["d"].year, rows[4]["ts"].microsecond, rows[4]["tstz"].year) == (9999, 999_999, 1)
    held = quarantine.read(TablePaths.of(config, "eras").quarantine, table="eras").to_pylist()
    assert sorted(r["reason"].split(":")[0] for r in held) == ["date out of range", "timestamp out of range",
                                                               "timestamp out of range or malformed"]
    assert sorted(json.loads(r["row_key"])["id"] for r in held) == [1, 2, 3]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("eras"), conn, pg_source)
    assert check.error is None
    assert check.verification is not None and check.verification.expected_rows == 4
    assert (check.verification.missing, check.verification.different, check.verification.held) == (3, 0, 3), \
        check.verification.examples
    assert all("held in quarantine" in e for e in check.verification.examples), check.verification.examples
    beyond = [note for note in check.notes if "beyond the years 1 to 9999" in note]
    assert sorted(note.split(":")[0] for note in beyond) == ["column 'd'", "column 'ts'", "column 'tstz'"], check.notes


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_times_of_day_at_24_00_and_past_midnight_utc_equal_their_source(probe: dict[str, IngestConfig], fmt: str,
                                                                       pg_dsn: str) -> None:
    """verify selects a time as microseconds, so PostgreSQL's 24:00:00 is compared rather than failing
    the table, and a timetz whose offset takes it past midnight UTC wraps as Debezium's text does.
    Debezium's array path loses two things (docs/types.md), which verify reports: a time[] element
    24:00:00 arrives as 0, and a timetz[] element loses its fraction of a second."""
    rows = _delta_rows(probe[fmt], "clock")
    assert (rows[1]["t"], rows[1]["t3"], rows[1]["tz"]) == (86_400_000_000, 86_400_000_000, "00:00:00Z")
    assert (rows[2]["t3"], rows[2]["tz"], rows[3]["tz"]) == (86_399_999_000, "14:59:00Z", "12:00:00.5Z")
    assert json.loads(rows[1]["tza"]) == ["22:00:00Z"]
    config = probe[fmt]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("clock"), conn, pg_source)
    assert check.error is None and not check.notes
    assert check.verification is not None and check.verification.expected_rows == 4
    assert check.verification.examples == [
        "clock (id=1): column 'ta' expected '[86400000000,null]', got '[0, null]'",
        "clock (id=2): column 'tza' expected '[\"09:00:59.999999Z\", \"21:30:00Z\"]', "
        "got '[\"09:00:59Z\", \"21:30:00Z\"]'"]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_a_generated_column_is_not_published_and_verify_says_so(probe: dict[str, IngestConfig], fmt: str,
                                                                pg_dsn: str) -> None:
    """PostgreSQL's logical replication publishes no stored generated column before version 18, so the
    lake has none (docs/types.md). verify compared it, and found every row different ("the table
    lacks the column"); it now leaves it out and says why. An identity column is an ordinary one."""
    config = probe[fmt]
    rows = _delta_rows(config, "derived")
    assert {k: (r["qty"], r["n"]) for k, r in rows.items()} == {1: (5, 1), 2: (3, 2)}
    assert "total" not in rows[1]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("derived"), conn, pg_source)
    assert check.error is None and check.ok, (check.verification and check.verification.examples)
    assert check.notes == ["column 'total': a generated column, which PostgreSQL's logical replication does not "
                           "publish before version 18; not compared"]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_primary_key_updates_of_a_toasted_row_keep_its_value(probe: dict[str, IngestConfig], fmt: str,
                                                             pg_dsn: str) -> None:
    """Debezium sends the moved row with the placeholder and names the old key in a header; the
    engine takes the value from the old key's row, through two moves and an update (docs/types.md)."""
    rows = _delta_rows(probe[fmt], "toast_pk")
    assert list(rows) == [3]
    assert rows[3]["c_big"] == BIG2 and rows[3]["note"] == "k" and not rows[3]["_cdc_unknown_columns"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(probe[fmt], probe[fmt].table("toast_pk"), conn, pg_source)
    assert check.verification is not None and check.verification.ok, check.verification.examples
    assert check.verification.expected_rows == 1 and check.unknown_rows == 0


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_real_and_double_columns(probe: dict[str, IngestConfig], fmt: str) -> None:
    rows = _delta_rows(probe[fmt], "floats")
    types = {f.name: f.type.type for f in DeltaTable(str(probe[fmt].table_path("floats"))).schema().fields}
    documented = {r["probe column"]: r["Delta type"] for r in DOCUMENTED if r["probe column"] in FLOAT_COLUMNS}
    assert {c: types[c] for c in FLOAT_COLUMNS} == documented
    assert rows[1]["c_real"] == -1.5 and rows[1]["c_double"] == 1.0000000000000002
    assert rows[2]["c_real"] == float("inf") and rows[2]["c_double"] == float("-inf")
    assert rows[3]["c_real"] is None and rows[3]["c_double"] == -0.1


def test_workdirs_are_separate(probe: dict[str, IngestConfig]) -> None:
    assert probe["avro"].workdir != probe["json"].workdir
    assert all(Path(c.workdir).is_dir() for c in probe.values())


def test_debezium_sends_infinity_and_nan_as_the_engine_expects(probe: dict[str, IngestConfig]) -> None:
    """PostgreSQL's ±infinity as Debezium 3.6 sends it (ingest/decode/values.py reads these), NaN and
    ±Infinity numerics as null: if a Debezium upgrade changes them, this says so first."""
    after = {e["payload"]["after"]["id"]: e["payload"]["after"]
             for e in json_events(f"{PREFIX['json']}.{SCHEMA}.special")}
    columns = ("c_timestamp", "c_timestamp3", "c_timestamptz", "c_date", "c_numeric", "c_numeric_12_2")
    assert [tuple(after[n][c] for c in columns) for n in (1, 2)] == [
        (9_223_372_036_825_200_000, 9_223_372_036_825_200, "infinity", -2_147_472_692, None, None),
        (-9_223_372_036_832_400_000, -9_223_372_036_832_400, "-infinity", -2_147_472_691, None, "AJY="),  # 1.50
    ]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_infinity_is_the_latest_or_earliest_value_and_the_table_equals_its_source(
        probe: dict[str, IngestConfig], fmt: str, pg_dsn: str) -> None:
    """No row is quarantined for an infinite date or timestamp; verify reads the source the same way
    and names the numerics Debezium sent as null."""
    rows = _delta_rows(probe[fmt], "special")
    latest, earliest = datetime(9999, 12, 31, 23, 59, 59), datetime(1, 1, 1)
    columns = ("c_timestamp", "c_timestamp3", "c_timestamptz", "c_date", "c_numeric", "c_numeric_12_2")
    assert {n: tuple(r[c] for c in columns) for n, r in rows.items()} == {
        1: (latest, latest, latest.replace(tzinfo=UTC), latest.date(), None, None),
        2: (earliest, earliest, earliest.replace(tzinfo=UTC), earliest.date(), None, Decimal("1.50")),
        3: (datetime(2024, 2, 29, 12), datetime(2024, 2, 29, 12), datetime(2024, 2, 29, 12, tzinfo=UTC),
            date(2024, 2, 29), Decimal("2.5").quantize(Decimal("1e-18")), Decimal("2.50")),
    }
    config = probe[fmt]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("special"), conn, pg_source)
    assert check.error is None and check.verification is not None
    assert check.verification.ok and check.verification.expected_rows == 3, check.verification.examples
    assert sorted(n for n in check.notes if "Debezium sends it as null" in n) == [
        "column 'c_numeric': -Infinity has no Delta decimal, and Debezium sends it as null; compared as null",
        "column 'c_numeric': NaN has no Delta decimal, and Debezium sends it as null; compared as null",
        "column 'c_numeric_12_2': NaN has no Delta decimal, and Debezium sends it as null; compared as null",
    ]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_what_debezium_loses_in_an_array_verify_reports(probe: dict[str, IngestConfig], fmt: str,
                                                        pg_dsn: str) -> None:
    """Debezium sends a numeric[] holding NaN as null, a two-dimensional array as one null per row,
    an enum[] holding a null element as null, and a ``name`` column as null (docs/types.md): the
    engine writes what it is sent, and verify names each column."""
    after = json_events(f"{PREFIX['json']}.{SCHEMA}.lost")[0]["payload"]["after"]
    assert (after["nan_array"], after["matrix"], after["moods"], after["pg_name"]) == (None, [None, None], None, None)
    config = probe[fmt]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("lost"), conn, pg_source)
    assert check.verification is not None and not check.verification.ok
    assert check.verification.examples == [
        "lost (id=1): column 'nan_array' expected '[1.5,\"NaN\"]', got None; "
        "column 'matrix' expected '[[1, 2], [3, 4]]', got '[null, null]'; "
        "column 'moods' expected '[\"happy\",null]', got None; column 'pg_name' expected 'pg_name', got None"]


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_what_debezium_shifts_or_sends_out_of_range_in_an_array(probe: dict[str, IngestConfig], fmt: str,
                                                                 pg_dsn: str) -> None:
    """Debezium's array path reads a timestamp[] element before 1582-10-15 in the Julian calendar, and
    sends infinity in a date[] and -infinity in a timestamptz[] beyond any Delta range (docs/types.md):
    the first is written as sent and verify reports it, the others go to quarantine with their reason."""
    config = probe[fmt]
    assert {n: r["old_stamps"] for n, r in _delta_rows(config, "quirks").items()} == {1: '["1500-06-11T12:00:00"]'}
    held = quarantine.read(TablePaths.of(config, "quirks").quarantine, table="quirks").to_pylist()
    assert sorted(r["reason"].split(":")[0] for r in held) == ["date out of range",
                                                               "timestamp out of range or malformed"]
    # The quarantine names each held change's row from its Kafka key, and verify names the message
    # behind each difference it comes from.
    ids = {json.loads(r["row_key"])["id"]: f"{r['topic']}:{r['partition']}:{r['offset']}" for r in held}
    assert set(ids) == {2, 3}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        check = check_table(config, config.table("quirks"), conn, pg_source)
    assert check.verification is not None
    assert (check.verification.missing, check.verification.different) == (2, 1), check.verification.examples
    assert check.verification.held == 2
    missing = sorted(e for e in check.verification.examples if "missing" in e)
    assert len(missing) == 2, missing
    assert missing[0].startswith(f"quirks (id=2): missing; held in quarantine: {ids[2]} (decode: date out of range: ")
    assert missing[1].startswith(f"quirks (id=3): missing; held in quarantine: {ids[3]} "
                                 "(decode: timestamp out of range or malformed: "), missing
    assert "`ingest quarantine list -t quirks` shows them" in " ".join(check.notes)
