"""Apply one table's reduced batch as one Delta commit (DESIGN 3.1-3.5, 3.8, 3.9).

The journey of a batch through this module:

1. read the table's state (columns, key, truncate mark) and plan schema evolution;
2. look up the stored position of every key in the batch (and its tombstone in hard-delete mode)
   and classify each change: insert, update, delete, or stale (not newer than what is stored);
3. record tombstones of deletes (hard mode) so no older event can bring a key back;
4. one MERGE -- inserts, updates, deletes and a truncate together -- guarded by position again in
   its predicates, carrying the batch's offsets as app transactions and its audit record in the
   commit info; a batch with nothing to change still commits its progress markers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from ingest import faults, tombstones
from ingest.deltaio import (
    FRAMEWORK_COLUMNS,
    arrow_type,
    open_table,
    query,
    quote,
    read_all,
    sql_string,
)
from ingest.errors import CommitConflictError, OffsetsConflictError, TableError
from ingest.events import UNAVAILABLE, ColumnSpec
from ingest.mergeplan import (
    UNKNOWN_COLUMNS,
    classify,
    keeps_truncated,
    matched_deletes,
    revert_stale_toast_fills,
    stored_rows,
    unknown_columns,
)
from ingest.ordering import later_than_stored, later_than_stored_sql, replaces_stored_sql
from ingest.reduce import Key, PositionedChange, Reduction, event_key
from ingest.schema import SchemaPlan, check_column_names, combine, plan_schema
from ingest.tablestate import BATCH_KEY, POSITION_FORMAT, STATE_KEY, TableState, app_id, load_state

_TOAST_PREFIX = "__cdc_toast__"


@dataclass(slots=True)
class MergeOutcome:
    """Counts and commit facts of one applied batch (the audit record's ``apply`` part)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    truncates_applied: int = 0
    rows_truncated: int = 0
    committed: bool = False
    delta_version: int | None = None
    schema_change: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    merge_ms: int = 0
    #: rows written with a column whose value is unknown (unchanged-TOAST placeholder, nothing stored).
    toast_unknown: int = 0


@dataclass(slots=True)
class MergeRequest:
    """Everything :func:`apply_batch` needs for one table and batch.

    Attributes:
        table: table name.
        path: Delta table path.
        tombstones_path: Delta table of remembered deletes (hard mode).
        delete_mode: ``hard`` (live rows only) or ``soft`` (deleted rows flagged).
        key_columns: primary-key columns.
        reduction: the batch reduced to one change per key.
        offsets: last offset of the batch per ``(topic, partition)`` (progress markers).
        describe: builds the audit record stored in the commit info (``cdc.batch``) from the
            outcome's counts, just before the commit.
        flattened: whether the batch showed the stream to be ``ExtractNewRecordState`` rows
            (``None``: it did not say); remembered in the table's state.
    """

    table: str
    path: Path
    tombstones_path: Path
    delete_mode: Literal["hard", "soft"]
    key_columns: tuple[str, ...]
    reduction: Reduction
    offsets: dict[tuple[str, int], int]
    describe: Callable[[MergeOutcome], dict[str, Any]]
    flattened: bool | None = None


def apply_batch(request: MergeRequest) -> MergeOutcome:
    """Apply a reduced batch to its table in one commit and return what happened.

    Raises:
        SchemaIncompatibleError: a column changed type unsafely; nothing was committed.
        CommitConflictError: another writer committed to the table at the same time.
        TableError: the table was written with another position encoding, or a key column cannot
            hold the batch's values.
    """
    started = time.perf_counter()
    state = load_state(request.path)
    _refuse_to_move_backwards(request, state)
    _check_position_format(request.table, state)
    red = request.reduction
    images = [_image_columns(c) for c in [*red.winners, *red.truncated]]
    incoming = combine(request.table, images)
    _check_reserved(request.table, incoming)
    plan = plan_schema(request.table, state.columns, incoming)
    check_column_names(request.table, plan.columns)
    outcome = MergeOutcome(schema_change=plan.describe())

    if state.table is None and not plan.columns and red.truncate is None:
        # Nothing to create a table from (only control records): nothing to record.
        return outcome
    # A truncate before any row still creates the (empty) table: its position must be remembered,
    # or a late change from before it could land afterwards.
    table = state.table if state.table is not None else _create(request, plan)
    key_types = {c.name: c.type for c in plan.columns if c.name in request.key_columns}
    if plan.widened:
        faults.point("before-widen")
        table = _widen(table, request, plan)
        faults.point("after-widen")

    truncate_pos = red.truncate.event.position.encode() if red.truncate else None
    if truncate_pos is not None and state.truncate_position is not None and not later_than_stored(
            truncate_pos, state.truncate_position):
        truncate_pos = None  # an older or replayed truncate changes nothing
    outcome.truncates_applied = 1 if truncate_pos else 0
    if red.truncate is not None and not truncate_pos:
        outcome.stale += 1
    watermark = truncate_pos or state.truncate_position

    stored = stored_rows(table, request.key_columns, [*red.winners, *red.truncated], table_name=request.table)
    hard = request.delete_mode == "hard"
    tombs = tombstones.positions(request.tombstones_path, request.key_columns, key_types, request.table) \
        if hard and red.winners else {}
    revert_stale_toast_fills(red.winners, request.key_columns, stored)
    actions = classify(red.winners, request.key_columns, stored, tombs, state.truncate_position, truncate_pos)
    for action in actions:
        if action == "insert":
            outcome.inserted += 1
        elif action == "update":
            outcome.updated += 1
        elif action == "delete":
            outcome.deleted += 1
        else:
            outcome.stale += 1
    live = [c for c, a in zip(red.winners, actions, strict=True) if a != "stale"]
    truncated = [c for c in red.truncated if keeps_truncated(c, request.key_columns, stored, state.truncate_position)]
    live += truncated
    unknown = unknown_columns(live, request.key_columns, stored)
    outcome.toast_unknown = sum(1 for u in unknown.values() if u)

    if hard:
        tombstones.record(request.tombstones_path, request.table, request.key_columns, key_types,
                          [(_key(c, request.key_columns), c.event.position.encode(), c.event.source_ts_ms)
                           for c in live if c.event.is_delete])
        faults.point("after-tombstones")
    props = CommitProperties(
        app_transactions=[
            Transaction(app_id(topic, partition), offset, int(time.time() * 1000))
            for (topic, partition), offset in sorted(request.offsets.items())
        ],
        custom_metadata={
            BATCH_KEY: json.dumps(request.describe(outcome)),
            STATE_KEY: json.dumps({"primary_key": list(request.key_columns), "truncate_position": watermark,
                                   "position_format": POSITION_FORMAT,
                                   "flattened": request.flattened if request.flattened is not None
                                   else state.flattened}),
        },
    )
    source_rows = [c for c in live if not (hard and c.event.is_delete and _key(c, request.key_columns) not in stored)]
    before = table.version()
    faults.point("before-commit")
    try:
        # A table without user columns (created by a truncate) holds no rows: nothing to merge.
        if source_rows or (truncate_pos and state.columns):
            source = _source_table(request.table, source_rows, plan.columns, request.key_columns, truncate_pos, unknown,
                                   {id(c) for c in truncated})
            metrics = _merge(table, request, plan.columns, source, truncate_pos, props)
            outcome.metrics = metrics
            matched = matched_deletes(actions, red.winners, request.key_columns, stored) if hard else 0
            outcome.rows_truncated = max(0, metrics.get("num_target_rows_deleted", 0) - matched)
            table.update_incremental()
        if table.version() == before:
            # MERGE writes no commit when it changes nothing; progress must still be recorded.
            table.create_write_transaction([], "append", table.schema(), commit_properties=props)
    except CommitFailedError as exc:
        raise CommitConflictError(request.table, f"commit failed, another writer changed the table: {exc}") from exc
    table.update_incremental()
    outcome.committed = True
    outcome.delta_version = table.version()
    outcome.merge_ms = int((time.perf_counter() - started) * 1000)
    return outcome


def _check_position_format(table: str, state: TableState) -> None:
    if state.table is not None and state.position_format != POSITION_FORMAT and state.key_columns is not None:
        raise TableError(table, f"was written with source-position format {state.position_format or 1}; this "
                                f"version writes format {POSITION_FORMAT} and cannot compare the two. Rebuild it: "
                                "remove its directory and its _cdc_tombstones entry, then "
                                "`ingest run --from-beginning`")


def _refuse_to_move_backwards(request: MergeRequest, state: TableState) -> None:
    """The batch's offsets must be beyond what the table records (another writer may have moved it)."""
    for (topic, partition), offset in sorted(request.offsets.items()):
        applied = state.applied_offset(topic, partition)
        if applied is not None and offset <= applied:
            raise OffsetsConflictError(
                request.table,
                f"{topic}[{partition}] is already applied up to offset {applied}; this batch ends at {offset}. "
                "Refusing to move progress backwards (is another writer running on this table?)",
            )


# -- planning ---------------------------------------------------------------------------------------
def _image_columns(change: PositionedChange) -> Sequence[ColumnSpec]:
    event = change.event
    if event.schema_ref is None:
        # Schemaless JSON: a null value says nothing about the column's type, so it must not
        # decide (or contradict) the table's schema.
        image = event.after if event.after is not None else (event.before or {})
        return [c for c in event.columns if image.get(c.name) is not None]
    return event.columns


def _check_reserved(table: str, columns: list[ColumnSpec]) -> None:
    for col in columns:
        if col.name.startswith("_cdc_") or col.name.startswith(_TOAST_PREFIX):
            raise TableError(table, f"source column {col.name!r} collides with the framework's reserved prefix '_cdc_'")


def _key(change: PositionedChange, key_columns: tuple[str, ...]) -> Key:
    return event_key(change.event, key_columns)


def _framework_schema() -> list[pa.Field]:
    return [pa.field(name, typ) for name, typ in FRAMEWORK_COLUMNS]


def _create(request: MergeRequest, plan: SchemaPlan) -> DeltaTable:
    schema = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in plan.columns] + _framework_schema())
    return DeltaTable.create(
        str(request.path),
        schema,
        mode="ignore",
        name=request.table,
        description=f"CDC target table {request.table} (primary key {', '.join(request.key_columns)})",
        commit_properties=CommitProperties(custom_metadata={STATE_KEY: json.dumps({
            "primary_key": list(request.key_columns), "truncate_position": None,
            "position_format": POSITION_FORMAT, "flattened": request.flattened})}),
    )


