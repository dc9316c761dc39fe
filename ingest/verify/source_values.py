"""PostgreSQL columns as the engine writes them: for each source type, the Arrow type and value.

The engine's representation (ingest/decode/semantic.py, values.py) of what Debezium 3.6 emits for PostgreSQL
(``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``, ``binary.handling.mode=bytes``):

==================================  ==============================  ==================================
PostgreSQL                          Delta type                      value read back here
==================================  ==============================  ==================================
smallint / integer / bigint         short / integer / long          int
real / double precision             float / double                  float
boolean                             boolean                         bool
numeric(p,s)                        decimal(p,s) (p capped at 38)   Decimal
numeric (no typmod)                 decimal(38,18)                  Decimal
text, varchar, char(n), enum, uuid  string                          text as PostgreSQL prints it
json, jsonb                         string                          compared as parsed JSON
bytea                               binary                          bytes
date                                date                            date
time                                long (microseconds of the day)  int
timetz                              string (UTC, ``HH:MM:SS[.f]Z``) text
timestamp                           timestamp_ntz                   naive datetime
timestamptz                         timestamp (UTC)                 instant
arrays of text/number/boolean       string (JSON of the array)      ``to_json(list)``
==================================  ==============================  ==================================

Other types (interval, money, geometric, ranges, hstore ...) are not compared; the verifier says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, time
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa
from psycopg import sql

from ingest.decode.values import MAX_PRECISION, VARIABLE_SCALE, ConvertError, fit_decimal, to_json

Convert = Callable[[Any], Any]
_INTS: Final = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64()}
_FLOATS: Final = {"float4": pa.float32(), "float8": pa.float64()}
#: Read as PostgreSQL's own text output (what Debezium sends for them).
_AS_TEXT: Final = frozenset({"uuid", "json", "jsonb", "xml", "inet", "cidr", "macaddr", "macaddr8", "citext"})
_STRINGS: Final = frozenset({"text", "varchar", "bpchar", "name"})
_ARRAY_ELEMENTS: Final = frozenset({"text", "varchar", "bpchar", "name", "int2", "int4", "int8", "bool",
                                    "float4", "float8"})


@dataclass(frozen=True)
class SourceColumn:
    """How one source column is selected, converted and compared.

    Attributes:
        name: column name.
        pg_type: PostgreSQL's ``format_type`` of it.
        arrow: the Arrow type of the engine's Delta column; ``None``: not compared.
        select: the select-list expression.
        convert: turns the fetched value into the engine's value (``None``: as fetched).
        normalize: applied to both sides before comparing (``None``: compare as is).
        note: why the column is not compared.
    """

    name: str
    pg_type: str
    arrow: pa.DataType | None
    select: sql.Composable
    convert: Convert | None = None
    normalize: Convert | None = None
    note: str | None = None


def column_plan(name: str, pg_type: str, typname: str, typtype: str, typmod: int,
                element: str | None) -> SourceColumn:
    """The :class:`SourceColumn` of a column, from its ``pg_type`` catalog entry.

    Args:
        name: column name.
        pg_type: ``format_type(atttypid, atttypmod)``, for messages.
        typname: ``pg_type.typname`` (``int4``, ``numeric``, ``_text`` ...).
        typtype: ``pg_type.typtype`` (``b`` base, ``e`` enum, ``d`` domain ...).
        typmod: ``pg_attribute.atttypmod`` (-1: none).
        element: the element type's ``typname`` for an array, else ``None``.
    """
    ident = sql.Identifier(name)
    as_text = sql.SQL("{}::text").format(ident)
    if typtype == "e":
        return SourceColumn(name, pg_type, pa.string(), as_text)
    if typname in _INTS:
        return SourceColumn(name, pg_type, _INTS[typname], ident)
    if typname in _FLOATS:
        return SourceColumn(name, pg_type, _FLOATS[typname], ident)
    if typname == "bool":
        return SourceColumn(name, pg_type, pa.bool_(), ident)
    if typname == "numeric":
        return _numeric(name, pg_type, typmod, ident)
    if typname in _STRINGS:
        return SourceColumn(name, pg_type, pa.string(), ident)  # char(n) keeps its padding, as Debezium's
    if typname in ("json", "jsonb"):
        return SourceColumn(name, pg_type, pa.string(), as_text, normalize=parse_json)
    if typname in _AS_TEXT:
        return SourceColumn(name, pg_type, pa.string(), as_text)
    if typname == "bytea":
        return SourceColumn(name, pg_type, pa.binary(), ident, convert=bytes)
    if typname == "date":
        return SourceColumn(name, pg_type, pa.date32(), ident)
    if typname == "time":
        return SourceColumn(name, pg_type, pa.int64(), ident, convert=time_micros)
    if typname == "timetz":
        return SourceColumn(name, pg_type, pa.string(), ident, convert=zoned_time)
    if typname == "timestamp":
        return SourceColumn(name, pg_type, pa.timestamp("us"), ident)
    if typname == "timestamptz":
        return SourceColumn(name, pg_type, pa.timestamp("us", tz="UTC"), ident, convert=lambda d: d.astimezone(UTC))
    if element is not None and element in _ARRAY_ELEMENTS:
        return SourceColumn(name, pg_type, pa.string(), ident, convert=to_json)
    return SourceColumn(name, pg_type, None, ident, note=f"type {pg_type} is not compared (no known engine "
                                                           "representation for it in verify)")


def _numeric(name: str, pg_type: str, typmod: int, ident: sql.Composable) -> SourceColumn:
    if typmod < 0:  # plain numeric: Debezium's VariableScaleDecimal, written as decimal(38,18)
        precision, scale = MAX_PRECISION, VARIABLE_SCALE
    else:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        precision = min(max(precision, scale), MAX_PRECISION)
    if scale > MAX_PRECISION:
        return SourceColumn(name, pg_type, None, ident, note=f"{pg_type}: scale above 38 has no Delta type")
    return SourceColumn(name, pg_type, pa.decimal128(precision, scale), ident, convert=_decimal(precision, scale))


def _decimal(precision: int, scale: int) -> Convert:
    def convert(value: Decimal) -> Decimal:
        try:
            return fit_decimal(value, precision, scale)  # the engine's own rule: exact or refused
        except ConvertError as exc:
            raise NotRepresentable(str(exc)) from None

    return convert


class NotRepresentable(ValueError):
    """A source value the engine's column type cannot hold (the engine quarantines such a change)."""


