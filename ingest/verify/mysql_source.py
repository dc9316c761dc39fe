"""A MariaDB or MySQL source database for ``verify --source-db mysql://user:password@host:port/database``.

Each column type's Arrow type and value, as the engine represents what Debezium's MySQL and MariaDB
connectors emit (``decimal.handling.mode=precise``, ``time.precision.mode=adaptive_time_microseconds``,
``bigint.unsigned.handling.mode=precise``, ``binary.handling.mode=bytes``), checked on the stack's
MariaDB 10.11:

=======================================  ==============================  ==============================
MariaDB / MySQL                          Delta type                      value read back here
=======================================  ==============================  ==============================
tinyint (also tinyint(1)), smallint      short                           int
BOOLEAN (declared so)                    boolean                         int 0 or 1 (equal to the bool)
smallint unsigned, mediumint, int        integer                         int
int unsigned, bigint                     long                            int
bigint unsigned                          decimal(20,0)                   Decimal
decimal(p,s)                             decimal(p,s) (p capped at 38)   Decimal
float / double                           float / double                  float (float: to 32 bits)
bit(1)                                   boolean                         bool
bit(n), n > 1                            binary (little-endian bytes)    bytes
char, varchar, text, enum, set           string                          text (a set: ``a,c``)
json                                     string                          MySQL: compared as parsed JSON;
                                                                         MariaDB (a longtext): its text
binary, varbinary, blob                  binary                          bytes
year                                     integer                         int
date                                     date                            date
time(n)                                  long (microseconds)             int (may be negative)
datetime(n)                              timestamp_ntz                   naive datetime
timestamp(n)                             timestamp (UTC)                 instant (read in UTC)
point, geometry, linestring ...          string (JSON of the struct)     compared parsed: SRID, WKB
                                                                         (a point: and x, y)
=======================================  ==============================  ==============================

A connector of other handling modes (``source.debezium``) sends ``decimal``, the binary types,
``time`` and ``datetime`` otherwise, and :func:`column_plan` reads them as it sends them
(docs/types-mysql.md#other-handling-modes).

A zero date (``0000-00-00``, or a zero month or day) is read as Debezium sends it: null in a nullable
``date`` or ``datetime`` column, else the column's default date, else 1970-01-01; a zero
``timestamp`` is the epoch in any column.

Other types (MariaDB 11's ``vector`` ...) are not compared; the verifier says so. MariaDB and MySQL keep
no record a client can read of how far a Debezium connector has read their binlog, so
:func:`wait_for_capture` waits for nothing: it reads the binlog position for the report, and
``verify`` compares until the tables are equal or its wait has passed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pymysql

from ingest import secrets
from ingest.config.source import DEBEZIUM_DEFAULTS, DebeziumModes
from ingest.decode.columns import EPOCH
from ingest.decode.values import MAX_PRECISION
from ingest.errors import ConfigError
from ingest.verify.captured import CaptureResult
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
)

__all__ = ["Error", "OperationalError", "column_plan", "connect", "describe", "insert_signal", "read_columns",
           "wait_for_capture"]

Say = Callable[[str], None]
#: What the client raises (a connection failure is its OperationalError).
Error = pymysql.Error
OperationalError = pymysql.OperationalError
_STRINGS: Final = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})
_BINARIES: Final = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
#: Spatial types: Debezium's ``Point`` struct for a ``point``, its ``Geometry`` struct for the others.
_SPATIAL: Final = frozenset({"point", "geometry", "linestring", "polygon", "multipoint", "multilinestring",
                             "multipolygon", "geometrycollection"})
_COLUMNS_QUERY = """
SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, NUMERIC_PRECISION, NUMERIC_SCALE, IS_NULLABLE = 'YES', COLUMN_DEFAULT
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION
"""
_KEY_QUERY = """
SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION
"""


def _parts(dsn: str) -> dict[str, Any]:
    """pymysql's connection arguments from a ``mysql://user:password@host:port/database`` URL.

    Raises:
        ConfigError: the URL is malformed (its message never shows the password).
    """
    try:
        url = urlsplit(dsn)
        port = url.port
    except ValueError as exc:
        raise ConfigError(f"the source database's mysql:// URL is not valid: {exc}") from None
    return {"host": url.hostname or "localhost", "port": port or 3306, "user": unquote(url.username or ""),
            "password": unquote(url.password or ""), "database": unquote(url.path.lstrip("/")) or None}


def describe(dsn: str) -> str:
    """``host:port/database`` of a ``mysql://`` URL (never its password); registers the password with
    :mod:`ingest.secrets` so no error message can echo it.

    Raises:
        ConfigError: the URL is malformed.
    """
    parts = _parts(dsn)
    secrets.register(parts["password"] or None)
    return f"{parts['host']}:{parts['port']}/{parts['database'] or ''}"


@contextmanager
def connect(dsn: str) -> Iterator[pymysql.connections.Connection]:
    """An autocommit connection whose session reads TIMESTAMP columns in UTC."""
    conn = pymysql.connect(**_parts(dsn), autocommit=True, charset="utf8mb4", connect_timeout=10)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
        yield conn
    finally:
        conn.close()


def read_columns(conn: pymysql.connections.Connection, schema: str, table: str,
                 key_override: tuple[str, ...] | None, modes: DebeziumModes = DEBEZIUM_DEFAULTS
                 ) -> tuple[list[SourceColumn], tuple[str, ...], Iterator[tuple[Any, ...]]]:
    """The column plans of ``schema.table`` (database and table) as a connector of ``modes`` sends
    them, its key, and its rows.

    Raises:
        ConfigError: the table does not exist.
    """
    with conn.cursor() as cur:
        cur.execute(_COLUMNS_QUERY, (schema, table))
        plans = [column_plan(*row, modes=modes) for row in cur.fetchall()]
        if not plans:
            raise ConfigError(f"source table {schema}.{table} does not exist")
        cur.execute(_KEY_QUERY, (schema, table))
        key = key_override or tuple(str(r[0]) for r in cur.fetchall())
        compared = [p for p in plans if p.arrow is not None]
        if not compared:
            return plans, key, iter(())
        cur.execute(f"SELECT {', '.join(p.select for p in compared)} FROM {_quote(schema)}.{_quote(table)}")
        return plans, key, iter(cur.fetchall())


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def insert_signal(conn: pymysql.connections.Connection, table: str, row: tuple[str, str, str]) -> None:
    """Insert ``(id, type, data)`` into the connector's signal table ``<database>.<table>``."""
    database, name = table.split(".")
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {_quote(database)}.{_quote(name)} (id, type, data) VALUES (%s, %s, %s)", row)


