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
import hashlib
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple

from ingest.decode.values import (
    LOCAL_CONVERTERS,
    MAX_PRECISION,
    MICRO,
    MILLI,
    NANO,
    TIME_CONVERTERS,
    UTC_CONVERTERS,
    VARIABLE_SCALE,
    Converter,
    ConvertError,
    array_of,
    decimal_type,
    exact_variable_scale_decimal,
    to_date,
    to_json,
    variable_scale_decimal,
    zoned_timestamp,
)
from ingest.errors import DecodeError
from ingest.model import UNAVAILABLE, UNTYPED, ColumnSpec

Wire = Literal["avro", "json"]

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

_DATES: Final = frozenset({"io.debezium.time.Date", "org.apache.kafka.connect.data.Date", "date"})
_TIMES: Final = {
    "io.debezium.time.Time": MILLI, "org.apache.kafka.connect.data.Time": MILLI, "time-millis": MILLI,
    "io.debezium.time.MicroTime": MICRO, "time-micros": MICRO, "io.debezium.time.NanoTime": NANO,
}
_LOCAL_TIMESTAMPS: Final = {
    "io.debezium.time.Timestamp": MILLI, "io.debezium.time.MicroTimestamp": MICRO,
    "io.debezium.time.NanoTimestamp": NANO,
    "local-timestamp-millis": MILLI, "local-timestamp-micros": MICRO,
}
_UTC_TIMESTAMPS: Final = {
    "org.apache.kafka.connect.data.Timestamp": MILLI, "timestamp-millis": MILLI, "timestamp-micros": MICRO,
}
_INTEGERS: Final = frozenset({"int8", "int16", "int32", "int64"})

_BASE_TYPES: Final = {
    "int8": "byte", "int16": "short", "int32": "integer", "int64": "long", "float32": "float",
    "float64": "double", "boolean": "boolean", "string": "string", "bytes": "binary",
}
#: Connect base types that have no Delta primitive: carried as canonical JSON text.
COMPOSITE_TYPES: Final = frozenset({"struct", "array", "map", "union", "null"})

_NO_UNAVAILABLE: Final[frozenset[str]] = frozenset()


class FieldPlan(NamedTuple):
    """How one column is read: name, converter (``None`` = use as is), TOAST placeholders, spec."""

    name: str
    convert: Converter | None
    toast: tuple[Any, ...]
    spec: ColumnSpec


def field_plan(
    name: str, *, base: str, semantic: str | None, params: Mapping[str, Any], nullable: bool, wire: Wire,
    check: Converter | None = None, default: Any = None, items: FieldPlan | None = None,
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
        default: the column's default value in the schema, as a wire value (``None``: none).
        items: an array's plan of its elements: elements of a semantic type (dates, timestamps,
            decimals) are converted as a column of that type would be, then written as JSON.

    Returns:
        The column's plan.

    Raises:
        DecodeError: the base type is unknown or the declared decimal cannot be held by Delta.
    """
    if base not in _BASE_TYPES and base not in COMPOSITE_TYPES:
        raise DecodeError(f"schema: column '{name}' has unknown Connect type {base!r}")
    delta, convert = _semantic(base, semantic, params, name, check)
    if (base == "array" and items is not None and items.spec.semantic is not None
            and items.convert not in (None, to_json)):  # structs stay JSON objects
        convert = array_of(_element(items.convert))
    return FieldPlan(name, convert, _toast_values(base, wire),
                     ColumnSpec(name, delta, nullable, semantic, default_text(default, convert)))


def _element(convert: Converter) -> Converter:
    """An array element's converter: a ``VariableScaleDecimal`` keeps the digits it was sent with
    (PostgreSQL's ``numeric[]`` prints ``1.5``, not a column's ``1.500000000000000000``)."""
    return exact_variable_scale_decimal if convert is variable_scale_decimal else convert


def default_text(default: Any, convert: Converter | None) -> str | None:
    """A schema's default value as SQL-like text (``'x'``, ``5``, ``2024-01-01``) for messages.

    The value goes through the column's converter, as a row's would; a default the converter
    refuses is shown as the schema states it.
    """
    if default is None:
        return None
    value = default
    if convert is not None:
        try:
            value = convert(default)
        except (ValueError, TypeError, ArithmeticError):
            value = default
    if value is None:
        return None
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bytes | bytearray):
        return "'\\x" + bytes(value).hex() + "'"
    return str(value)


def _semantic(base: str, semantic: str | None, params: Mapping[str, Any], name: str,
              check: Converter | None) -> tuple[str, Converter | None]:
    # A semantic name only applies on the base type Debezium uses for it; anything else keeps its
    # base mapping rather than being misread.
    if semantic == DECIMAL and base == "bytes":
        return decimal_type(params, name)
    if semantic == VARIABLE_SCALE_DECIMAL and base == "struct":
        return f"decimal({MAX_PRECISION},{VARIABLE_SCALE})", variable_scale_decimal
    if base in _INTEGERS:
        if semantic in _DATES:
            return "date", to_date
        if semantic in _TIMES:
            return "long", TIME_CONVERTERS[_TIMES[semantic]]
        if semantic in _LOCAL_TIMESTAMPS:
            return "timestamp_ntz", LOCAL_CONVERTERS[_LOCAL_TIMESTAMPS[semantic]]
        if semantic in _UTC_TIMESTAMPS:
            return "timestamp", UTC_CONVERTERS[_UTC_TIMESTAMPS[semantic]]
    if semantic == ZONED_TIMESTAMP and base == "string":
        return "timestamp", zoned_timestamp
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
        spec = ColumnSpec(plan.name, "long", plan.spec.nullable, semantic, plan.spec.default)
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
    return zoned_timestamp(value)


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
    ``void``, which any type holds (another message, or the table, gives the type; a column never
    seen otherwise becomes ``string``).

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
        elif value is None:
            delta = UNTYPED
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
