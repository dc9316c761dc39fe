"""The journey's step for incremental snapshot reads: find those that contradict what was streamed.

The rule is :mod:`ingest.rules.rereads`; here its inputs are read where they are, as for
primary-key moves (:mod:`ingest.apply.moves`): the batch's changes of the keys an incremental
snapshot read (through the placement, so only those come to the driver), the table's stored rows or
versions of them (through the writer's lookup) and, in hard-delete mode, their remembered deletes.
Nothing is changed: the reads are applied by position like any change, and the stream asks the
connector to read the suspect rows again (:meth:`ingest.stream.callback.BatchCallback.reread`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.apply.moves import stored_history
from ingest.apply.placement import Placement
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import TableState
from ingest.commit.writer import Writer
from ingest.config import TableSpec
from ingest.lake.location import LakePath
from ingest.model import ColumnSpec
from ingest.rules.moved import HISTORY_COLUMNS, Event, Histories, batch_events, merged
from ingest.rules.rereads import SuspectReads, suspect_reads


def find_suspect_reads(spec: TableSpec, placement: Placement[Any], changes: Any, key_columns: tuple[str, ...],
                       columns: list[ColumnSpec], state: TableState, writer: Writer, table_path: LakePath,
                       remembered: RememberedDeletes) -> SuspectReads:
    """The keys whose incremental snapshot read in ``changes`` contradicts the change streamed before it."""
    keys = placement.incremental_keys(changes, key_columns)
    if not keys.num_rows:
        return SuspectReads(key_columns, ())
    layout = set(placement.layout(changes).names)
    values = [c.name for c in columns if c.name not in key_columns and c.name in layout]
    images = placement.rows_of_keys(changes, keys, [*key_columns, *HISTORY_COLUMNS, "_cdc_snapshot", *values])
    history = batch_events(images, key_columns, values)
    if state.table is not None:
        history = merged(history, stored_history(spec, state, writer, table_path, key_columns, keys, values))
    if spec.delete_mode == "hard" and spec.history_mode != "scd2":
        types = {c.name: c.type for c in columns if c.name in key_columns}
        history = merged(history, _remembered(remembered, key_columns, types, keys))
    reads = images.filter(pc.equal(images["_cdc_snapshot"], "incremental"))
    return suspect_reads(reads, history, key_columns, values)


def _remembered(remembered: RememberedDeletes, key_columns: tuple[str, ...], types: dict[str, str],
                keys: pa.Table) -> Histories:
    """The keys' remembered deletes (a hard delete leaves no row), as events."""
    if len(types) != len(key_columns):
        return {}
    rows = remembered.read(key_columns, types, keys)
    out: Histories = {}
    for r in (rows.to_pylist() if rows is not None else ()):
        out.setdefault(tuple(r[k] for k in key_columns), []).append(Event(r["_cdc_position"], 1, True, {}))
    return out
