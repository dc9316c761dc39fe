"""MariaDB/MySQL column plans: the engine's type of each column and the value read back from the source."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from ingest.config import DebeziumModes
from ingest.verify.mysql_source import column_plan, describe
from ingest.verify.source_values import NotRepresentable, parse_json


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


def test_other_handling_modes_read_the_source_as_the_connector_sends_it() -> None:
    """docs/types-mysql.md#other-handling-modes, as seen on the stack (tests/stack/test_connector_modes.py)."""
    text = DebeziumModes.model_validate({"decimal.handling.mode": "string", "time.precision.mode": "connect",
                                         "binary.handling.mode": "base64-url-safe"})
    number = column_plan("n", "decimal", "decimal(12,2)", 12, 2, modes=text)
    assert number.arrow == pa.string() and number.convert is not None and number.convert(Decimal("-0.01")) == "-0.01"
    blob = column_plan("b", "varbinary", "varbinary(10)", None, None, modes=text)
    assert blob.arrow == pa.string() and blob.convert is not None and blob.convert(b"\xfb\xff") == "-_8="
    clock = column_plan("t", "time", "time(6)", None, None, modes=text)
    assert clock.convert is not None and clock.convert(timedelta(seconds=1, microseconds=999)) == 1_000_000
    for outside in (timedelta(hours=25), -timedelta(microseconds=500)):  # no time of day: Debezium sends null
        with pytest.raises(NotRepresentable, match="no time of day"):
            clock.convert(outside)
    moment = column_plan("d", "datetime", "datetime(6)", None, None, False, None, modes=text)
    assert moment.arrow == pa.timestamp("us", tz="UTC") and moment.convert is not None
    assert moment.convert(datetime(2024, 1, 2, 3, 4, 5, 678901)) == datetime(2024, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert moment.convert("0000-00-00 00:00:00") == datetime(1970, 1, 1, tzinfo=UTC)  # a zero date: the epoch
    double = column_plan("n", "decimal", "decimal(12,2)", 12, 2,
                         modes=DebeziumModes.model_validate({"decimal.handling.mode": "double"}))
    assert double.arrow == pa.float64() and double.convert is not None and double.convert(Decimal("1.10")) == 1.1
