"""The journey's step for incremental snapshot reads: find those that contradict what was streamed.

The rule is :mod:`ingest.rules.rereads`; here its inputs are read where they are, as for
primary-key moves (:mod:`ingest.apply.moves`): the batch's changes of the keys an incremental
snapshot read (through the placement, so only those come to the driver), the table's stored rows or
versions of them (through the writer's lookup) and, in hard-delete mode, their remembered deletes.
The stream asks the connector to read the suspect rows again (:mod:`ingest.stream.rereads`). Those
reads are applied by position like any change, but for the ones that follow a delete: those become
that delete at the read's position, since reading again brings back only a row the source holds.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ingest.apply.placement import Placement
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import TableState
from ingest.commit.writer import Writer
from ingest.config import TableSpec
from ingest.lake.delta import table_schema
from ingest.lake.location import LakePath
from ingest.model import ColumnSpec
from ingest.rules.rereads import SuspectReads, suspect_reads


def find_suspect_reads(spec: TableSpec, placement: Placement[Any], changes: Any, key_columns: tuple[str, ...],
                       columns: list[ColumnSpec], state: TableState, writer: Writer, table_path: LakePath,
                       remembered: RememberedDeletes) -> tuple[Any, SuspectReads]:
    """The keys whose incremental snapshot read in ``changes`` contradicts the change streamed before
    it, and ``changes`` with those reads that follow a delete made that delete."""
    keys = placement.incremental_keys(changes, key_columns)
    if not keys.num_rows:
        return changes, SuspectReads(key_columns, ())
    layout = set(placement.layout(changes).names)
    values = [c.name for c in columns if c.name not in key_columns and c.name in layout]
    images = placement.rows_of_keys(changes, keys, [*key_columns, "_cdc_position", "_cdc_offset", "_cdc_op",
                                                    "_cdc_snapshot", "_cdc_toast", *values])
    history = spec.history_mode == "scd2"
    stored = deletes = None
    names = {f.name for f in table_schema(state.table)} if state.table is not None else set()
    if state.table is not None and all(k in names for k in key_columns):
        read = [*key_columns, "_cdc_position", "_cdc_op", "_cdc_deleted",
                *(c for c in ("_cdc_unknown_columns",) if c in names),
                *(("_cdc_end_position", "_cdc_end_op") if history else ()), *(c for c in values if c in names)]
        stored = writer.lookup(table_path)(state.table, key_columns, keys, read)
    if spec.delete_mode == "hard" and not history:
        types = {c.name: c.type for c in columns if c.name in key_columns}
        if len(types) == len(key_columns):
            deletes = remembered.read(key_columns, types, keys)
    suspects = suspect_reads(images, stored, deletes, key_columns, values, history=history)
    if not suspects.deleted:
        return changes, suspects
    return placement.replaced(changes, _as_deletes(placement, changes, suspects)), suspects


def _as_deletes(placement: Placement[Any], changes: Any, suspects: SuspectReads) -> pa.Table:
    """The suspect reads that follow a delete, whole, each made a delete at its own position."""
    names, layout = suspects.key_columns, placement.layout(changes)
    keys = pa.table({k: pa.array([read[i] for read in suspects.deleted], layout.field(k).type)
                     for i, k in enumerate(names)})
    rows = placement.rows_of_keys(changes, keys, layout.names)
    wanted = set(suspects.deleted)
    found = zip(*(rows[c].to_pylist() for c in (*names, "_cdc_position", "_cdc_op", "_cdc_snapshot")), strict=True)
    reads = rows.filter(pa.array([op == "r" and snapshot == "incremental" and tuple(read) in wanted
                                  for *read, op, snapshot in found], pa.bool_()))
    at = reads.schema.get_field_index("_cdc_op")
    return reads.set_column(at, "_cdc_op", pa.array(["d"] * reads.num_rows, reads.schema.field(at).type))
