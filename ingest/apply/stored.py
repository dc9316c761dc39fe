"""What a target table stores for a batch's keys: position, coordinates, soft-delete flag, unknown columns."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from ingest.apply.sql import connect, ident, query
from ingest.deltaio import key_range, read_all, table_schema

#: Framework column naming the columns whose value is unknown (an unresolved TOAST placeholder).
UNKNOWN_COLUMNS = "_cdc_unknown_columns"
STORED_SCHEMA = [("s_pos", pa.string()), ("s_part", pa.int32()), ("s_off", pa.int64()), ("s_deleted", pa.bool_()),
                 ("s_unknown", pa.list_(pa.string()))]


def stored_rows(table: DeltaTable | None, key_columns: tuple[str, ...], keys: pa.Table) -> pa.Table:
    """``keys``' stored rows: the key columns, then ``s_pos``, ``s_part``, ``s_off``, ``s_deleted``, ``s_unknown``.

    Args:
        table: the target table (``None``: nothing is stored).
        key_columns: the primary key.
        keys: a table holding (at least) the key columns of the rows to look up.
    """
    names = {f.name: f.type for f in table_schema(table)} if table is not None else {}
    if table is None or keys.num_rows == 0 or not key_columns or any(k not in names for k in key_columns):
        # A table created by a truncate has no key columns yet, and no rows.
        return _empty(keys, key_columns)
    where = key_range(keys, key_columns[0])
    unknown = UNKNOWN_COLUMNS in names
    found = read_all(table, columns=[*key_columns, "_cdc_position", "_cdc_partition", "_cdc_offset", "_cdc_deleted",
                                     *([UNKNOWN_COLUMNS] if unknown else [])], where=where)
    con = connect(found=found, wanted=keys.select(list(key_columns)))
    try:
        match = " AND ".join(f"f.{ident(k)} = w.{ident(k)}" for k in key_columns)
        return query(con, f"""
            SELECT {', '.join('f.' + ident(k) for k in key_columns)}, f._cdc_position AS s_pos,
                   f._cdc_partition AS s_part, f._cdc_offset AS s_off, f._cdc_deleted AS s_deleted,
                   {'f.' + UNKNOWN_COLUMNS if unknown else 'CAST(NULL AS VARCHAR[])'} AS s_unknown
            FROM found f WHERE EXISTS (SELECT 1 FROM wanted w WHERE {match})""")
    finally:
        con.close()


def _empty(keys: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    fields = [keys.schema.field(k) for k in key_columns if k in keys.column_names]
    return pa.schema([*fields, *STORED_SCHEMA]).empty_table()

