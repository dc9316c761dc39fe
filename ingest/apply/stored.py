"""What a target table stores for a batch's keys: position, coordinates, soft-delete flag, unknown columns.

Read through a :class:`~ingest.lake.lookup.KeyLookup` (the writer's), in the shape the merge plan
reads (:data:`~ingest.rules.plan.STORED_SCHEMA`).
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from ingest.lake.delta import table_schema
from ingest.lake.lookup import KeyLookup, rows_of_keys
from ingest.rules.plan import STORED_SCHEMA, UNKNOWN_COLUMNS


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

