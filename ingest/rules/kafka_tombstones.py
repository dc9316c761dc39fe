"""Kafka tombstones that are deletes: flattened streams (docs/architecture.md#deletes).

With ``ExtractNewRecordState`` Debezium's default delete handling sends a delete as a tombstone
only (2.5+: ``delete.tombstone.handling.mode=tombstone``; 1.x: ``delete.handling.mode=drop``).
In such a stream the tombstone is the delete of its key. After a full envelope's ``d`` event it
only serves log compaction and changes nothing.

How a stream is known to be flattened: the table's ``kafka_tombstones`` setting (``delete`` /
``ignore``), or with ``auto`` (the default) the records themselves -- a batch holding
``ExtractNewRecordState`` rows says so, and the table remembers it in its Delta log for batches
that hold only tombstones.

A tombstone carries no source position. It deletes its key right after the change it follows:
the latest earlier change of the key on the same partition in the batch (an ASOF join), else the
row the table stores (unless that row came from a later offset of the same partition). Its
position is that change's position at phase 2 (:meth:`ingest.model.SourcePosition.after`), so
it orders before any later change of the key, and an older redelivered change stays stale. A
tombstone that follows a delete (or another tombstone), or finds nothing to delete, is a no-op
counted as skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import laid_out
from ingest.rules.ordering import after_sql
from ingest.rules.sql import connect, ident, key_list, query


def are_deletes(setting: str, batch_flattened: bool | None, table_flattened: bool | None) -> bool:
    """Whether this table's tombstones delete their keys (see module docstring)."""
    if setting != "auto":
        return setting == "delete"
    known = batch_flattened if batch_flattened is not None else table_flattened
    return bool(known)


@dataclass(slots=True)
class Resolution:
    """What the batch's tombstones became.

    Attributes:
        deletes: derived deletes, shaped like the batch's ``changes``.
        unusable: tombstones whose key columns are not the table's (framework columns, with
            ``_cdc_reason``); they go to quarantine.
        skipped: no-op tombstones.
    """

    deletes: pa.Table
    unusable: pa.Table
    skipped: int


def resolve(tombstones: pa.Table, changes: pa.Table, key_columns: tuple[str, ...], *,
            stored_of: Callable[[pa.Table], pa.Table]) -> Resolution:
    """Turn tombstones into positioned deletes (see module docstring).

    Args:
        tombstones: the batch's tombstones whose key decoded.
        changes: the batch's changes (at least their key columns, ``_cdc_partition``, ``_cdc_offset``,
            ``_cdc_position`` and ``_cdc_op``), in the layout the derived deletes take.
        stored_of: what the table stores for some keys (a table of their key columns), in the shape
            of :func:`ingest.apply.stored.stored_rows`: called for the tombstones that follow no
            change of their key in the batch.
    """
    wanted = json.dumps(list(key_columns))
    same_key = pc.equal(tombstones["_cdc_key_columns"], wanted)
    unusable = tombstones.filter(pc.invert(same_key))
    reason = f"tombstone: primary key columns differ from the table's {list(key_columns)}"
    unusable = unusable.set_column(unusable.schema.get_field_index("_cdc_reason"), "_cdc_reason",
                                   pa.array([reason] * unusable.num_rows, pa.string()))
    tombs = tombstones.filter(same_key)
    if tombs.num_rows == 0:
        return Resolution(changes.schema.empty_table(), unusable, 0)
    tombs = tombs.select([*key_columns, "_cdc_topic", "_cdc_partition", "_cdc_offset", "_cdc_timestamp"])
    tombs = tombs.cast(pa.schema([changes.schema.field(k) if k in changes.column_names else tombs.schema.field(k)
                                  for k in key_columns] + list(tombs.schema)[len(key_columns):]))
    candidates = changes.filter(pc.not_equal(changes["_cdc_op"], "t")).select(
        [*key_columns, "_cdc_partition", "_cdc_offset", "_cdc_position", "_cdc_op"])
    keys = key_list(key_columns)
    con = connect(tombs=tombs, candidates=candidates)
    try:
        based = query(con, f"""
            WITH c AS (SELECT {keys}, _cdc_partition, _cdc_offset, _cdc_position, _cdc_op FROM candidates
                       UNION ALL SELECT {keys}, _cdc_partition, _cdc_offset, NULL, 'd' FROM tombs)
            SELECT t.*, c._cdc_position AS base_pos, c._cdc_op AS base_op
            FROM tombs t ASOF LEFT JOIN c ON {' AND '.join(f't.{ident(k)} = c.{ident(k)}' for k in key_columns)}
                 AND t._cdc_partition = c._cdc_partition AND t._cdc_offset > c._cdc_offset""")
        con.register("based", based)
        pending = query(con, "SELECT * FROM based WHERE base_op IS NULL")
        con.register("stored", stored_of(pending))
        match = " AND ".join(f"b.{ident(k)} = s.{ident(k)}" for k in key_columns)
        resolved = query(con, f"""
            SELECT b.* EXCLUDE (base_pos, base_op),
                   CASE WHEN b.base_op = 'd' THEN NULL
                        WHEN b.base_op IS NOT NULL THEN {after_sql('b.base_pos')}
                        WHEN s.s_pos IS NULL OR s.s_deleted THEN NULL
                        WHEN s.s_part = b._cdc_partition AND s.s_off > b._cdc_offset THEN NULL
                        ELSE {after_sql('s.s_pos')} END AS _cdc_position
            FROM based b LEFT JOIN stored s ON {match}""")
    finally:
        con.close()
    deleting = resolved.filter(pc.is_valid(resolved["_cdc_position"]))
    return Resolution(_as_changes(deleting, changes.schema, key_columns), unusable,
                      resolved.num_rows - deleting.num_rows)


def _as_changes(deletes: pa.Table, schema: pa.Schema, key_columns: tuple[str, ...]) -> pa.Table:
    """Derived deletes in the ``changes`` layout (the tombstone's Kafka time stands for the source's)."""
    n = deletes.num_rows
    given = {
        "_cdc_kind": pa.array(["change"] * n, pa.string()), "_cdc_op": pa.array(["d"] * n, pa.string()),
        "_cdc_position": deletes["_cdc_position"], "_cdc_topic": deletes["_cdc_topic"],
        "_cdc_partition": deletes["_cdc_partition"], "_cdc_offset": deletes["_cdc_offset"],
        "_cdc_timestamp": deletes["_cdc_timestamp"], "_cdc_source_ts": deletes["_cdc_timestamp"],
        "_cdc_flattened": pa.array([True] * n, pa.bool_()),
        "_cdc_key_columns": pa.array([json.dumps(list(key_columns))] * n, pa.string()),
        **{k: deletes[k] for k in key_columns},
    }
    return laid_out(pa.table(given), schema)

