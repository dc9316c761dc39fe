"""A PostgreSQL source database for ``verify --source-db``: its tables read as the engine writes them.

Each column type's Arrow type and value, as the engine (ingest/decode/semantic.py, values.py)
represents what Debezium 3.6 emits (``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``,
``binary.handling.mode=bytes``):

==================================  ==============================  ==================================
PostgreSQL                          Delta type                      value read back here
==================================  ==============================  ==================================
smallint / integer / bigint         short / integer / long          int
real / double precision             float / double                  float
boolean                             boolean                         bool
numeric(p,s)                        decimal(p,s) (p capped at 38)   Decimal
numeric (no typmod)                 decimal(38,18)                  Decimal
text, varchar, char(n), enum, uuid  string                          text as PostgreSQL prints it
inet, cidr, macaddr, citext, xml    string                          text as PostgreSQL prints it
ranges (not tstzrange), tsvector,   string                          text as PostgreSQL prints it
ltree, "char"
tstzrange                           string                          compared as bounds and instants
json, jsonb                         string                          compared as parsed JSON
hstore                              string (JSON object)            compared as parsed JSON
money                               decimal(38,2)                   Decimal
oid                                 long                            int
bit(1) / bit(n), bit varying        boolean / binary                bool / bytes (Java's BitSet bytes)
bytea                               binary                          bytes
date                                date                            date
time                                long (microseconds of the day)  int
interval                            long (MicroDuration)            int, as Debezium computes it
timetz                              string (UTC, ``HH:MM:SS[.f]Z``) text
timestamp                           timestamp_ntz                   naive datetime
timestamptz                         timestamp (UTC)                 instant
arrays of text/number/boolean       string (JSON of the array)      ``to_json(list)``
numeric/uuid/date/timestamp(tz)[]   string (JSON of the array)      ``array_to_json``, compared parsed
enum[]                              string (JSON of the array)      ``array_to_json``, compared parsed
time[]                              string (JSON of microseconds)   compared parsed (Debezium: ms)
timetz[]                            string (JSON of UTC texts)      compared parsed (Debezium: s)
point                               string (JSON of the struct)     compared parsed
==================================  ==============================  ==================================

A domain's column is compared as the type it is defined over. A connector of other handling modes
(``source.debezium``) sends ``numeric``, ``money``, ``bytea``, ``interval``, ``time`` and
``timestamp`` otherwise, and :func:`column_plan` reads them as it sends them
(docs/types.md#other-handling-modes).

``infinity`` and ``-infinity`` dates and timestamps are read as the values the engine writes for
them (:data:`ingest.decode.values.LATEST` and :data:`~ingest.decode.values.EARLIEST`).

Other types (``box``, ``polygon``, multiranges ...) are not compared; the verifier says so. Nor is a
stored generated column before PostgreSQL 18: logical replication publishes none, so no change
carries its value.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format

from ingest import secrets
from ingest.config.source import DEBEZIUM_DEFAULTS, DebeziumModes
from ingest.decode.values import EARLIEST, LATEST, MAX_PRECISION, VARIABLE_SCALE, to_json
from ingest.errors import ConfigError
from ingest.verify.capture import wait_for_capture
from ingest.verify.source_values import (
    NotRepresentable,
    SourceColumn,
    binary_text,
    decimal_convert,
    decimal_text,
    geometry_json,
    parse_json,
    same_nan,
    to_millis,
    zoned_time,
)

__all__ = ["Error", "OperationalError", "column_plan", "connect", "describe", "insert_signal", "read_columns",
           "wait_for_capture"]

#: What the client raises (a connection failure is its OperationalError).
Error = psycopg.Error
OperationalError = psycopg.OperationalError
#: A range's text: its opening bracket, lower and upper bounds (each quoted or not) and closing bracket.
_RANGE: Final = re.compile(r'([\[(])("(?:[^"\\]|\\.|"")*"|[^,]*),("(?:[^"\\]|\\.|"")*"|[^\])]*)([\])])')
_DAYS_PER_MONTH: Final = 365.25 / 12.0  # Debezium's MicroDuration.DAYS_PER_MONTH_AVG
_LONG: Final = (-(2**63), 2**63 - 1)
_INTS: Final = {"int2": pa.int16(), "int4": pa.int32(), "int8": pa.int64()}
_FLOATS: Final = {"float4": pa.float32(), "float8": pa.float64()}
#: Read as PostgreSQL's own text output (what Debezium sends for them). A range's text is the same
#: in every session but a ``tstzrange``'s, which is in the time zone of Debezium's session.
_AS_TEXT: Final = frozenset({"uuid", "json", "jsonb", "xml", "cidr", "macaddr", "macaddr8", "citext", "tsvector",
                             "ltree", "char", "int4range", "int8range", "numrange", "daterange", "tsrange"})
_STRINGS: Final = frozenset({"text", "varchar", "bpchar", "name"})
_ARRAY_ELEMENTS: Final = frozenset({"text", "varchar", "bpchar", "name", "int2", "int4", "int8", "bool",
                                    "float4", "float8"})
#: What the engine writes for ``infinity`` and ``-infinity`` of each date and timestamp type.
_BOUNDS: Final[dict[str, tuple[object, object]]] = {
    "date": (LATEST.date(), EARLIEST.date()), "timestamp": (LATEST, EARLIEST),
    "timestamptz": (LATEST.replace(tzinfo=UTC), EARLIEST.replace(tzinfo=UTC)),
}
#: Arrays whose elements the engine converts as columns of their type: compared as JSON text.
_JSON_ARRAY_ELEMENTS: Final = frozenset({"numeric", "uuid", *_BOUNDS})
#: Each column's type; a domain's is the type it is defined over (with its length or precision), as
#: Debezium sends it. An array's element type is named with its kind (``e`` for an enum).
_COLUMNS_QUERY = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typname, t.typtype, b.typmod,
       CASE WHEN t.typcategory = 'A' THEN et.typname END, CASE WHEN t.typcategory = 'A' THEN et.typtype END,
       a.attgenerated = 's'
FROM pg_attribute a
JOIN pg_type d ON d.oid = a.atttypid
CROSS JOIN LATERAL (SELECT CASE WHEN d.typtype = 'd' THEN d.typbasetype ELSE d.oid END AS oid,
                           CASE WHEN d.typtype = 'd' THEN d.typtypmod ELSE a.atttypmod END AS typmod) b
JOIN pg_type t ON t.oid = b.oid
LEFT JOIN pg_type et ON et.oid = t.typelem
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_KEY_QUERY = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""



def describe(dsn: str) -> str:
    """``host:port/dbname`` of a libpq connection string (never its password); registers the password
    with :mod:`ingest.secrets` so no error message can echo it.

    Raises:
        ConfigError: ``dsn`` is not a connection string libpq can parse.
    """
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:  # libpq's parse error, which never quotes a password
        raise ConfigError(f"the source database's connection string is not valid: {exc}") from None
    secrets.register(str(info["password"]) if info.get("password") else None)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


@contextmanager
def connect(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the source database (a libpq URL or key=value string)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def insert_signal(conn: psycopg.Connection, table: str, row: tuple[str, str, str]) -> None:
    """Insert ``(id, type, data)`` into the connector's signal table ``<schema>.<table>``."""
    schema, name = table.split(".")
    conn.execute(sql.SQL("INSERT INTO {}.{} (id, type, data) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema), sql.Identifier(name)), row)


def read_columns(conn: psycopg.Connection, schema: str, table: str, key_override: tuple[str, ...] | None,
                 modes: DebeziumModes = DEBEZIUM_DEFAULTS
                 ) -> tuple[list[SourceColumn], tuple[str, ...], Iterator[tuple[object, ...]]]:
    """The column plans of ``schema.table`` as a connector of ``modes`` sends them, its key, and its
    rows (the compared columns, in plan order).

    Raises:
        ConfigError: the table does not exist.
    """
    conn.execute("SET TIME ZONE 'UTC'")  # timestamptz[] as JSON text: in UTC, as the engine writes them
    relid = conn.execute("SELECT to_regclass(%s)::oid", (f'"{schema}"."{table}"',)).fetchone()
    if relid is None or relid[0] is None:
        raise ConfigError(f"source table {schema}.{table} does not exist")
    unpublished = conn.info.server_version < _PUBLISHES_GENERATED
    plans = [_unpublished(plan) if generated and unpublished else plan
             for *row, generated in conn.execute(_COLUMNS_QUERY, (relid[0],)).fetchall()
             for plan in [column_plan(*row, modes=modes)]]
    key = key_override or tuple(r[0] for r in conn.execute(_KEY_QUERY, (relid[0],)).fetchall())
    compared = [p for p in plans if p.arrow is not None]
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(p.select for p in compared), sql.Identifier(schema), sql.Identifier(table))
    cursor = conn.cursor()
    _load_beyond_python(cursor.adapters)
    return plans, key, iter(cursor.execute(query)) if compared else iter(())


#: The first PostgreSQL whose logical replication can publish generated columns (``publish_generated_columns``).
_PUBLISHES_GENERATED: Final = 180000


def _unpublished(plan: SourceColumn) -> SourceColumn:
    """A stored generated column before PostgreSQL 18: no change carries it, so the lake has none."""
    return dataclasses.replace(plan, arrow=None, note="a generated column, which PostgreSQL's logical replication "
                                                      "does not publish before version 18; not compared")


def column_plan(name: str, pg_type: str, typname: str, typtype: str, typmod: int,
                element: str | None, element_kind: str | None = None, *,
                modes: DebeziumModes = DEBEZIUM_DEFAULTS) -> SourceColumn:
    """The :class:`SourceColumn` of a column, from its ``pg_type`` catalog entry.

    Args:
        name: column name.
        pg_type: ``format_type(atttypid, atttypmod)``, for messages.
        typname: ``pg_type.typname`` (``int4``, ``numeric``, ``_text`` ...).
        typtype: ``pg_type.typtype`` (``b`` base, ``e`` enum ...).
        typmod: ``pg_attribute.atttypmod`` (-1: none).
        element: the element type's ``typname`` for an array, else ``None``.
        element_kind: the element type's ``typtype`` for an array.
        modes: the connector's handling modes (docs/types.md#other-handling-modes).

    A domain's column is planned as the type the domain is defined over (the caller names that type).
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
    if typname in ("numeric", "money") and modes.decimal_handling_mode != "precise":
        value = sql.SQL("{}::numeric").format(ident)
        if modes.decimal_handling_mode == "string":
            return SourceColumn(name, pg_type, pa.string(), value, convert=decimal_text)
        return SourceColumn(name, pg_type, pa.float64(), value, convert=float, normalize=same_nan)
    if typname == "numeric":
        return _numeric(name, pg_type, typmod, ident)
    if typname in _STRINGS:
        return SourceColumn(name, pg_type, pa.string(), ident)  # char(n) keeps its padding, as Debezium's
    if typname in ("json", "jsonb"):
        return SourceColumn(name, pg_type, pa.string(), as_text, normalize=parse_json)
    if typname in _AS_TEXT:
        return SourceColumn(name, pg_type, pa.string(), as_text)
    if typname == "inet":  # its output text: a host's address without the /32 or /128 that ::text adds
        return SourceColumn(name, pg_type, pa.string(), sql.SQL("abbrev({})").format(ident))
    if typname == "hstore":  # Debezium's hstore.handling.mode=json
        return SourceColumn(name, pg_type, pa.string(), sql.SQL("{}::json::text").format(ident), normalize=parse_json)
    if typname == "money":  # a decimal of money.fraction.digits (2) fraction digits
        return SourceColumn(name, pg_type, pa.decimal128(MAX_PRECISION, 2), sql.SQL("{}::numeric").format(ident),
                            convert=decimal_convert(MAX_PRECISION, 2))
    if typname == "oid":
        return SourceColumn(name, pg_type, pa.int64(), sql.SQL("{}::bigint").format(ident))
    if typname == "bit" and typmod == 1:
        return SourceColumn(name, pg_type, pa.bool_(), sql.SQL("{} = B'1'").format(ident))
    if typname in ("bit", "varbit"):
        return SourceColumn(name, pg_type, pa.binary(), as_text, convert=_bit_set_bytes)
    if typname == "bytea" and modes.binary_handling_mode != "bytes":
        return SourceColumn(name, pg_type, pa.string(), ident, convert=binary_text(modes.binary_handling_mode))
    if typname == "bytea":
        return SourceColumn(name, pg_type, pa.binary(), ident, convert=bytes)
    if typname == "date":
        return SourceColumn(name, pg_type, pa.date32(), _finite(ident, *_BOUNDS[typname]), convert=_within_delta)
    connect = modes.time_precision_mode == "connect"  # Kafka Connect's types: milliseconds
    if typname == "time":  # selected as microseconds: Python's time has no 24:00:00
        return SourceColumn(name, pg_type, pa.int64(), _day_micros(ident), convert=to_millis if connect else None)
    if typname == "timetz":
        return SourceColumn(name, pg_type, pa.string(), _day_micros(ident), convert=zoned_time)
    if typname == "interval" and modes.interval_handling_mode == "string":
        return SourceColumn(name, pg_type, pa.string(), _interval_fields(ident), convert=_iso_interval)
    if typname == "interval":
        return SourceColumn(name, pg_type, pa.int64(), _interval_fields(ident), convert=_micro_duration)
    if typname == "tstzrange":  # its text follows the zone of Debezium's session: compared as instants
        return SourceColumn(name, pg_type, pa.string(), as_text, normalize=_instant_range)
    if typname == "point":
        coordinates = sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE ARRAY[{0}[0], {0}[1]] END").format(ident)
        return SourceColumn(name, pg_type, pa.string(), coordinates, convert=_point_json, normalize=parse_json)
    if typname == "timestamp" and connect:  # a Connect Timestamp: an instant, in milliseconds
        return SourceColumn(name, pg_type, pa.timestamp("us", tz="UTC"), _finite(ident, *_BOUNDS[typname]),
                            convert=lambda d: to_millis(_within_delta(d)).replace(tzinfo=UTC))
    if typname == "timestamp":
        return SourceColumn(name, pg_type, pa.timestamp("us"), _finite(ident, *_BOUNDS[typname]),
                            convert=_within_delta)
    if typname == "timestamptz":
        return SourceColumn(name, pg_type, pa.timestamp("us", tz="UTC"), _finite(ident, *_BOUNDS[typname]),
                            convert=lambda d: _within_delta(d).astimezone(UTC))
    if element is not None and element in _ARRAY_ELEMENTS:
        return SourceColumn(name, pg_type, pa.string(), ident, convert=to_json)
    if element == "time":
        return SourceColumn(name, pg_type, pa.string(), _array_json(ident, each=_day_micros), normalize=parse_json)
    if element == "timetz":
        return SourceColumn(name, pg_type, pa.string(), _array_json(ident, each=_day_micros), convert=_zoned_times,
                            normalize=parse_json)
    if element == "numeric" and modes.decimal_handling_mode != "precise":  # each element as a column's
        text = modes.decimal_handling_mode == "string"
        return SourceColumn(name, pg_type, pa.string(), _array_json(ident, each=lambda x: sql.SQL(
            "{}::text" if text else "{}::float8").format(x)), normalize=parse_json)
    if element == "timestamp" and connect:  # each element a Connect Timestamp: an instant, in milliseconds
        return SourceColumn(name, pg_type, pa.string(), _array_json(ident, each=lambda x: sql.SQL(
            "date_trunc('milliseconds', {}) AT TIME ZONE 'UTC'").format(x)), normalize=parse_json)
    if element is not None and (element in _JSON_ARRAY_ELEMENTS or element_kind == "e"):
        return SourceColumn(name, pg_type, pa.string(), _array_json(ident, _BOUNDS.get(element)),
                            normalize=parse_json)
    return SourceColumn(name, pg_type, None, ident, note=f"type {pg_type} is not compared (no known engine "
                                                           "representation for it in verify)")


def _bit_set_bytes(bits: str) -> bytes:
    """A ``bit(n)`` or ``bit varying`` as Debezium's ``Bits`` bytes: Java's ``BitSet.toByteArray``,
    least significant byte first and no byte above the highest set bit (all zeros: no bytes)."""
    number = int(bits, 2) if bits else 0
    return number.to_bytes((number.bit_length() + 7) // 8, "little")


def _interval_fields(ident: sql.Composable) -> sql.Composable:
    """An interval's fields as pgjdbc parses its text: months (years included), days, hours, minutes
    and the seconds field in microseconds, each with its own sign."""
    fields = [sql.SQL("extract(year from {0}) * 12 + extract(month from {0})").format(ident),
              *(sql.SQL("extract({} from {})").format(sql.SQL(f), ident)
                for f in ("day", "hour", "minute", "microseconds"))]
    return sql.SQL("CASE WHEN {} IS NULL THEN NULL ELSE ARRAY[{}]::bigint[] END").format(
        ident, sql.SQL(", ").join(fields))


def _micro_duration(fields: list[int]) -> int:
    """Debezium's ``MicroDuration`` of an interval's fields, in the same floating-point steps as
    ``MicroDuration.durationMicros`` (a month is 365.25 / 12 days) over pgjdbc's ``PGInterval``, whose
    seconds are whole seconds plus microseconds / 10⁶; so the result is the same to the microsecond,
    beyond 2⁵³ microseconds (285 years) too, where the double rounds."""
    months, days, hours, minutes, micros = fields
    whole = abs(micros) // 1_000_000 * (1 if micros >= 0 else -1)
    seconds = whole + (micros - whole * 1_000_000) / 1_000_000
    in_days = months * _DAYS_PER_MONTH + days
    micros_f = ((((in_days * 24 + hours) * 60) + minutes) * 60 + seconds) * 1e6
    return min(max(int(micros_f), _LONG[0]), _LONG[1])  # Java's (long) saturates beyond 292,000 years


def _iso_interval(fields: list[int]) -> str:
    """An interval's fields as ``interval.handling.mode=string`` sends them: ISO 8601 with every part
    (``P1Y2M3DT4H5M6.5S``), each with its own sign, and the seconds without trailing zeros."""
    months, days, hours, minutes, micros = fields
    years = abs(months) // 12 * (1 if months >= 0 else -1)  # as pgjdbc's PGInterval splits them
    seconds = format((Decimal(micros) / 1_000_000).normalize(), "f")
    return f"P{years}Y{months - years * 12}M{days}DT{hours}H{minutes}M{seconds}S"


def _point_json(xy: list[float]) -> str:
    """A ``point`` as Debezium's ``Point`` struct: its coordinates and their WKB (little-endian,
    type 1), with no SRID."""
    x, y = xy
    return geometry_json(b"\x01" + struct.pack("<Idd", 1, x, y), None, (x, y))


def _instant_range(text: object) -> object:
    """A ``tstzrange``'s text as its bounds and their instants (each side may print another zone);
    text that does not parse (a BC year) stays as it is."""
    match = _RANGE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return text
    opening, lower, upper, closing = match.groups()
    try:
        return opening, _instant(lower), _instant(upper), closing
    except ValueError:
        return text


def _instant(bound: str) -> object:
    if bound.startswith('"'):
        bound = re.sub(r'\\(.)|""', lambda m: m.group(1) or '"', bound[1:-1])
    if bound in ("", "infinity", "-infinity"):
        return bound or None
    return datetime.fromisoformat(bound).astimezone(UTC)


class _Beyond(str):
    """A date or timestamp before year 1 or after year 9999, as PostgreSQL prints it: Python's dates,
    like Delta's, do not reach it."""


