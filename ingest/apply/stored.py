"""What a target table stores for a batch's keys: position, coordinates, soft-delete flag, unknown columns.

Every read of stored rows by key on the driver goes through a :class:`KeyLookup`: :func:`rows_of_keys`
reads them with delta-rs; the delta-spark writer gives one that reads a large table on Spark's
executors (:meth:`ingest.commit.delta_spark.DeltaSparkWriter.lookup`). The rows come in the shape
the merge plan reads (:data:`~ingest.apply.rules.plan.STORED_SCHEMA`).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from deltalake import DeltaTable

from ingest.apply.rules.plan import STORED_SCHEMA, UNKNOWN_COLUMNS
from ingest.apply.rules.sql import connect, ident, query
from ingest.lake.delta import key_range, read_all, table_schema


class KeyLookup(Protocol):
    """Reads the stored rows whose key is among ``keys``' (``columns`` of them, default all), as
    :func:`rows_of_keys` does."""

    def __call__(self, table: DeltaTable, key_columns: tuple[str, ...], keys: pa.Table,
                 columns: list[str] | None = None) -> pa.Table: ...


def rows_of_keys(table: DeltaTable, key_columns: tuple[str, ...], keys: pa.Table,
                 columns: list[str] | None = None) -> pa.Table:
    """The stored rows whose key is among ``keys``' (``columns`` of them, default all).

    The read is bounded by the range of the first key column (Delta skips the files outside it),
    then narrowed to the keys themselves.
    """
    found = read_all(table, columns=columns, where=key_range(keys, key_columns[0]))
    con = connect(found=found, wanted=keys.select(list(key_columns)))
    try:
        match = " AND ".join(f"f.{ident(k)} = w.{ident(k)}" for k in key_columns)
        return query(con, f"SELECT f.* FROM found f WHERE EXISTS (SELECT 1 FROM wanted w WHERE {match})")
    finally:
        con.close()


def stored_rows(table: DeltaTable | None, key_columns: tuple[str, ...], keys: pa.Table, *,
                lookup: KeyLookup = rows_of_keys) -> pa.Table:
    """``keys``' stored rows: the key columns, then ``s_pos``, ``s_part``, ``s_off``, ``s_deleted``, ``s_unknown``.

    Args:
        table: the target table (``None``: nothing is stored).
        key_columns: the primary key.
        keys: a table holding (at least) the key columns of the rows to look up.
        lookup: what reads them (default :func:`rows_of_keys`, on the driver).
    """
    names = {f.name: f.type for f in table_schema(table)} if table is not None else {}
    if table is None or keys.num_rows == 0 or not key_columns or any(k not in names for k in key_columns):
        # A table created by a truncate has no key columns yet, and no rows.
        return _empty(keys, key_columns)
    unknown = UNKNOWN_COLUMNS in names
    wanted = [*key_columns, "_cdc_position", "_cdc_partition", "_cdc_offset", "_cdc_deleted",
              *([UNKNOWN_COLUMNS] if unknown else [])]
    found = lookup(table, key_columns, keys, wanted)
    if not unknown:
        found = found.append_column(UNKNOWN_COLUMNS, pa.nulls(found.num_rows, pa.list_(pa.string())))
    return found.rename_columns([*key_columns, *(name for name, _ in STORED_SCHEMA)])


def _empty(keys: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    fields = [keys.schema.field(k) for k in key_columns if k in keys.column_names]
    return pa.schema([*fields, *STORED_SCHEMA]).empty_table()

