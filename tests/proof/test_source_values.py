"""Source values in the engine's representation (no database needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest
from psycopg.adapt import AdaptersMap
from psycopg.pq import Format

from ingest.config import DebeziumModes
from ingest.verify import pg_source
from ingest.verify.pg_source import column_plan
from ingest.verify.source_values import NotRepresentable, parse_json, zoned_time


def _typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


@pytest.mark.parametrize(("utc_micros", "text"), [
    (66_599_999_999, "18:29:59.999999Z"),  # 23:59:59.999999+05:30
    (115_200_000_000, "08:00:00Z"),  # 24:00:00-08: beyond the day
    (43_200_500_000, "12:00:00.5Z"),
    (-3_600_000_000, "23:00:00Z"),  # 01:00+02: before the day
    (86_400_000_000, "00:00:00Z"),  # 24:00:00+00
])
def test_timetz_as_debezium_zoned_time(utc_micros: int, text: str) -> None:
    assert zoned_time(utc_micros) == text


def test_json_compares_parsed_not_as_text() -> None:
    assert parse_json('{"b": [1, 2.50], "a": null}') == parse_json('{"a":null,"b":[1,2.5]}')
    assert parse_json('{"a": 1}') != parse_json('{"a": true}')
    assert parse_json('{"a": 1}') != parse_json('{"a": 2}')
    assert parse_json("not json") == "not json"


def test_numeric_columns_take_the_engines_decimal_types() -> None:
    fixed = column_plan("n", "numeric(12,2)", "numeric", "b", _typmod(12, 2), None)
    assert fixed.arrow == pa.decimal128(12, 2)
    assert fixed.convert is not None and fixed.convert(Decimal("-1.5")) == Decimal("-1.50")
    plain = column_plan("n", "numeric", "numeric", "b", -1, None)
    assert plain.arrow == pa.decimal128(38, 18)
    with pytest.raises(NotRepresentable):
        plain.convert(Decimal("1e-19"))  # type: ignore[misc]
    assert column_plan("n", "numeric(50,2)", "numeric", "b", _typmod(50, 2), None).arrow == pa.decimal128(38, 2)


def test_types_and_their_representation() -> None:
    assert column_plan("t", "time", "time", "b", -1, None).arrow == pa.int64()
    assert column_plan("t", "timestamptz", "timestamptz", "b", -1, None).arrow == pa.timestamp("us", tz="UTC")
    assert column_plan("t", "timestamp", "timestamp", "b", -1, None).arrow == pa.timestamp("us")
    assert column_plan("e", "mood", "mood", "e", -1, None).arrow == pa.string()
    array = column_plan("a", "text[]", "_text", "b", -1, "text")
    assert array.arrow == pa.string() and array.convert is not None
    assert array.convert(["a", None, "ü"]) == '["a", null, "\\u00fc"]'
    assert column_plan("j", "jsonb", "jsonb", "b", -1, None).normalize is parse_json


def test_more_types_as_debezium_sends_them() -> None:
    """The values docs/types.md documents, as tests/stack/test_types.py saw Debezium send them."""
    bits = column_plan("b", "bit(10)", "bit", "b", 10, None)
    assert bits.arrow == pa.binary() and bits.convert is not None
    assert [bits.convert(t) for t in ("1000000001", "0000000000", "10000000000000000001")] == [
        b"\x01\x02", b"", b"\x01\x00\x08"]  # Java's BitSet bytes: least significant first, none above
    assert column_plan("b", "bit(1)", "bit", "b", 1, None).arrow == pa.bool_()
    money = column_plan("m", "money", "money", "b", -1, None)
    assert money.arrow == pa.decimal128(38, 2) and money.convert is not None
    assert money.convert(Decimal("-92233720368547758.08")) == Decimal("-92233720368547758.08")
    assert column_plan("o", "oid", "oid", "b", -1, None).arrow == pa.int64()
    assert column_plan("h", "hstore", "hstore", "b", -1, None).normalize is parse_json
    enums = column_plan("a", "mood[]", "_mood", "b", -1, "mood", "e")
    assert enums.arrow == pa.string() and enums.normalize is parse_json
    assert column_plan("a", "mood[]", "_mood", "b", -1, "mood").arrow is None  # an element kind not known


def test_unknown_types_are_not_compared_and_say_so() -> None:
    plan = column_plan("b", "box", "box", "b", -1, None)
    assert plan.arrow is None and plan.note is not None and "box" in plan.note


def test_an_interval_is_the_microseconds_debezium_computes() -> None:
    """Fields as verify selects them: months, days, hours, minutes, microseconds of the seconds field.
    The figures are what Debezium 3.6 sent on the stack (tests/stack/test_types.py)."""
    plan = column_plan("i", "interval", "interval", "b", -1, None)
    assert plan.arrow == pa.int64() and plan.convert is not None
    assert plan.convert([14, 3, 4, 5, 6_789_000]) == 37_091_106_789_000  # 1 year 2 mons 3 days 04:05:06.789
    assert plan.convert([0, -3, 0, 0, 0]) == -259_200_000_000
    assert plan.convert([0, 0, 0, 0, -1]) == -1
    assert plan.convert([1, 0, 0, 0, -1_000_000]) == 2_629_799_000_000  # 1 mon -1 sec: 30.4375 days
    assert plan.convert([0, 7, 0, 0, 300_000]) == 604_800_300_000  # 0.3 s through a double, still exact
    assert plan.convert([178_000_000 * 12, 0, 0, 0, 0]) == 2**63 - 1  # Java's cast saturates
    assert plan.convert([-178_000_000 * 12, 0, 0, 0, 0]) == -(2**63)


def test_a_tstzrange_compares_its_instants_in_any_zone() -> None:
    plan = column_plan("r", "tstzrange", "tstzrange", "r", -1, None)
    assert plan.arrow == pa.string() and plan.normalize is not None
    same = plan.normalize('["2024-01-01 00:00:00+05:30","2024-06-01 20:00:00.5+00")')
    assert same == plan.normalize('["2023-12-31 18:30:00+00","2024-06-01 12:00:00.5-08")')
    assert same != plan.normalize('("2023-12-31 18:30:00+00","2024-06-01 12:00:00.5-08")')  # bounds kept
    assert plan.normalize("(,)") == ("(", None, None, ")")
    assert plan.normalize("[-infinity,infinity]") == ("[", "-infinity", "infinity", "]")
    assert plan.normalize("empty") == "empty"
    assert plan.normalize('["0044-03-15 00:00:00+00 BC",)') == '["0044-03-15 00:00:00+00 BC",)'  # as text


def test_a_point_and_a_time_array_as_the_engine_writes_them() -> None:
    point = column_plan("p", "point", "point", "b", -1, None)
    assert point.convert is not None and point.normalize is parse_json
    assert json.loads(point.convert([1.5, -2.0])) == {"x": 1.5, "y": -2.0, "srid": None,
                                                      "wkb": "AQEAAAAAAAAAAAD4PwAAAAAAAADA"}  # as Debezium sent
    times = column_plan("t", "time without time zone[]", "_time", "b", -1, "time", "b")
    assert times.convert is None and times.normalize is parse_json  # selected as microseconds (24:00:00 too)
    zoned = column_plan("z", "time with time zone[]", "_timetz", "b", -1, "timetz", "b")
    assert zoned.convert is not None and zoned.normalize is parse_json
    assert json.loads(zoned.convert("[43201500000, -3600000000, null]")) == ["12:00:01.5Z", "23:00:00Z", None]


@pytest.mark.parametrize(("typname", "text", "within"), [
    ("date", b"2024-02-29", True), ("date", b"10000-01-01", False), ("date", b"0001-12-31 BC", False),
    ("timestamp", b"9999-12-31 23:59:59.999999", True), ("timestamp", b"0044-03-15 12:00:00 BC", False),
    ("timestamptz", b"2024-02-29 12:00:00.5+00", True), ("timestamptz", b"294276-12-31 23:59:59+00", False),
])
def test_a_date_or_timestamp_beyond_python_is_named_not_a_failed_read(typname: str, text: bytes,
                                                                      within: bool) -> None:
    """psycopg cannot load a PostgreSQL date after year 9999 or before year 1 and would fail the whole
    table's read; verify loads it as its text and compares it as null, saying why (the engine
    quarantines such a change)."""
    adapters = AdaptersMap(psycopg.adapters)
    pg_source._load_beyond_python(adapters)
    oid = adapters.types[typname].oid
    loader = adapters.get_loader(oid, Format.TEXT)
    assert loader is not None
    value = loader(oid, None).load(text)
    convert = column_plan("c", typname, typname, "b", -1, None).convert
    assert convert is not None
    if within:
        assert convert(value).year <= 9999
    else:
        with pytest.raises(NotRepresentable, match="beyond the years 1 to 9999"):
            convert(value)


def test_other_handling_modes_read_the_source_as_the_connector_sends_it() -> None:
    """docs/types.md#other-handling-modes: the values seen on the stack (tests/stack/test_connector_modes.py)."""
    text = DebeziumModes.model_validate({"decimal.handling.mode": "string", "time.precision.mode": "connect",
                                         "binary.handling.mode": "hex", "interval.handling.mode": "string"})
    number = column_plan("n", "numeric", "numeric", "numeric", -1, None, modes=text)
    assert number.arrow == pa.string() and number.convert is not None
    assert [number.convert(Decimal(v)) for v in ("12.50", "1E-20", "NaN", "Infinity", "-Infinity")] == [
        "12.50", "0.00000000000000000001", "NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY"]
    interval = column_plan("i", "interval", "interval", "b", -1, None, modes=text)
    assert interval.arrow == pa.string() and interval.convert is not None
    assert [interval.convert(f) for f in ([0, 1, 2, 3, 4_500_000], [-25, 0, 0, 0, -1_500_000], [0, 0, 0, 5, 0],
                                          [0, 0, 0, 0, 4_100_000])] == [
        "P0Y0M1DT2H3M4.5S", "P-2Y-1M0DT0H0M-1.5S", "P0Y0M0DT0H5M0S", "P0Y0M0DT0H0M4.1S"]
    clock = column_plan("t", "time", "time", "b", -1, None, modes=text)
    assert clock.convert is not None and clock.convert(47_655_123_456) == 47_655_123_000
    stamp = column_plan("s", "timestamp", "timestamp", "b", -1, None, modes=text)
    assert stamp.arrow == pa.timestamp("us", tz="UTC") and stamp.convert is not None
    assert stamp.convert(datetime(1969, 12, 31, 23, 59, 59, 999999)) == datetime(1969, 12, 31, 23, 59, 59, 999000,
                                                                                tzinfo=UTC)
    binary = column_plan("b", "bytea", "bytea", "b", -1, None, modes=text)
    assert binary.arrow == pa.string() and binary.convert is not None and binary.convert(b"\x00\xff\x10") == "00ff10"

    double = DebeziumModes.model_validate({"decimal.handling.mode": "double", "binary.handling.mode": "base64"})
    money = column_plan("m", "money", "money", "b", -1, None, modes=double)
    assert money.arrow == pa.float64() and money.convert is not None and money.convert(Decimal("9.99")) == 9.99
    assert money.normalize is not None and money.normalize(float("nan")) == money.normalize(float("nan"))
    binary = column_plan("b", "bytea", "bytea", "b", -1, None, modes=double)
    assert binary.convert is not None and binary.convert(b"\x00\xff\x10") == "AP8Q"
    assert column_plan("t", "time", "time", "b", -1, None, modes=double).convert is None  # microseconds, as adaptive
