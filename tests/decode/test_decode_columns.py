"""The whole-column twins give what the per-value converters give, or refuse the column.

Each case draws columns of values -- plain ones, nulls, boundary values, and values of the wrong
type or out of range -- and converts them both ways: value by value (the per-value converter,
then Arrow) and with the twin. Where the per-value converter takes every value, the twin must give
the same array or refuse; where it refuses one, the twin must refuse too.
"""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.decode import columns
from ingest.decode.jsonconv import _PRIMITIVE_CHECKS
from ingest.decode.parts import arrow_type_of
from ingest.decode.values import LOCAL_CONVERTERS, TIME_CONVERTERS, UTC_CONVERTERS, decimal_type, to_date

INT64 = (-(2**63), 2**63 - 1)


def _both(convert: Any, values: list[Any], arrow: pa.DataType) -> tuple[pa.Array | None, pa.Array | None]:
    """``(per-value result or None if it refused, twin result or None if it refused)``."""
    try:
        expected = pa.array([None if v is None else convert(v) for v in values], arrow)
    except Exception:
        expected = None
    twin = columns.twin_of(convert)
    assert twin is not None
    try:
        got = twin(values, arrow)
    except Exception:
        got = None
    return expected, got


def _agree(convert: Any, values: list[Any], arrow: pa.DataType) -> None:
    expected, got = _both(convert, values, arrow)
    if expected is None:
        assert got is None, f"the twin took {values!r}, which the per-value converter refuses"
    elif got is not None:
        assert got.type == expected.type and got.equals(expected), (values, got, expected)


def _column(values: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(st.one_of(st.none(), values), max_size=30)


ODD = st.one_of(st.booleans(), st.floats(allow_nan=False), st.text(max_size=3), st.binary(max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["int8", "int16", "int32", "int64"]),
       _column(st.one_of(st.integers(*INT64), st.integers(-(2**70), 2**70), ODD)))
def test_json_integers(base: str, values: list[Any]) -> None:
    _agree(_PRIMITIVE_CHECKS[base], values, arrow_type_of({"int8": "byte", "int16": "short", "int32": "integer",
                                                           "int64": "long"}[base]))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["float32", "float64"]),
       _column(st.one_of(st.floats(), st.integers(-(2**60), 2**60), st.sampled_from(["NaN", "Infinity"]), ODD)))
def test_json_numbers(base: str, values: list[Any]) -> None:
    expected, got = _both(_PRIMITIVE_CHECKS[base], values, arrow_type_of("float" if base == "float32" else "double"))
    if expected is None:
        assert got is None
    elif got is not None:  # NaN is not equal to itself: compare the values' text
        assert [repr(v) for v in got.to_pylist()] == [repr(v) for v in expected.to_pylist()]


@settings(max_examples=100, deadline=None)
@given(_column(st.one_of(st.text(max_size=8), ODD)), _column(st.one_of(st.booleans(), ODD)))
def test_json_strings_and_booleans(texts: list[Any], flags: list[Any]) -> None:
    _agree(_PRIMITIVE_CHECKS["string"], texts, pa.string())
    _agree(_PRIMITIVE_CHECKS["boolean"], flags, pa.bool_())


MICROS = (-62135596800000000, 253402300799999999)  # what Python's datetime holds


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["ms", "us", "ns"]), st.booleans(),
       _column(st.one_of(st.integers(MICROS[0] // 1000 - 5, MICROS[1] // 1000 + 5),
                         st.integers(MICROS[0] - 5, MICROS[1] + 5), st.integers(-(10**6), 10**6),
                         st.integers(*INT64), ODD)))
def test_timestamps_and_times(unit: str, utc: bool, values: list[Any]) -> None:
    if utc and unit in UTC_CONVERTERS:
        _agree(UTC_CONVERTERS[unit], values, arrow_type_of("timestamp"))
    _agree(LOCAL_CONVERTERS[unit], values, arrow_type_of("timestamp_ntz"))
    _agree(TIME_CONVERTERS[unit], values, arrow_type_of("long"))


@settings(max_examples=150, deadline=None)
@given(_column(st.one_of(st.integers(-719_170, 2_932_900), st.integers(*INT64), ODD)))
def test_dates(values: list[Any]) -> None:
    _agree(to_date, values, arrow_type_of("date"))


def _unscaled_bytes(n: int) -> bytes:
    return n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20), st.integers(0, 6), st.booleans(),
       _column(st.one_of(st.integers(-(10**20), 10**20), st.integers(-999, 999))), st.booleans())
def test_decimals_from_bytes_and_base64(precision: int, scale: int, json: bool, unscaled: list[Any],
                                        bad: bool) -> None:
    scale = min(scale, precision)
    type_name, convert = decimal_type({"scale": scale, "connect.decimal.precision": precision}, "d")
    values: list[Any] = [None if n is None else _unscaled_bytes(n) for n in unscaled]
    if json:
        values = [None if v is None else base64.b64encode(v).decode() for v in values]
    if bad and values:
        values[0] = "not base64!" if json else 12
    twin = columns.twin_of(convert)
    if precision > 18:
        assert twin is None  # wider decimals stay value by value
        return
    _agree(convert, values, arrow_type_of(type_name))


def test_a_twin_is_really_used_for_plain_columns() -> None:
    # Guards the cases above against vacuity: the twins take ordinary columns.
    values = [1_700_000_000_000_000, None, -1]
    got = columns.twin_of(LOCAL_CONVERTERS["us"])(values, arrow_type_of("timestamp_ntz"))  # type: ignore[misc]
    assert got.to_pylist() == pa.array([None if v is None else LOCAL_CONVERTERS["us"](v) for v in values],
                                       arrow_type_of("timestamp_ntz")).to_pylist()
    _, convert = decimal_type({"scale": 2, "connect.decimal.precision": 10}, "d")
    got = columns.twin_of(convert)([_unscaled_bytes(-12345), None], arrow_type_of("decimal(10,2)"))  # type: ignore[misc]
    assert [str(v) if v is not None else None for v in got.to_pylist()] == ["-123.45", None]
    with pytest.raises(columns.NotSure):
        columns.twin_of(_PRIMITIVE_CHECKS["int32"])([1, True], pa.int32())  # type: ignore[misc]
