"""Debezium's wire types for PostgreSQL: schemas and value encodings, Avro and Connect JSON.

Schemas come in the two shapes the converters write:

* Avro, as Confluent's ``AvroConverter`` renders a Connect schema: semantic types keep their
  Connect name in ``connect.name`` (plus ``connect.version`` and ``connect.parameters``), optional
  fields become ``["null", T]`` unions with ``"default": null``, ``INT16`` becomes
  ``{"type": "int", "connect.type": "int16"}``, ``Decimal`` adds Avro's ``decimal`` logical type.
* Connect JSON, as ``JsonConverter`` (``schemas.enable=true``) renders it: ``type`` / ``optional``
  / ``name`` / ``version`` / ``parameters`` / ``field``.

Names follow Debezium: ``<prefix>.public.<table>.Key`` / ``.Value`` / ``.Envelope``,
``io.debezium.connector.postgresql.Source`` and the ``event.block`` transaction block.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, Literal

from harness.simulator.model import EPOCH_DATE, UTC, Column, Row, TableDef

ValueFormat = Literal["avro", "json"]
#: What Debezium writes for an unchanged TOASTed column (``unavailable.value.placeholder``).
UNAVAILABLE_VALUE: Final = "__debezium_unavailable_value"
_EPOCH: Final = dt.datetime(1970, 1, 1)
_ONE_US: Final = dt.timedelta(microseconds=1)

#: Values the ``source.snapshot`` enum may take in Debezium 2.x/3.x.
SNAPSHOT_ALLOWED: Final = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
_VSD_NAME: Final = "io.debezium.data.VariableScaleDecimal"
_VSD_DOC: Final = "Variable scaled decimal"

_AVRO_PLAIN: Final[dict[str, Any]] = {
    "int16": {"type": "int", "connect.type": "int16"},
    "int32": "int",
    "int64": "long",
    "boolean": "boolean",
    "string": "string",
}
_SEMANTIC: Final[dict[str, tuple[str, str, str]]] = {
    # kind: (avro primitive, connect primitive, connect name)
    "date": ("int", "int32", "io.debezium.time.Date"),
    "micro_timestamp": ("long", "int64", "io.debezium.time.MicroTimestamp"),
    "zoned_timestamp": ("string", "string", "io.debezium.time.ZonedTimestamp"),
    "json": ("string", "string", "io.debezium.data.Json"),
    "enum": ("string", "string", "io.debezium.data.Enum"),
}
_CONNECT_PLAIN: Final = {"int16": "int16", "int32": "int32", "int64": "int64", "boolean": "boolean",
                         "string": "string"}


def _namespace(prefix: str, table: TableDef) -> str:
    return f"{prefix}.public.{table.name}"


def _optional(column: Column, nullable_key: bool, table: TableDef) -> bool:
    return column.nullable or (nullable_key and column.name in table.key)


# -- Avro -------------------------------------------------------------------------------------
def avro_type(column: Column, defined: set[str]) -> Any:
    """The Avro type of a non-null value of ``column``.

    Args:
        column: the column.
        defined: full names of named types already written in this schema; Avro allows a named
            type to be defined once, later uses refer to it by name.
    """
    kind = column.kind
    if kind in _AVRO_PLAIN:
        plain = _AVRO_PLAIN[kind]
        return dict(plain) if isinstance(plain, dict) else plain
    if kind == "decimal":
        p, s = column.precision, column.scale
        return {
            "type": "bytes", "scale": s, "precision": p, "connect.version": 1,
            "connect.parameters": {"scale": str(s), "connect.decimal.precision": str(p)},
            "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal",
        }
    if kind == "variable_decimal":
        if _VSD_NAME in defined:
            return _VSD_NAME
        defined.add(_VSD_NAME)
        return {
            "type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
            "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
            "doc": _VSD_DOC, "connect.version": 1, "connect.name": _VSD_NAME,
        }
    primitive, _, name = _SEMANTIC[kind]
    out: dict[str, Any] = {"type": primitive, "connect.version": 1}
    if kind == "enum":
        out["connect.parameters"] = {"allowed": ",".join(column.allowed)}
    out["connect.name"] = name
    return out


def _avro_record(prefix: str, table: TableDef, name: str, columns: tuple[Column, ...],
                 nullable_key: bool) -> dict[str, Any]:
    defined: set[str] = set()
    fields = []
    for col in columns:
        base = avro_type(col, defined)
        if _optional(col, nullable_key, table):
            fields.append({"name": col.name, "type": ["null", base], "default": None})
        else:
            fields.append({"name": col.name, "type": base})
    ns = _namespace(prefix, table)
    return {"type": "record", "name": name, "namespace": ns, "fields": fields, "connect.name": f"{ns}.{name}"}


def avro_key_schema(prefix: str, table: TableDef, *, nullable_key: bool = False) -> dict[str, Any]:
    """``<prefix>.public.<table>.Key``: the primary-key columns."""
    return _avro_record(prefix, table, "Key", table.key_columns, nullable_key)


def _opt_long(name: str) -> dict[str, Any]:
    return {"name": name, "type": ["null", "long"], "default": None}


def avro_source_schema() -> dict[str, Any]:
    """``io.debezium.connector.postgresql.Source``."""
    snapshot = {
        "type": "string", "connect.version": 1, "connect.parameters": {"allowed": SNAPSHOT_ALLOWED},
        "connect.default": "false", "connect.name": "io.debezium.data.Enum",
    }
    return {
        "type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "connector", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            # A union whose default is not null lists the non-null branch first (Avro rule).
            {"name": "snapshot", "type": [snapshot, "null"], "default": "false"},
            {"name": "db", "type": "string"},
            {"name": "sequence", "type": ["null", "string"], "default": None},
            _opt_long("ts_us"),
            _opt_long("ts_ns"),
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
            _opt_long("txId"),
            _opt_long("lsn"),
            _opt_long("xmin"),
        ],
        "connect.version": 1,
        "connect.name": "io.debezium.connector.postgresql.Source",
    }


def avro_envelope_schema(prefix: str, table: TableDef, *, nullable_key: bool = False) -> dict[str, Any]:
    """``<prefix>.public.<table>.Envelope`` with before/after, source, transaction, op, ts_*."""
    value = _avro_record(prefix, table, "Value", table.columns, nullable_key)
    block = {
        "type": "record", "name": "block", "namespace": "event",
        "fields": [{"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
                   {"name": "data_collection_order", "type": "long"}],
        "connect.version": 1, "connect.name": "event.block",
    }
    ns = _namespace(prefix, table)
    return {
        "type": "record", "name": "Envelope", "namespace": ns,
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": avro_source_schema()},
            {"name": "transaction", "type": ["null", block], "default": None},
            {"name": "op", "type": "string"},
            _opt_long("ts_ms"),
            _opt_long("ts_us"),
            _opt_long("ts_ns"),
        ],
        "connect.version": 2,
        "connect.name": f"{ns}.Envelope",
    }


# -- Connect JSON -----------------------------------------------------------------------------
def connect_type(column: Column, optional: bool) -> dict[str, Any]:
    """The Connect JSON schema of ``column`` (without the ``field`` name)."""
    kind = column.kind
    if kind in _CONNECT_PLAIN:
        return {"type": _CONNECT_PLAIN[kind], "optional": optional}
    if kind == "decimal":
        return {
            "type": "bytes", "optional": optional, "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": str(column.scale), "connect.decimal.precision": str(column.precision)},
        }
    if kind == "variable_decimal":
        return {
            "type": "struct",
            "fields": [{"type": "int32", "optional": False, "field": "scale"},
                       {"type": "bytes", "optional": False, "field": "value"}],
            "optional": optional, "name": _VSD_NAME, "version": 1, "doc": _VSD_DOC,
        }
    _, primitive, name = _SEMANTIC[kind]
    out: dict[str, Any] = {"type": primitive, "optional": optional, "name": name, "version": 1}
    if kind == "enum":
        out["parameters"] = {"allowed": ",".join(column.allowed)}
    return out


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return {**schema, "field": name}


def _connect_struct(prefix: str, table: TableDef, name: str, columns: tuple[Column, ...],
                    optional: bool, nullable_key: bool) -> dict[str, Any]:
    return {
        "type": "struct",
        "fields": [_field(connect_type(c, _optional(c, nullable_key, table)), c.name) for c in columns],
        "optional": optional,
        "name": f"{_namespace(prefix, table)}.{name}",
    }


def connect_key_schema(prefix: str, table: TableDef, *, nullable_key: bool = False) -> dict[str, Any]:
    """The JSON schema of the Kafka key."""
    return _connect_struct(prefix, table, "Key", table.key_columns, False, nullable_key)


def connect_source_schema() -> dict[str, Any]:
    """``io.debezium.connector.postgresql.Source`` as Connect JSON."""
    def f(name: str, type_: str, optional: bool = False) -> dict[str, Any]:
        return {"type": type_, "optional": optional, "field": name}

    snapshot = {"type": "string", "optional": True, "default": "false", "name": "io.debezium.data.Enum",
                "version": 1, "parameters": {"allowed": SNAPSHOT_ALLOWED}, "field": "snapshot"}
    return {
        "type": "struct",
        "fields": [
            f("version", "string"), f("connector", "string"), f("name", "string"), f("ts_ms", "int64"),
            snapshot, f("db", "string"), f("sequence", "string", True), f("ts_us", "int64", True),
            f("ts_ns", "int64", True), f("schema", "string"), f("table", "string"),
            f("txId", "int64", True), f("lsn", "int64", True), f("xmin", "int64", True),
        ],
        "optional": False,
        "name": "io.debezium.connector.postgresql.Source",
        "version": 1,
        "field": "source",
    }


def connect_envelope_schema(prefix: str, table: TableDef, *, nullable_key: bool = False) -> dict[str, Any]:
    """The JSON schema of the Kafka value (the envelope)."""
    value = _connect_struct(prefix, table, "Value", table.columns, True, nullable_key)
    block = {
        "type": "struct",
        "fields": [{"type": "string", "optional": False, "field": "id"},
                   {"type": "int64", "optional": False, "field": "total_order"},
                   {"type": "int64", "optional": False, "field": "data_collection_order"}],
        "optional": True, "name": "event.block", "version": 1, "field": "transaction",
    }
    return {
        "type": "struct",
        "fields": [
            _field(value, "before"),
            _field(value, "after"),
            connect_source_schema(),
            block,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
        ],
        "optional": False,
        "name": f"{_namespace(prefix, table)}.Envelope",
        "version": 2,
    }


# -- value conversions -----------------------------------------------------------------------
def unscaled_bytes(unscaled: int) -> bytes:
    """Two's-complement big-endian bytes of minimal length, as Java's ``BigInteger.toByteArray``."""
    bits = (unscaled if unscaled >= 0 else ~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def variable_scale(value: Decimal) -> tuple[int, bytes]:
    """``(scale, unscaled bytes)`` of a ``VariableScaleDecimal``."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int), "NaN/Infinity cannot be encoded"
    scale = max(0, -exponent)
    return scale, unscaled_bytes(int(value.scaleb(scale)))