def _widen(table: DeltaTable, request: MergeRequest, plan: SchemaPlan) -> DeltaTable:
    """Rewrite the table with widened column types (data unchanged) before the batch's commit."""
    current = read_all(table)
    target = pa.schema(
        [pa.field(c.name, arrow_type(c.type)) for c in plan.columns if c.name in current.column_names]
        + _framework_schema()
    )
    # int -> double is the one widening that rounds (beyond 2**53): pyarrow's checked cast refuses it.
    columns = [current[f.name].cast(f.type, safe=not (pa.types.is_floating(f.type)
                                                       and pa.types.is_integer(current[f.name].type)))
               for f in target]
    write_deltalake(
        table,
        pa.Table.from_arrays(columns, schema=target),
        mode="overwrite",
        schema_mode="overwrite",
        commit_properties=CommitProperties(custom_metadata={"cdc.schema_change": plan.describe()}),
    )
    table.update_incremental()
    return table


def _source_table(table: str, rows: list[PositionedChange], columns: list[ColumnSpec], key_columns: tuple[str, ...],
                  truncate_pos: str | None, unknown: dict[int, list[str] | None], truncated_ids: set[int]) -> pa.Table:
    """The MERGE source: user columns, framework columns and TOAST flags, one row per change.

    A change the batch's truncate superseded but soft-delete mode keeps (a *truncated* row) is
    written as the truncate left it: flagged deleted, ``_cdc_op`` ``t`` at the truncate's position.
    """
    now = datetime.now(UTC)
    data: dict[str, pa.Array] = {}
    images = [(c.event.after if c.event.after is not None else {**(c.event.before or {}), **c.event.key})
              for c in rows]
    for col in columns:
        values = [img.get(col.name) for img in images]
        toast = [v is UNAVAILABLE for v in values]
        if any(toast):
            values = [None if t else v for v, t in zip(values, toast, strict=True)]
            data[_TOAST_PREFIX + col.name] = pa.array(toast, pa.bool_())
        data[col.name] = tombstones.key_array(table, col.name, values, col.type) if col.name in key_columns \
            else pa.array(values, arrow_type(col.type))
    events = [c.event for c in rows]
    truncated = [id(c) in truncated_ids and c.event.op != "d" for c in rows]
    data["_cdc_op"] = pa.array(["t" if t else e.op for e, t in zip(events, truncated, strict=True)], pa.string())
    data["_cdc_position"] = pa.array([truncate_pos if t else e.position.encode()
                                      for e, t in zip(events, truncated, strict=True)], pa.string())
    data["_cdc_source_ts"] = tombstones.millis_to_timestamp([e.source_ts_ms for e in events])
    data["_cdc_topic"] = pa.array([c.coords.topic for c in rows], pa.string())
    data["_cdc_partition"] = pa.array([c.coords.partition for c in rows], pa.int32())
    data["_cdc_offset"] = pa.array([c.coords.offset for c in rows], pa.int64())
    data["_cdc_ingested_at"] = pa.array([now] * len(rows), pa.timestamp("us", tz="UTC"))
    data["_cdc_deleted"] = pa.array([e.is_delete or t for e, t in zip(events, truncated, strict=True)], pa.bool_())
    data[UNKNOWN_COLUMNS] = pa.array([unknown.get(id(c)) for c in rows], pa.list_(pa.string()))
    source = pa.table(data)
    return source.sort_by([(k, "ascending") for k in key_columns]) if rows else source