def time_micros(value: time) -> int:
    """A ``time`` as microseconds since midnight (Debezium ``MicroTime``)."""
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def zoned_time(value: time) -> str:
    """A ``timetz`` as Debezium's ``ZonedTime`` text: the same instant of the day in UTC, ``HH:MM:SS[.f]Z``."""
    offset = value.utcoffset()
    seconds = time_micros(value) - (int(offset.total_seconds() * 1_000_000) if offset else 0)
    seconds %= 86_400_000_000
    micros = seconds % 1_000_000
    whole = seconds // 1_000_000
    text = f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"
    if micros:
        text += "." + f"{micros:06d}".rstrip("0")
    return text + "Z"


def parse_json(text: Any) -> Any:
    """JSON text parsed (numbers as ``Decimal``), or the text itself if it is not JSON."""
    if not isinstance(text, str):
        return text
    try:
        return _Frozen.of(json.loads(text, parse_float=Decimal))
    except ValueError:
        return text


class _Frozen:
    """Parsed JSON compared by value: an object's key order does not matter, numbers compare exactly."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    @classmethod
    def of(cls, value: Any) -> _Frozen:
        return cls(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Frozen) and _json_equal(self.value, other.value)

    def __hash__(self) -> int:
        return hash(json.dumps(self.value, sort_keys=True, default=str))

    def __repr__(self) -> str:
        return json.dumps(self.value, sort_keys=True, ensure_ascii=False, default=str)


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | Decimal) and isinstance(b, int | Decimal):
        return Decimal(a) == Decimal(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
