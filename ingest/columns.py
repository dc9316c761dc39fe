"""A target table's columns: Delta types as Arrow types, the framework's columns, Arrow's plain form.

What every stage agrees on about a table's layout, with nothing but Arrow: the decode step types
columns with it, the rules shape their output with it, the lake reads and writes with it.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from ingest.model import parse_decimal

#: Framework columns on every target table, after the user columns.
FRAMEWORK_COLUMNS: Final[tuple[tuple[str, pa.DataType], ...]] = (
    ("_cdc_op", pa.string()),
    ("_cdc_position", pa.string()),
    ("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
    ("_cdc_topic", pa.string()),
    ("_cdc_partition", pa.int32()),
    ("_cdc_offset", pa.int64()),
    ("_cdc_ingested_at", pa.timestamp("us", tz="UTC")),
    ("_cdc_deleted", pa.bool_()),
    # Columns whose value is unknown: an unchanged-TOAST placeholder with no stored value to keep.
    ("_cdc_unknown_columns", pa.list_(pa.string())),
)
#: Framework columns of a ``history_mode: scd2`` table, after :data:`FRAMEWORK_COLUMNS`: each row is
#: one version of its key, valid from ``_cdc_valid_from`` until ``_cdc_valid_to`` (the source commit
#: time of the change that ended it: the next version, a delete or a truncate; null while current).
HISTORY_COLUMNS: Final[tuple[tuple[str, pa.DataType], ...]] = (
    ("_cdc_valid_from", pa.timestamp("us", tz="UTC")),
    ("_cdc_valid_to", pa.timestamp("us", tz="UTC")),
    ("_cdc_is_current", pa.bool_()),
    # The change that ended the version: its position and op ('d' delete, 't' truncate, else the next version's).
    ("_cdc_end_position", pa.string()),
    ("_cdc_end_op", pa.string()),
)
FRAMEWORK_NAMES: Final = frozenset(name for name, _ in FRAMEWORK_COLUMNS + HISTORY_COLUMNS)

_PRIMITIVE_TO_ARROW: Final[dict[str, pa.DataType]] = {
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    # A schemaless JSON column that was null in every message seen (ingest.decode.semantic.infer_image):
    # any type holds it; a table never stores it (ingest.rules.schema.plan_schema).
    "void": pa.null(),
}


def arrow_type(delta_type: str) -> pa.DataType:
    """Arrow type for a Delta primitive type name."""
    dec = parse_decimal(delta_type)
    if dec is not None:
        return pa.decimal128(*dec)
    return _PRIMITIVE_TO_ARROW[delta_type]


def delta_type_name(arrow: pa.DataType) -> str:
    """Delta primitive type name for an Arrow type read back from a table."""
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    if pa.types.is_timestamp(arrow):
        return "timestamp" if arrow.tz else "timestamp_ntz"
    if pa.types.is_large_string(arrow) or pa.types.is_string_view(arrow):
        return "string"
    if pa.types.is_large_binary(arrow) or pa.types.is_binary_view(arrow):
        return "binary"
    for name, typ in _PRIMITIVE_TO_ARROW.items():
        if typ == arrow:
            return name
    return str(arrow)


def laid_out(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` in ``schema``: each field's column found by name and cast to the field's type, nulls
    for a field ``rows`` lacks; columns ``schema`` does not name are left out."""
    have = set(rows.column_names)
    return pa.Table.from_arrays([rows[f.name].cast(f.type) if f.name in have else pa.nulls(rows.num_rows, f.type)
                                 for f in schema], schema=schema)


def normalize(table: pa.Table) -> pa.Table:
    """Turn view/large string and binary types (also inside lists) into plain ones for comparisons and pylist."""
    fields = [pa.field(f.name, _plain(f.type), f.nullable) for f in table.schema]
    schema = pa.schema(fields)
    return table.cast(schema) if schema != table.schema else table


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(_plain(t.value_type))
    return t
