"""MariaDB/MySQL column plans: the engine's type of each column and the value read back from the source."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa

from ingest.verify.mysql_source import column_plan, describe
from ingest.verify.source_values import parse_json


def test_integer_widths_follow_debeziums_mapping() -> None:
    assert column_plan("a", "tinyint", "tinyint(1)", 3, 0).arrow == pa.int16()
    assert column_plan("a", "smallint", "smallint(5) unsigned", 5, 0).arrow == pa.int32()
    assert column_plan("a", "int", "int(10) unsigned", 10, 0).arrow == pa.int64()
    assert column_plan("a", "int", "int(11)", 10, 0).arrow == pa.int32()
    assert column_plan("a", "bigint", "bigint(20) unsigned", 20, 0).arrow == pa.decimal128(20, 0)
    assert column_plan("a", "year", "year(4)", None, None).arrow == pa.int32()


def test_values_become_the_engines() -> None:
    bits = column_plan("b", "bit", "bit(10)", 10, None)
    assert bits.arrow == pa.binary() and bits.convert is not None and bits.convert(b"\x02\xaa") == b"\xaa\x02"
    flag = column_plan("b", "bit", "bit(1)", 1, None)
    assert flag.arrow == pa.bool_() and flag.convert is not None and flag.convert(b"\x01") is True
    time_ = column_plan("t", "time", "time(6)", None, None)
    assert time_.convert is not None and time_.convert(-timedelta(hours=12, minutes=34, seconds=56,
                                                                  microseconds=123456)) == -45296123456
    stamp = column_plan("ts", "timestamp", "timestamp(6)", None, None)
    assert stamp.arrow == pa.timestamp("us", tz="UTC") and stamp.convert is not None
    assert stamp.convert(datetime(2024, 6, 1, 6, 30)) == datetime(2024, 6, 1, 6, 30, tzinfo=UTC)
    money = column_plan("m", "decimal", "decimal(12,3)", 12, 3)
    assert money.arrow == pa.decimal128(12, 3) and money.convert is not None
    assert money.convert(Decimal("1.5")) == Decimal("1.500")
    assert column_plan("j", "json", "json", None, None).normalize is not None


def test_an_unknown_type_is_named_not_compared() -> None:
    plan = column_plan("v", "vector", "vector(3)", None, None)
    assert plan.arrow is None and plan.note is not None and "vector" in plan.note


def test_a_spatial_value_is_debeziums_struct_of_its_stored_bytes() -> None:
    """The stored value, as the binlog has it: a little-endian SRID, then the WKB (here POINT(10 20)
    with SRID 4326, as MariaDB returned it on the stack)."""
    stored = (4326).to_bytes(4, "little") + b"\x01\x01\x00\x00\x00" + struct.pack("<dd", 10.0, 20.0)
    point = column_plan("p", "point", "point", None, None)
    assert point.arrow == pa.string() and point.convert is not None and point.normalize is parse_json
    assert json.loads(point.convert(stored)) == {"x": 10.0, "y": 20.0, "srid": 4326,
                                                 "wkb": "AQEAAAAAAAAAAAAkQAAAAAAAADRA"}  # as Debezium sent it
    shape = column_plan("g", "geometry", "geometry", None, None)
    assert shape.convert is not None
    assert json.loads(shape.convert(bytes(4) + stored[4:])) == {"srid": None, "wkb": "AQEAAAAAAAAAAAAkQAAAAAAAADRA"}


def test_describe_hides_the_password() -> None:
    assert describe("mysql://cdc:s3cret@127.0.0.1:3307/shop") == "127.0.0.1:3307/shop"
