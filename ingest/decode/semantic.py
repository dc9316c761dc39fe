"""Kafka Connect / Debezium semantic types -> Delta column types and Python values.

Both wire formats describe a column the same way once their schema is read: a Connect base type
(``int32``, ``bytes``, ``struct`` ...), an optional semantic name (``io.debezium.time.MicroTimestamp``,
``org.apache.kafka.connect.data.Decimal`` ... or an Avro ``logicalType``) and its parameters. This
module turns that description into a :class:`FieldPlan` once per schema: the Delta type, and a
converter from the wire value to the Python value of that type. Converting a row is then a loop over
ready-made plans, with no schema inspection per message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import Context, Decimal, InvalidOperation
from typing import Any, Final, Literal, NamedTuple

from ingest.errors import DecodeError
from ingest.events import UNAVAILABLE, ColumnSpec

Wire = Literal["avro", "json"]
Converter = Callable[[Any], Any]

UNAVAILABLE_MARKER: Final = "__debezium_unavailable_value"
_MARKER_BYTES: Final = UNAVAILABLE_MARKER.encode()
_MARKER_B64: Final = base64.b64encode(_MARKER_BYTES).decode("ascii")
# Debezium's uuid-array placeholder is Java's UUID.nameUUIDFromBytes(marker): MD5 with v3 bits set.
_MARKER_UUID: Final = str(uuid.UUID(bytes=hashlib.md5(_MARKER_BYTES, usedforsecurity=False).digest(),
                                     version=3))
# What PostgreSQL's connector sends for an unchanged TOASTed array / hstore (UnchangedToastedPlaceholder).
_ARRAY_MARKERS: Final = (
    [UNAVAILABLE_MARKER], [_MARKER_BYTES], [_MARKER_B64], list(_MARKER_BYTES), [_MARKER_UUID],
)
_MAP_MARKER: Final = {UNAVAILABLE_MARKER: UNAVAILABLE_MARKER}

DECIMAL: Final = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL: Final = "io.debezium.data.VariableScaleDecimal"
ZONED_TIMESTAMP: Final = "io.debezium.time.ZonedTimestamp"
MAX_PRECISION: Final = 38  # Delta's decimal limit
VARIABLE_SCALE: Final = 18  # VariableScaleDecimal lands in decimal(38,18)

_MILLI, _MICRO, _NANO = "ms", "us", "ns"
_UNIT_TO_MICROS: Final = {_MILLI: (1000, 1), _MICRO: (1, 1), _NANO: (1, 1000)}  # value * mul // div
_DATES: Final = frozenset({"io.debezium.time.Date", "org.apache.kafka.connect.data.Date", "date"})
_TIMES: Final = {
    "io.debezium.time.Time": _MILLI, "org.apache.kafka.connect.data.Time": _MILLI, "time-millis": _MILLI,
    "io.debezium.time.MicroTime": _MICRO, "time-micros": _MICRO, "io.debezium.time.NanoTime": _NANO,
}
_LOCAL_TIMESTAMPS: Final = {
    "io.debezium.time.Timestamp": _MILLI, "io.debezium.time.MicroTimestamp": _MICRO,
    "io.debezium.time.NanoTimestamp": _NANO,
    "local-timestamp-millis": _MILLI, "local-timestamp-micros": _MICRO,
}
_UTC_TIMESTAMPS: Final = {
    "org.apache.kafka.connect.data.Timestamp": _MILLI, "timestamp-millis": _MILLI, "timestamp-micros": _MICRO,
}
_INTEGERS: Final = frozenset({"int8", "int16", "int32", "int64"})

_BASE_TYPES: Final = {
    "int8": "byte", "int16": "short", "int32": "integer", "int64": "long", "float32": "float",
    "float64": "double", "boolean": "boolean", "string": "string", "bytes": "binary",
}
#: Connect base types that have no Delta primitive: carried as canonical JSON text.
COMPOSITE_TYPES: Final = frozenset({"struct", "array", "map", "union", "null"})

_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_EPOCH_NAIVE: Final = datetime(1970, 1, 1)
_EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Wide enough that quantize/scaleb on a 38-digit value never rounds (the default context has 28).
_EXACT: Final = Context(prec=200)
_NO_UNAVAILABLE: Final[frozenset[str]] = frozenset()


class ConvertError(ValueError):
    """A wire value cannot become a value of its column type; the row loop adds the column name."""


class FieldPlan(NamedTuple):
    """How one column is read: name, converter (``None`` = use as is), TOAST placeholders, spec."""

    name: str
    convert: Converter | None
    toast: tuple[Any, ...]
    spec: ColumnSpec


def field_plan(
    name: str, *, base: str, semantic: str | None, params: Mapping[str, Any], nullable: bool, wire: Wire,
    check: Converter | None = None,
) -> FieldPlan:
    """Build the plan of one column from its Connect description.

    Args:
        name: column name.
        base: Connect base type (``int8`` .. ``int64``, ``float32``, ``float64``, ``boolean``,
            ``string``, ``bytes``, ``struct``, ``array``, ``map``; ``union``/``null`` for Avro oddities).
        semantic: Connect/Debezium semantic name or Avro logical type, if any.
        params: Connect schema parameters (``scale``, ``connect.decimal.precision`` ...).
        nullable: whether the column is optional.
        wire: ``avro`` (values as fastavro returns them) or ``json`` (JsonConverter values).
        check: converter for the value of a plain primitive column (no semantic type): JSON
            values need a type check, fastavro's are already right (``None``).

    Returns:
        The column's plan.

    Raises:
        DecodeError: the base type is unknown or the declared decimal cannot be held by Delta.
    """
    if base not in _BASE_TYPES and base not in COMPOSITE_TYPES:
        raise DecodeError(f"schema: column '{name}' has unknown Connect type {base!r}")
    delta, convert = _semantic(base, semantic, params, name, check)
    return FieldPlan(name, convert, _toast_values(base, wire), ColumnSpec(name, delta, nullable, semantic))


def _semantic(base: str, semantic: str | None, params: Mapping[str, Any], name: str,
              check: Converter | None) -> tuple[str, Converter | None]:
    # A semantic name only applies on the base type Debezium uses for it; anything else keeps its
    # base mapping rather than being misread.
    if semantic == DECIMAL and base == "bytes":
        return _decimal_type(params, name)
    if semantic == VARIABLE_SCALE_DECIMAL and base == "struct":
        return f"decimal({MAX_PRECISION},{VARIABLE_SCALE})", _variable_scale_decimal
    if base in _INTEGERS:
        if semantic in _DATES:
            return "date", _to_date
        if semantic in _TIMES:
            return "long", _TIME_CONVERTERS[_TIMES[semantic]]
        if semantic in _LOCAL_TIMESTAMPS:
            return "timestamp_ntz", _LOCAL_CONVERTERS[_LOCAL_TIMESTAMPS[semantic]]
        if semantic in _UTC_TIMESTAMPS:
            return "timestamp", _UTC_CONVERTERS[_UTC_TIMESTAMPS[semantic]]
    if semantic == ZONED_TIMESTAMP and base == "string":
        return "timestamp", _zoned_timestamp
    if base in COMPOSITE_TYPES:
        return "string", to_json
    return _BASE_TYPES[base], check


_NANO_KEYS: Final = frozenset({"io.debezium.time.NanoTimestamp", "io.debezium.time.NanoTime"})
_FRACTION: Final = re.compile(r"\.(\d+)")


def as_key_field(plan: FieldPlan) -> FieldPlan:
    """The plan of a column that is part of the primary key: every distinct source value stays distinct.

    Delta timestamps hold microseconds. A nanosecond column (``NanoTimestamp``, ``NanoTime``; e.g.
    SQL Server ``datetime2(7)``, Oracle ``TIMESTAMP(9)``) in a key would merge keys that differ
    below a microsecond, so a key column of those types is kept exact as ``long`` nanoseconds
    (since the epoch, or since midnight). A ``ZonedTimestamp`` key stays a timestamp; a value with
    digits below the microsecond is refused (the message is quarantined with the reason).
    """
    semantic = plan.spec.semantic
    if semantic in _NANO_KEYS and plan.spec.type in ("timestamp_ntz", "long"):
        spec = ColumnSpec(plan.name, "long", plan.spec.nullable, semantic)
        return FieldPlan(plan.name, _exact_nanos, plan.toast, spec)
    if semantic == ZONED_TIMESTAMP and plan.spec.type == "timestamp":
        return FieldPlan(plan.name, _zoned_timestamp_key, plan.toast, plan.spec)
    return plan


def _exact_nanos(value: Any) -> int:
    if type(value) is int:
        return value
    raise ConvertError(f"expected integer nanoseconds, got {value!r}")


def _zoned_timestamp_key(value: Any) -> datetime:
    if type(value) is str:
        fraction = _FRACTION.search(value)
        if fraction is not None and fraction.group(1)[6:].strip("0"):
            raise ConvertError(f"key value {value!r} has digits below the microsecond, which a Delta timestamp "
                               "cannot hold; keys that differ only there would collide")
    return _zoned_timestamp(value)


def _toast_values(base: str, wire: Wire) -> tuple[Any, ...]:
    if base == "string":
        return (UNAVAILABLE_MARKER,)
    if base == "bytes":
        # JsonConverter carries bytes as base64 text; Avro as raw bytes.
        return (_MARKER_B64,) if wire == "json" else (_MARKER_BYTES,)
    if base == "array":
        return _ARRAY_MARKERS
    if base == "map":
        return (_MAP_MARKER,)
    return ()


def convert_image(row: Mapping[str, Any],
                  fields: tuple[FieldPlan, ...]) -> tuple[dict[str, Any], frozenset[str]]:
    """Convert one row image with ready-made plans.

    Returns:
        ``(values, unavailable)``: values by column in schema order (placeholders replaced by
        :data:`UNAVAILABLE`), and the names of the columns that held a placeholder.

    Raises:
        DecodeError: a value does not fit its column; the reason names the column.
    """
    out: dict[str, Any] = {}
    unavailable: list[str] | None = None
    name = ""
    try:
        for name, convert, toast, _spec in fields:
            value = row.get(name)
            if value is None:
                out[name] = None
            elif toast and value in toast:
                out[name] = UNAVAILABLE
                if unavailable is None:
                    unavailable = []
                unavailable.append(name)
            else:
                out[name] = value if convert is None else convert(value)
    except ConvertError as exc:
        raise DecodeError(f"{exc} (column '{name}')") from exc
    except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError) as exc:
        raise DecodeError(f"cannot convert column '{name}': {type(exc).__name__}: {exc}") from exc
    return out, (frozenset(unavailable) if unavailable else _NO_UNAVAILABLE)


# --- schemaless JSON ---------------------------------------------------------------------------

_INFERRED: Final = {bool: "boolean", int: "long", float: "double", str: "string"}
_inferred_columns: dict[tuple[tuple[str, str], ...], tuple[ColumnSpec, ...]] = {}


def infer_image(row: Mapping[str, Any], *, skip_meta: bool = False
                ) -> tuple[dict[str, Any], tuple[ColumnSpec, ...], frozenset[str]]:
    """Convert a row that came without a schema (``schemas.enable=false``), inferring column types.

    ``int`` -> ``long``, ``float`` -> ``double``, ``bool`` -> ``boolean``, ``str`` -> ``string``,
    objects and arrays -> ``string`` holding canonical JSON, and a column that is null here ->
    ``string`` (nothing better is known).

    Args:
        row: the row image.
        skip_meta: leave out ``__``-prefixed fields (ExtractNewRecordState metadata).

    Returns:
        ``(values, columns, unavailable)``.
    """
    out: dict[str, Any] = {}
    typed: list[tuple[str, str]] = []
    unavailable: list[str] = []
    for name, value in row.items():
        if skip_meta and name.startswith("__"):
            continue
        kind = type(value)
        if kind is dict or kind is list:
            if value in _ARRAY_MARKERS or value == _MAP_MARKER:
                value = UNAVAILABLE
                unavailable.append(name)
            else:
                value = to_json(value)
            delta = "string"
        elif kind is str and value in (UNAVAILABLE_MARKER, _MARKER_B64):
            value = UNAVAILABLE
            unavailable.append(name)
            delta = "string"
        else:
            delta = _INFERRED.get(kind, "string")
        out[name] = value
        typed.append((name, delta))
    signature = tuple(typed)
    columns = _inferred_columns.get(signature)
    if columns is None:
        columns = tuple(ColumnSpec(n, t, True, None) for n, t in signature)
        if len(_inferred_columns) > 1024:  # bound memory when column sets keep changing
            _inferred_columns.clear()
        _inferred_columns[signature] = columns
    return out, columns, frozenset(unavailable) if unavailable else _NO_UNAVAILABLE


# --- value conversions -------------------------------------------------------------------------

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


def _decimal_type(params: Mapping[str, Any], name: str) -> tuple[str, Converter]:
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


def _variable_scale_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal):
        return fit_decimal(value, MAX_PRECISION, VARIABLE_SCALE)
    if not isinstance(value, Mapping) or "value" not in value or "scale" not in value:
        raise ConvertError(f"expected a VariableScaleDecimal struct {{scale, value}}, got {value!r}")
    scale = value["scale"]
    if type(scale) is not int:
        raise ConvertError(f"VariableScaleDecimal scale is not an integer: {scale!r}")
    # Built from text so that no context precision can round it before the exactness check.
    number = Decimal(f"{_unscaled(value['value'])}E{-scale}")
    return fit_decimal(number, MAX_PRECISION, VARIABLE_SCALE)


def _to_date(value: Any) -> date:
    if type(value) is date:
        return value
    try:
        return date.fromordinal(_EPOCH_ORDINAL + value)
    except (ValueError, OverflowError) as exc:
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
    epoch = _EPOCH_UTC if utc else _EPOCH_NAIVE

    def convert(value: Any) -> datetime:
        if type(value) is int:
            try:
                # Floor division truncates nanoseconds towards the past, as Java's Instant.truncatedTo.
                return epoch + timedelta(0, 0, value * mul // div)
            except OverflowError as exc:
                raise ConvertError(f"timestamp out of range: {value!r} {unit} since epoch") from exc
        if isinstance(value, datetime):  # fastavro's timestamp logical types
            if utc:
                return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)
        raise ConvertError(f"expected an integer timestamp, got {value!r}")

    return convert


def _zoned_timestamp(value: Any) -> datetime:
    if type(value) is not str:
        raise ConvertError(f"expected an ISO-8601 timestamp, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
        # A ZonedTimestamp always carries an offset; a bare one is read as UTC rather than local time.
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise ConvertError(f"timestamp out of range or malformed: {value!r}") from exc


_TIME_CONVERTERS: Final = {unit: _time_micros(unit) for unit in (_MILLI, _MICRO, _NANO)}
_LOCAL_CONVERTERS: Final = {unit: _timestamp(unit, utc=False) for unit in (_MILLI, _MICRO, _NANO)}
_UTC_CONVERTERS: Final = {unit: _timestamp(unit, utc=True) for unit in (_MILLI, _MICRO)}