def micro_timestamp(value: dt.datetime) -> int:
    """``io.debezium.time.MicroTimestamp``: microseconds since the epoch, no time zone."""
    return (value - _EPOCH) // _ONE_US


def epoch_days(value: dt.date) -> int:
    """``io.debezium.time.Date``: days since the epoch."""
    return value.toordinal() - EPOCH_DATE.toordinal()


def zoned_timestamp(value: dt.datetime) -> str:
    """``io.debezium.time.ZonedTimestamp``: ISO-8601 in UTC, fraction without trailing zeros.

    Debezium formats with Java's ``ISO_OFFSET_DATE_TIME``, so a whole second has no fraction
    and ``.120000`` becomes ``.12``; decoders must accept every width.
    """
    v = value.astimezone(UTC)
    text = f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:{v.second:02d}"
    if v.microsecond:
        text += "." + f"{v.microsecond:06d}".rstrip("0")
    return text + "Z"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


Converter = Callable[[Any], Any] | None


def _converter(column: Column, target: ValueFormat) -> Converter:
    """How a source value of ``column`` becomes a datum of ``target``; ``None`` means as-is."""
    kind = column.kind
    if kind == "date":
        return epoch_days
    if kind == "micro_timestamp":
        return micro_timestamp
    if kind == "zoned_timestamp":
        return zoned_timestamp
    if kind == "variable_decimal":
        def vsd(value: Decimal) -> dict[str, Any]:
            scale, raw = variable_scale(value)
            return {"scale": scale, "value": raw if target == "avro" else _b64(raw)}
        return vsd
    if kind == "decimal" and target == "json":
        scale = column.scale or 0
        return lambda value: _b64(unscaled_bytes(int(value.scaleb(scale))))
    # fastavro writes decimal.Decimal itself through the decimal logical type.
    return None


class ImageConverter:
    """Converts row images of one table version, with per-column converters resolved once."""

    def __init__(self, table: TableDef, target: ValueFormat) -> None:
        self._steps = [(c.name, _converter(c, target)) for c in table.columns]

    def __call__(self, row: Row | None) -> dict[str, Any] | None:
        return None if row is None else self.row(row)

    def row(self, row: Row) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, conv in self._steps:
            value = row.get(name)
            # The TOAST placeholder is a string in any column; it never goes through a converter.
            out[name] = value if conv is None or value is None or value == UNAVAILABLE_VALUE else conv(value)
        return out