def _merge(table: DeltaTable, request: MergeRequest, columns: list[ColumnSpec], source: pa.Table,
           truncate_pos: str | None, props: CommitProperties) -> dict[str, Any]:
    framework = [name for name, _ in FRAMEWORK_COLUMNS]
    toast = {name[len(_TOAST_PREFIX):] for name in source.column_names if name.startswith(_TOAST_PREFIX)}

    def value(col: str) -> str:
        if col in toast:
            return f"CASE WHEN s.{quote(_TOAST_PREFIX + col)} THEN t.{quote(col)} ELSE s.{quote(col)} END"
        return f"s.{quote(col)}"

    user = [c.name for c in columns]
    all_updates = {quote(c): value(c) for c in user + framework}
    # A soft delete keeps the stored values, and with them what is known of them.
    framework_updates = {quote(c): f"s.{quote(c)}" for c in framework if c != UNKNOWN_COLUMNS}
    inserts = {quote(c): f"s.{quote(c)}" for c in user + framework}
    newer = replaces_stored_sql("s", "t")
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in request.key_columns)
    removed_by_truncate = later_than_stored_sql(sql_string(truncate_pos), "t._cdc_position") if truncate_pos else ""

    merger = table.merge(source, on, source_alias="s", target_alias="t", merge_schema=True,
                         commit_properties=props)
    if request.delete_mode == "hard":
        merger = (merger.when_matched_delete(f"s._cdc_deleted AND {newer}")
                  .when_matched_update(all_updates, f"NOT s._cdc_deleted AND {newer}")
                  .when_not_matched_insert(inserts, "NOT s._cdc_deleted"))
        if truncate_pos:
            merger = merger.when_not_matched_by_source_delete(removed_by_truncate)
    else:
        # A delete's image may hold only the key: keep the stored values. A truncated row carries
        # the values its change gave it.
        merger = (merger.when_matched_update(framework_updates, f"s._cdc_op = 'd' AND {newer}")
                  .when_matched_update(all_updates, newer)
                  .when_not_matched_insert(inserts))
        if truncate_pos:
            merger = merger.when_not_matched_by_source_update(
                {"_cdc_deleted": "true", "_cdc_op": "'t'", "_cdc_position": sql_string(truncate_pos)},
                f"{removed_by_truncate} AND NOT t._cdc_deleted",
            )
    return merger.execute()


def purge_tombstones(tombstones_path: Path, older_than: datetime) -> int:
    """Forget deletes recorded before ``older_than`` (see :func:`ingest.tombstones.purge`)."""
    return tombstones.purge(tombstones_path, older_than)


def live_row_count(path: Path) -> int:
    table = open_table(path)
    if table is None:
        return 0
    result = query(table, "SELECT count(*) AS n FROM t WHERE NOT coalesce(_cdc_deleted, false)")
    return int(pc.sum(result["n"]).as_py() or 0)
