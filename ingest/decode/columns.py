"""Whole-column twins of the per-value converters, for the decode step's fast path.

The fast path (:mod:`ingest.decode.columnar`) converts a schema's images column by column. A column
of plain values -- JSON integers, strings, booleans, numbers; integer dates, times and timestamps;
decimals as bytes or base64 text -- is converted here in one go with Arrow instead of value by
value in Python (a timestamp or a decimal became a Python object before Arrow copied it again).

A twin gives exactly what the per-value converter gives (its Arrow array of those values), or
raises: on any value it is not sure of, the caller converts the column value by value, and that
path has the final word, errors included. So a twin only takes columns whose values all have the
one Python type it handles; a bool, a float or a string among integers sends the column back.
"""

from __future__ import annotations

import binascii
import weakref
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

ColumnConverter = Callable[[Sequence[Any], pa.DataType], pa.Array]
_NONE: Final = type(None)
#: The Unix epoch, naive and in UTC, and as a ``date`` ordinal: what Debezium counts times and dates from.
EPOCH: Final = datetime(1970, 1, 1)
EPOCH_UTC: Final = EPOCH.replace(tzinfo=UTC)
EPOCH_ORDINAL: Final = EPOCH.toordinal()
#: Days since the epoch that Python's ``date`` holds (the per-value converter refuses the rest).
_DAYS: Final = (date.min.toordinal() - EPOCH_ORDINAL, date.max.toordinal() - EPOCH_ORDINAL)
#: Microseconds since the epoch that Python's ``datetime`` holds.
_MICROS: Final = tuple((d - EPOCH) // timedelta(microseconds=1) for d in (datetime.min, datetime.max))
#: Decimals whose unscaled value fits 64 bits are built by Arrow; wider ones value by value.
_MAX_INT64_PRECISION: Final = 18

_TWINS: weakref.WeakKeyDictionary[Callable[[Any], Any], ColumnConverter] = weakref.WeakKeyDictionary()


class NotSure(ValueError):
    """The column holds a value its twin does not take: convert it value by value."""


def twin_of(convert: Callable[[Any], Any] | None) -> ColumnConverter | None:
    """The whole-column twin of a per-value converter (``None``: values as they are), if it has one."""
    return None if convert is None else _TWINS.get(convert)


def register(convert: Callable[[Any], Any], column: ColumnConverter) -> None:
    """Make ``column`` the twin of ``convert`` (the converter modules call this as they build them)."""
    _TWINS[convert] = column


def _only(values: Sequence[Any], kind: type) -> None:
    """Every value is ``None`` or exactly of type ``kind`` (not a subclass: ``True`` is no integer)."""
    if not set(map(type, values)) <= {kind, _NONE}:
        raise NotSure(f"not all {kind.__name__}")


def plain(kind: type) -> ColumnConverter:
    """A JSON primitive checked by its exact Python type; Arrow refuses what does not fit the column."""

    def column(values: Sequence[Any], arrow: pa.DataType) -> pa.Array:
        _only(values, kind)
        return pa.array(values, arrow)

    return column


def number(values: Sequence[Any], arrow: pa.DataType) -> pa.Array:
    """A JSON float column: floats and integers (the per-value converter takes both)."""
    if not set(map(type, values)) <= {float, int, _NONE}:
        raise NotSure("not all numbers")
    return pa.array([float(v) if type(v) is int else v for v in values], arrow)


def _integers(values: Sequence[Any]) -> pa.Array:
    _only(values, int)
    return pa.array(values, pa.int64())  # a value beyond 64 bits raises


def _in_range(numbers: pa.Array, low: int, high: int) -> None:
    bounds = pc.min_max(numbers)
    if bounds["min"].is_valid and (bounds["min"].as_py() < low or bounds["max"].as_py() > high):
        raise NotSure("out of range")


def _to_micros(numbers: pa.Array, mul: int, div: int) -> pa.Array:
    """``value * mul // div`` with floor division, as the per-value converters compute it."""
    if mul != 1:
        numbers = pc.multiply_checked(numbers, mul)
    if div != 1:
        # Arrow's integer division truncates towards zero; floor is wanted for negatives.
        shifted = pc.if_else(pc.less(numbers, 0), pc.subtract_checked(numbers, div - 1), numbers)
        numbers = pc.divide(shifted, div)
    return numbers


def timestamp(mul: int, div: int) -> ColumnConverter:
    """Integer timestamps in some unit -> microseconds since the epoch, as Python's ``datetime`` holds them."""

    def column(values: Sequence[Any], arrow: pa.DataType) -> pa.Array:
        micros = _to_micros(_integers(values), mul, div)
        _in_range(micros, *_MICROS)
        return micros.cast(arrow)

    return column


def time_of_day(mul: int, div: int) -> ColumnConverter:
    """Integer times of day in some unit -> microseconds since midnight (a ``long`` column)."""

    def column(values: Sequence[Any], arrow: pa.DataType) -> pa.Array:
        return _to_micros(_integers(values), mul, div).cast(arrow)

    return column


def days(values: Sequence[Any], arrow: pa.DataType) -> pa.Array:
    """Integer days since the epoch -> dates."""
    numbers = _integers(values)
    _in_range(numbers, *_DAYS)
    return numbers.cast(pa.int32()).cast(arrow)


def decimal(precision: int, scale: int) -> ColumnConverter | None:
    """Unscaled big-endian two's-complement integers (bytes, or base64 text in JSON) -> ``decimal(p, s)``.

    Only up to 18 digits: the unscaled value then fits 64 bits; it becomes a 128-bit ``decimal(38, 0)``,
    and the same 128 bits read with scale ``s`` are the decimal.
    """
    if precision > _MAX_INT64_PRECISION:
        return None

    def column(values: Sequence[Any], arrow: pa.DataType) -> pa.Array:
        kinds = set(map(type, values)) - {_NONE}
        raw: Sequence[Any]
        if kinds == {str}:
            try:  # strict: takes no text that base64.b64decode(validate=True) refuses
                raw = [None if v is None else binascii.a2b_base64(v, strict_mode=True) for v in values]
            except (binascii.Error, ValueError) as exc:
                raise NotSure("invalid base64") from exc
        elif kinds <= {bytes}:
            raw = values
        else:
            raise NotSure("not all bytes or base64 text")
        unscaled = pa.array([None if b is None else int.from_bytes(b, "big", signed=True) for b in raw], pa.int64())
        widest = pc.max(pc.abs_checked(unscaled))
        if widest.is_valid and widest.as_py() >= 10**precision:
            raise NotSure("more digits than the column's precision")
        whole = unscaled.cast(pa.decimal128(38, 0))
        return pa.Array.from_buffers(arrow, len(whole), whole.buffers(), whole.null_count, whole.offset)

    return column
