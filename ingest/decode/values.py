"""Wire values -> Python values of their Delta types: decimals, dates, times, timestamps, JSON text.

The converters a :class:`~ingest.decode.semantic.FieldPlan` holds; each takes one wire value (as
fastavro or JsonConverter gives it) and returns the value, or raises :class:`ConvertError` with the
reason.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import Context, Decimal, InvalidOperation
from typing import Any, Final

from ingest.decode import columns
from ingest.decode.columns import EPOCH, EPOCH_ORDINAL, EPOCH_UTC
from ingest.errors import DecodeError

Converter = Callable[[Any], Any]

MAX_PRECISION: Final = 38  # Delta's decimal limit
VARIABLE_SCALE: Final = 18  # VariableScaleDecimal lands in decimal(38,18)
MILLI, MICRO, NANO = "ms", "us", "ns"
_UNIT_TO_MICROS: Final = {MILLI: (1000, 1), MICRO: (1, 1), NANO: (1, 1000)}  # value * mul // div
# Wide enough that quantize/scaleb on a 38-digit value never rounds (the default context has 28).
_EXACT: Final = Context(prec=200)
#: What the engine writes for PostgreSQL's ``infinity`` and ``-infinity`` dates and timestamps: the
#: latest and the earliest values Delta holds, to the second, as Spark's own PostgreSQL reader does.
LATEST: Final = datetime(9999, 12, 31, 23, 59, 59)
EARLIEST: Final = datetime(1, 1, 1)
# How Debezium's PostgreSQL connector sends them (True: ``infinity``, False: ``-infinity``):
# timestamps as pgjdbc's DATE_POSITIVE_INFINITY and DATE_NEGATIVE_INFINITY read as microseconds or
# milliseconds; dates as the epoch days of its infinity dates, -5877611-06-21 in 3.6 (+5877611-06-21
# in later versions) and -5877611-06-22. All lie beyond any finite value PostgreSQL stores.
_INFINITE_TIMESTAMPS: Final = {
    MICRO: {9_223_372_036_825_200_000: True, -9_223_372_036_832_400_000: False},
    MILLI: {9_223_372_036_825_200: True, -9_223_372_036_832_400: False},
    NANO: {},
}
_INFINITE_DAYS: Final = {-2_147_472_692: True, 2_146_033_979: True, -2_147_472_691: False}
_INFINITE_TEXT: Final = {"infinity": True, "-infinity": False}  # ZonedTimestamp


class ConvertError(ValueError):
    """A wire value cannot become a value of its column type; the row loop adds the column name."""


def to_json(value: Any) -> str:
    """Canonical JSON text for a value with no Delta primitive (struct, array, map)."""
    return json.dumps(value, sort_keys=True, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, date | time):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def array_of(element: Converter) -> Converter:
    """An array of a semantic type as JSON text, each element converted as a column of its type is.

    Decimals are JSON numbers with their digits (``[1.50, null]``), dates and timestamps ISO 8601
    text with no trailing zeros in the fraction (``"2024-02-29T12:00:00.5+00:00"``): what PostgreSQL's
    own ``array_to_json`` prints for the same array.
    """

    def convert(value: Any) -> str:
        if type(value) is not list:
            raise ConvertError(f"expected an array, got {value!r}"[:200])
        return _json_array(value, element)

    return convert


def _json_array(values: list[Any], element: Converter) -> str:
    return "[" + ", ".join("null" if v is None else _json_array(v, element) if type(v) is list
                           else _json_element(element(v)) for v in values) + "]"


def _json_element(value: Any) -> str:
    if isinstance(value, Decimal):
        return str(value)  # a JSON number; Debezium sends no NaN or infinity (null instead)
    if isinstance(value, datetime):
        plain = value.replace(tzinfo=None).isoformat()
        text = plain.rstrip("0") if value.microsecond else plain
        return json.dumps(text + value.isoformat()[len(plain):])
    return json.dumps(value, default=_json_default)


def b64decode(value: str) -> bytes:
    """Strict base64 (JsonConverter's encoding of ``bytes``)."""
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ConvertError(f"invalid base64 {value[:40]!r}: {exc}") from exc


def _unscaled(value: Any) -> int:
    """Big-endian two's-complement unscaled integer from raw bytes or JsonConverter base64."""
    raw = b64decode(value) if type(value) is str else value
    return int.from_bytes(raw, "big", signed=True)


def decimal_type(params: Mapping[str, Any], name: str) -> tuple[str, Converter]:
    try:
        scale = int(params.get("scale", 0))
        declared = int(params.get("connect.decimal.precision", MAX_PRECISION))
    except (TypeError, ValueError) as exc:
        raise DecodeError(f"schema: column '{name}' has malformed decimal parameters {params!r}") from exc
    if not 0 <= scale <= MAX_PRECISION:
        raise DecodeError(f"schema: column '{name}' has decimal scale {scale}; Delta allows 0 to 38")
    # Delta needs scale <= precision <= 38. A wider source precision is capped: values that fit
    # still load, and values that do not are refused row by row (never rounded).
    precision = min(max(declared, scale), MAX_PRECISION)
    return f"decimal({precision},{scale})", _decimal_converter(precision, scale)


def _decimal_converter(precision: int, scale: int) -> Converter:
    limit = 10**precision

    def convert(value: Any) -> Decimal:
        if type(value) is bytes or type(value) is str:
            unscaled = _unscaled(value)
            if -limit < unscaled < limit:
                return Decimal(f"{unscaled}E-{scale}")  # exact: the constructor never rounds
            raise ConvertError(
                f"decimal overflow: {Decimal(unscaled).scaleb(-scale, _EXACT)} does not fit "
                f"decimal({precision},{scale})"
            )
        # Already a number: fastavro's own decimal logical type, or decimal.format=NUMERIC JSON.
        return fit_decimal(_as_decimal(value), precision, scale)

    if (column := columns.decimal(precision, scale)) is not None:
        columns.register(convert, column)
    return convert


def _as_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if type(value) is int:
        return Decimal(value)
    if type(value) is float:
        return Decimal(repr(value))  # the shortest text that round-trips, not the binary expansion
    raise ConvertError(f"expected a decimal, got {value!r}")


def fit_decimal(value: Decimal, precision: int, scale: int) -> Decimal:
    """Return ``value`` with exactly ``scale`` digits if it fits ``decimal(precision, scale)``.

    Raises:
        ConvertError: the value is not finite, needs more digits, or would have to be rounded.
    """
    if not value.is_finite():
        raise ConvertError(f"decimal overflow: {value} is not representable in decimal({precision},{scale})")
    try:
        exact = value.quantize(Decimal((0, (1,), -scale)), context=_EXACT)
    except InvalidOperation:
        exact = None
    if exact is None or exact != value or abs(exact) >= Decimal((0, (1,), precision - scale)):
        raise ConvertError(
            f"decimal overflow: {value} cannot be represented exactly in decimal({precision},{scale})"
        )
    return exact


def variable_scale_decimal(value: Any) -> Decimal:
    return fit_decimal(exact_variable_scale_decimal(value), MAX_PRECISION, VARIABLE_SCALE)


def exact_variable_scale_decimal(value: Any) -> Decimal:
    """A ``VariableScaleDecimal`` with the digits it was sent with (no column's scale applied)."""
    if isinstance(value, Decimal):
        return value
    if not isinstance(value, Mapping) or "value" not in value or "scale" not in value:
        raise ConvertError(f"expected a VariableScaleDecimal struct {{scale, value}}, got {value!r}")
    scale = value["scale"]
    if type(scale) is not int:
        raise ConvertError(f"VariableScaleDecimal scale is not an integer: {scale!r}")
    # Built from text so that no context precision can round it before the exactness check.
    return Decimal(f"{_unscaled(value['value'])}E{-scale}")


def to_date(value: Any) -> date:
    if type(value) is date:
        return value
    try:
        return date.fromordinal(EPOCH_ORDINAL + value)
    except (ValueError, OverflowError) as exc:
        if (latest := _INFINITE_DAYS.get(value)) is not None:
            return (LATEST if latest else EARLIEST).date()
        raise ConvertError(f"date out of range: {value!r} days since epoch") from exc


def _time_micros(unit: str) -> Converter:
    mul, div = _UNIT_TO_MICROS[unit]

    def convert(value: Any) -> int:
        if type(value) is int:
            return value * mul // div
        if isinstance(value, time):  # fastavro's time-millis/time-micros logical types
            return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        raise ConvertError(f"expected an integer time of day, got {value!r}")

    return convert


def _timestamp(unit: str, *, utc: bool) -> Converter:
    mul, div = _UNIT_TO_MICROS[unit]
    epoch = EPOCH_UTC if utc else EPOCH
    infinite = _INFINITE_TIMESTAMPS[unit]

    def convert(value: Any) -> datetime:
        if type(value) is int:
            try:
                # Floor division truncates nanoseconds towards the past, as Java's Instant.truncatedTo.
                return epoch + timedelta(0, 0, value * mul // div)
            except OverflowError as exc:
                if (latest := infinite.get(value)) is not None:
                    return _extreme(latest, utc=utc)
                raise ConvertError(f"timestamp out of range: {value!r} {unit} since epoch") from exc
        if isinstance(value, datetime):  # fastavro's timestamp logical types
            if utc:
                return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
        raise ConvertError(f"expected an integer timestamp, got {value!r}")

    return convert


def zoned_timestamp(value: Any) -> datetime:
    if type(value) is not str:
        raise ConvertError(f"expected an ISO-8601 timestamp, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
        # A ZonedTimestamp always carries an offset; a bare one is read as UTC rather than local time.
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        if (latest := _INFINITE_TEXT.get(value)) is not None:
            return _extreme(latest, utc=True)
        raise ConvertError(f"timestamp out of range or malformed: {value!r}") from exc


def _extreme(latest: bool, *, utc: bool) -> datetime:
    """:data:`LATEST` or :data:`EARLIEST`, in UTC or naive."""
    value = LATEST if latest else EARLIEST
    return value.replace(tzinfo=UTC) if utc else value


TIME_CONVERTERS: Final = {unit: _time_micros(unit) for unit in (MILLI, MICRO, NANO)}
LOCAL_CONVERTERS: Final = {unit: _timestamp(unit, utc=False) for unit in (MILLI, MICRO, NANO)}
UTC_CONVERTERS: Final = {unit: _timestamp(unit, utc=True) for unit in (MILLI, MICRO)}

# Their whole-column twins (see ingest.decode.columns).
for _unit, _convert in TIME_CONVERTERS.items():
    columns.register(_convert, columns.time_of_day(*_UNIT_TO_MICROS[_unit]))
for _unit, _convert in (*LOCAL_CONVERTERS.items(), *UTC_CONVERTERS.items()):
    columns.register(_convert, columns.timestamp(*_UNIT_TO_MICROS[_unit]))
columns.register(to_date, columns.days)