def _load_beyond_python(adapters: AdaptersMap) -> None:
    """Load a date or timestamp that Python cannot hold as :class:`_Beyond` (psycopg would fail the
    whole read on it), through the loader ``adapters`` would use otherwise."""
    for name in ("date", "timestamp", "timestamptz"):
        oid = adapters.types[name].oid
        usual = adapters.get_loader(oid, Format.TEXT)
        assert usual is not None  # psycopg loads every date and timestamp type
        adapters.register_loader(name, type(f"Beyond{usual.__name__}", (_BeyondLoader,), {"usual": usual}))


class _BeyondLoader(Loader):
    """psycopg's ``usual`` loader of a type, but a value it refuses is kept as its text (:class:`_Beyond`)."""

    usual: type[Loader]

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._usual = self.usual(oid, context)

    def load(self, data: Buffer) -> Any:
        try:
            return self._usual.load(data)
        except psycopg.DataError:
            return _Beyond(bytes(data).decode())


def _within_delta(value: Any) -> Any:
    """A date or timestamp, unless it lies beyond Delta's years 1 to 9999."""
    if isinstance(value, _Beyond):
        raise NotRepresentable(f"{value} is beyond the years 1 to 9999 of a Delta date or timestamp, and the "
                               "engine quarantines it")
    return value


