"""The journey's step for primary-key moves: gather what is known of the old keys, fill the moved rows.

The rule is :mod:`ingest.rules.moved`; here its inputs are read where they are: the batch's changes
of the old keys (through the placement, so only those come to the driver), the table's stored rows
or versions of them (through the writer's lookup) and, for a table whose deletes remove rows
(``delete_mode: hard``, current rows only), the *moves table* ``_cdc_moves/<table>``: for each
delete of a move, the old key, the delete's position and the row it removed (an Arrow IPC image). It
is a :class:`~ingest.lake.side.SideTable`: a stream keeps it open and packs it behind its batches.
A soft delete or an scd2 version keeps those values in the table itself; a hard delete would lose
them when the new key's create comes in a later batch, so the step records them before the commit,
idempotently (a replay finds them there).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ingest.apply.placement import Placement
from ingest.commit.state import TableState
from ingest.commit.writer import Writer
from ingest.config import TableSpec
from ingest.decode.parts import read_parts, write_parts
from ingest.lake.delta import open_table, quote, table_schema, utc_literal, write_table
from ingest.lake.location import LakePath
from ingest.lake.lookup import rows_of_keys
from ingest.lake.side import SideTable
from ingest.model import ColumnSpec
from ingest.rules.moved import (
    HISTORY_COLUMNS,
    Event,
    Histories,
    batch_events,
    before_move,
    fill_moved,
    merged,
    old_key_of,
    stored_events,
    typed_key,
)

#: The moves table's columns.
MOVES_SCHEMA = pa.schema([("old_key", pa.string()), ("position", pa.string()), ("image", pa.binary()),
                          ("recorded_at", pa.timestamp("us", tz="UTC"))])


def fill_moves(spec: TableSpec, placement: Placement[Any], changes: Any, key_columns: tuple[str, ...],
               columns: list[ColumnSpec], state: TableState, writer: Writer, table_path: LakePath,
               moves: SideTable) -> Any:
    """``changes`` with moved rows' unchanged values filled from their old keys' rows; in hard-delete
    mode the rows the batch's move deletes remove are recorded."""
    found = placement.moved(changes)
    if not found.num_rows:
        return changes
    key_types = {k: found.schema.field(k).type for k in key_columns}
    deleting = pc.equal(found["_cdc_op"], "d")
    creates = found.filter(pc.invert(deleting))
    records = spec.delete_mode == "hard" and spec.history_mode != "scd2"
    deletes = found.filter(deleting) if records else found.slice(0, 0)
    named = (typed_key(old_key_of(t, key_columns), key_columns, key_types) for t in creates["_cdc_old_key"].to_pylist())
    keys = {key for key in named if key is not None}
    keys |= {tuple(r[k] for k in key_columns) for r in deletes.select(list(key_columns)).to_pylist()}
    if not keys:
        return changes
    olds = pa.table({k: pa.array([key[i] for key in keys], key_types[k]) for i, k in enumerate(key_columns)})
    layout = set(placement.layout(changes).names)
    values = [c.name for c in columns if c.name not in key_columns and c.name in layout]
    wanted = values if deletes.num_rows else sorted(
        {c for names in creates["_cdc_toast"].to_pylist() for c in names or () if c in layout})
    images = placement.rows_of_keys(changes, olds, [*key_columns, *HISTORY_COLUMNS, *wanted])
    history = batch_events(images, key_columns, wanted)
    if state.table is not None:
        history = merged(history, _stored(spec, state, writer, table_path, key_columns, olds, wanted))
    if records:
        history = merged(history, _recorded(moves, olds, key_columns))
    filled, count = fill_moved(creates, history, key_columns, key_types)
    if deletes.num_rows:
        _record(moves, deletes, history, key_columns)
    return placement.replaced(changes, filled) if count else changes


def _stored(spec: TableSpec, state: TableState, writer: Writer, table_path: LakePath, key_columns: tuple[str, ...],
            olds: pa.Table, wanted: list[str]) -> Histories:
    """The old keys' stored rows (an scd2 table: their versions) as events."""
    assert state.table is not None
    names = {f.name for f in table_schema(state.table)}
    if any(k not in names for k in key_columns):
        return {}
    scd2 = spec.history_mode == "scd2"
    read = [*key_columns, "_cdc_position", "_cdc_deleted", *(c for c in ("_cdc_unknown_columns",) if c in names),
            *(("_cdc_end_position", "_cdc_end_op") if scd2 else ()), *(c for c in wanted if c in names)]
    stored = writer.lookup(table_path)(state.table, key_columns, olds, read)
    return stored_events(stored, key_columns, [c for c in wanted if c in names], history=scd2)


def _recorded(moves: SideTable, olds: pa.Table, key_columns: tuple[str, ...]) -> Histories:
    """The rows earlier move deletes of the old keys removed, each with its delete, as events."""
    table = moves.latest()
    if table is None:
        return {}
    texts = {key_text(tuple(r[k] for k in key_columns)): tuple(r[k] for k in key_columns) for r in olds.to_pylist()}
    rows = rows_of_keys(table, ("old_key",), pa.table({"old_key": pa.array(sorted(texts), pa.string())}),
                        ["old_key", "position", "image"])
    out: Histories = {}
    for r in rows.to_pylist():
        image = pa.Table.from_batches(read_parts([r["image"]])).to_pylist()[0]
        events = out.setdefault(texts[r["old_key"]], [])
        events += [Event(r["position"], 0, False, image), Event(r["position"], 1, True, {})]
    return out


def _record(moves: SideTable, deletes: pa.Table, history: Histories, key_columns: tuple[str, ...]) -> None:
    """Record, for each move delete whose row is known, the row it removes (idempotently)."""
    out = []
    for row in deletes.to_pylist():
        key = tuple(row[k] for k in key_columns)
        values = before_move(history.get(key, []), row["_cdc_position"])
        if not values:
            continue
        image = pa.RecordBatch.from_pylist([values], schema=pa.schema(
            [deletes.schema.field(c) for c in values if c in deletes.schema.names]))
        out.append({"old_key": key_text(key), "position": row["_cdc_position"],
                    "image": write_parts([image]).column(0)[0].as_py(),
                    "recorded_at": datetime.now(UTC)})
    if not out:
        return
    source = pa.Table.from_pylist(out, schema=MOVES_SCHEMA)
    moves.settle()  # two writers of one table would conflict: the packing behind the last record first
    table = moves.latest()
    if table is None:
        write_table(moves.path, source, mode="append")
        return
    on = " AND ".join(f"t.{quote(c)} = s.{quote(c)}" for c in ("old_key", "position"))
    DeltaTable.merge(table, source, on, source_alias="s", target_alias="t").when_not_matched_insert_all().execute()
    moves.wrote()


def purge_moves(path: LakePath, older_than: datetime) -> int:
    """Forget the rows of moves recorded before ``older_than`` (``ingest maintain``, with the tombstones);
    returns how many."""
    table = open_table(path)
    if table is None:
        return 0
    result = table.delete(f"recorded_at < {utc_literal(older_than.replace(microsecond=0))}")
    return int(result.get("num_deleted_rows", 0))


def key_text(key: tuple[Any, ...]) -> str:
    """A key as the moves table names it (JSON of its typed values)."""
    return json.dumps(list(key), default=str)