def column_plan(name: str, data_type: str, column_type: str, precision: int | None, scale: int | None,
                nullable: bool = True, default: str | None = None, *,
                modes: DebeziumModes = DEBEZIUM_DEFAULTS) -> SourceColumn:
    """The :class:`SourceColumn` of a column, from its ``information_schema.COLUMNS`` entry.

    Args:
        name: column name.
        data_type: ``DATA_TYPE`` (``int``, ``decimal``, ``varchar`` ...).
        column_type: ``COLUMN_TYPE`` (``int(10) unsigned``, ``bit(10)``, ``enum('a','b')`` ...).
        precision: ``NUMERIC_PRECISION`` (decimal and bit).
        scale: ``NUMERIC_SCALE`` (decimal).
        nullable: ``IS_NULLABLE``; with ``default`` (``COLUMN_DEFAULT``), what Debezium sends for a
            zero date (``0000-00-00``, or a zero month or day) depends on it.
        modes: the connector's handling modes (docs/types-mysql.md#other-handling-modes).
    """
    data_type, column_type = data_type.lower(), column_type.lower()
    unsigned = "unsigned" in column_type
    ident = _quote(name)

    def plan(arrow: pa.DataType | None, **kwargs: Any) -> SourceColumn:
        return SourceColumn(name, column_type, arrow, ident, **kwargs)

    if data_type in ("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year"):
        return plan(_integer(data_type, unsigned))
    if data_type == "decimal" and modes.decimal_handling_mode == "string":
        return plan(pa.string(), convert=decimal_text)
    if data_type == "decimal" and modes.decimal_handling_mode == "double":
        return plan(pa.float64(), convert=float, normalize=same_nan)
    if data_type == "decimal" and precision is not None and scale is not None:
        if scale > MAX_PRECISION:
            return plan(None, note=f"{column_type}: scale above 38 has no Delta type")
        p = min(max(precision, scale), MAX_PRECISION)
        return plan(pa.decimal128(p, scale), convert=decimal_convert(p, scale))
    if data_type == "float":
        return plan(pa.float32(), normalize=_float32)
    if data_type in ("double", "real"):
        return plan(pa.float64())
    if data_type == "bit":
        if (precision or 1) == 1:
            return plan(pa.bool_(), convert=lambda b: int.from_bytes(b, "big") != 0)
        return plan(pa.binary(), convert=lambda b: bytes(reversed(b)))
    if data_type in _STRINGS:
        return plan(pa.string())
    if data_type == "json":
        return plan(pa.string(), normalize=parse_json)
    if data_type in _BINARIES and modes.binary_handling_mode != "bytes":
        return plan(pa.string(), convert=binary_text(modes.binary_handling_mode))
    if data_type in _BINARIES:
        return plan(pa.binary(), convert=bytes)
    # A zero date (which the client returns as text) is read as what Debezium sends for it.
    if data_type == "date":
        zero_date = _zero_date(nullable, default, date.fromisoformat, EPOCH.date())
        return plan(pa.date32(), convert=lambda d: d if isinstance(d, date) else zero_date)
    connect = modes.time_precision_mode == "connect"  # Kafka Connect's types: milliseconds
    if data_type == "time":
        if connect:
            return plan(pa.int64(), convert=_time_of_day_millis)
        return plan(pa.int64(), convert=lambda t: t // timedelta(microseconds=1))
    if data_type == "datetime":
        zero_datetime = _zero_date(nullable, default, datetime.fromisoformat, EPOCH)
        if connect:  # a Connect Timestamp: an instant
            return plan(pa.timestamp("us", tz="UTC"), convert=lambda d: _instant_millis(d, zero_datetime))
        return plan(pa.timestamp("us"), convert=lambda d: d if isinstance(d, datetime) else zero_datetime)
    if data_type == "timestamp":
        return plan(pa.timestamp("us", tz="UTC"),
                    convert=lambda d: (d if isinstance(d, datetime) else EPOCH).replace(tzinfo=UTC))
    if data_type in _SPATIAL:  # the stored value, as the binlog has it: a 4-byte SRID, then the WKB
        return plan(pa.string(), convert=_point_json if data_type == "point" else _geometry_json, normalize=parse_json)
    return plan(None, note=f"type {column_type} is not compared (no known engine representation for it in verify)")


def _geometry_json(stored: bytes) -> str:
    """A spatial value as Debezium's ``Geometry`` struct: the WKB after the stored SRID, and the SRID
    (0, unset, as null)."""
    return geometry_json(bytes(stored[4:]), int.from_bytes(stored[:4], "little") or None)


def _point_json(stored: bytes) -> str:
    """A ``point`` as Debezium's ``Point`` struct: a ``Geometry`` with the coordinates its WKB holds."""
    wkb = bytes(stored[4:])
    x, y = struct.unpack("<dd" if wkb[0] == 1 else ">dd", wkb[5:21])
    return geometry_json(wkb, int.from_bytes(stored[:4], "little") or None, (x, y))


def _time_of_day_millis(value: timedelta) -> int:
    """A ``time`` as a Connect ``Time`` (``time.precision.mode=connect``): microseconds of the day, to
    the millisecond; a Connect ``Time`` is a time of day, and Debezium sends any other as null."""
    if not timedelta(0) <= value < timedelta(days=1):
        raise NotRepresentable(f"{value} is no time of day, and with time.precision.mode=connect Debezium sends "
                               "it as null")
    return int(to_millis(value // timedelta(microseconds=1)))


def _instant_millis(value: Any, zero_datetime: datetime | None) -> datetime | None:
    """A ``datetime`` as a Connect ``Timestamp`` (``time.precision.mode=connect``): the instant of
    its UTC reading, to the millisecond; a zero date as :func:`_zero_date` says."""
    local = value if isinstance(value, datetime) else zero_datetime
    return None if local is None else to_millis(local).replace(tzinfo=UTC)


def _zero_date(nullable: bool, default: str | None, parse: Callable[[str], Any], epoch: Any) -> Any:
    """What Debezium's MySQL connector sends for a zero ``date`` or ``datetime``: null where the column
    is nullable, else the column's default when that is a date (MariaDB quotes it, MySQL does not),
    else the epoch. (A zero ``timestamp`` is the epoch itself, in any column.)"""
    if nullable:
        return None
    try:
        return parse((default or "").strip("'"))
    except ValueError:  # no default, CURRENT_TIMESTAMP, or a zero date itself
        return epoch


def _integer(data_type: str, unsigned: bool) -> pa.DataType:
    if data_type == "bigint":
        return pa.decimal128(20, 0) if unsigned else pa.int64()
    if data_type in ("int", "integer"):
        return pa.int64() if unsigned else pa.int32()
    if data_type == "smallint":
        return pa.int32() if unsigned else pa.int16()
    if data_type == "tinyint":
        return pa.int16()
    return pa.int32()  # mediumint, year


def _float32(value: Any) -> Any:
    return struct.unpack("f", struct.pack("f", value))[0] if isinstance(value, float) else value


def wait_for_capture(dsn: str, *, timeout: float = 120.0, say: Say | None = None,
                     on_stall: Callable[[], object] | None = None) -> CaptureResult:
    """The binlog position now, for the report; nothing is waited for (see the module's docstring).

    ``timeout`` and ``on_stall`` are accepted for the same call as PostgreSQL's and not used.
    """
    del timeout, on_stall, say
    target = ""
    with connect(dsn) as conn, conn.cursor() as cur:
        try:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        except pymysql.Error:  # the user lacks BINLOG MONITOR / REPLICATION CLIENT: no position to report
            row = None
        if row:
            target = f"{row[0]}:{row[1]}"
    return CaptureResult(target, True, 0.0, visible=False)