def _finite(ident: sql.Composable, latest: object, earliest: object) -> sql.Composable:
    """A date or timestamp column with ``infinity`` and ``-infinity`` read as the engine writes them."""
    return sql.SQL("CASE {c} WHEN 'infinity' THEN {latest} WHEN '-infinity' THEN {earliest} ELSE {c} END").format(
        c=ident, latest=sql.Literal(latest), earliest=sql.Literal(earliest))


def _array_json(ident: sql.Composable, bounds: tuple[object, object] | None = None, *,
                each: Callable[[sql.Composable], sql.Composable] | None = None) -> sql.Composable:
    """A one-dimensional array as PostgreSQL's own ``array_to_json`` text, ``±infinity`` elements read
    as the engine writes them (``bounds``: the latest and earliest values of the element type), or
    each element as ``each`` selects it."""
    element = sql.Identifier("x")
    value = each(element) if each else _finite(element, *bounds) if bounds else element
    return sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE coalesce((SELECT array_to_json(array_agg({value} ORDER BY n)) "
                   "FROM unnest({c}) WITH ORDINALITY AS u(x, n)), '[]')::text END").format(c=ident, value=value)


def _zoned_times(micros: str) -> str:
    """A ``timetz[]`` selected as microseconds since midnight UTC, as the engine writes Debezium's
    array of ``ZonedTime`` texts."""
    return to_json([None if m is None else zoned_time(m) for m in json.loads(micros)])


def _day_micros(ident: sql.Composable) -> sql.Composable:
    """A ``time`` as microseconds since midnight (``24:00:00`` too), a ``timetz`` as microseconds since
    midnight UTC (before or beyond that day when its offset takes it there)."""
    return sql.SQL("CAST(extract(epoch FROM {}) * 1000000 AS bigint)").format(ident)


def _numeric(name: str, pg_type: str, typmod: int, ident: sql.Composable) -> SourceColumn:
    if typmod < 0:  # plain numeric: Debezium's VariableScaleDecimal, written as decimal(38,18)
        precision, scale = MAX_PRECISION, VARIABLE_SCALE
    else:
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        precision = min(max(precision, scale), MAX_PRECISION)
    if scale > MAX_PRECISION:
        return SourceColumn(name, pg_type, None, ident, note=f"{pg_type}: scale above 38 has no Delta type")
    return SourceColumn(name, pg_type, pa.decimal128(precision, scale), ident,
                        convert=decimal_convert(precision, scale))
