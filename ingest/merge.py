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

from ingest import faults
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
from ingest.reduce import Key, PositionedChange, Reduction, event_key
from ingest.schema import SchemaPlan, check_column_names, combine, plan_schema
from ingest.tablestate import BATCH_KEY, STATE_KEY, TableState, app_id, load_state

Action = Literal["insert", "update", "delete", "stale"]
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
    """

    table: str
    path: Path
    tombstones_path: Path
    delete_mode: Literal["hard", "soft"]
    key_columns: tuple[str, ...]
    reduction: Reduction
    offsets: dict[tuple[str, int], int]
    describe: Callable[[MergeOutcome], dict[str, Any]]


def apply_batch(request: MergeRequest) -> MergeOutcome:
    """Apply a reduced batch to its table in one commit and return what happened.

    Raises:
        SchemaIncompatibleError: a column changed type unsafely; nothing was committed.
        CommitConflictError: another writer committed to the table at the same time.
    """
    started = time.perf_counter()
    state = load_state(request.path)
    _refuse_to_move_backwards(request, state)
    red = request.reduction
    images = [_image_columns(c) for c in red.winners]
    incoming = combine(request.table, images)
    _check_reserved(request.table, incoming)
    plan = plan_schema(request.table, state.columns, incoming)
    check_column_names(request.table, plan.columns)
    outcome = MergeOutcome(schema_change=plan.describe())

    if state.table is None and not plan.columns:
        # Nothing to create a table from (e.g. only a truncate before any row): nothing to record.
        outcome.stale = len(red.winners)
        return outcome
    table = state.table if state.table is not None else _create(request, plan)
    if plan.widened:
        faults.point("before-widen")
        table = _widen(table, request, plan)
        faults.point("after-widen")

    truncate_pos = red.truncate.event.position.encode() if red.truncate else None
    if truncate_pos is not None and state.truncate_position is not None and truncate_pos <= state.truncate_position:
        truncate_pos = None  # an older or replayed truncate changes nothing
    outcome.truncates_applied = 1 if truncate_pos else 0
    if red.truncate is not None and not truncate_pos:
        outcome.stale += 1
    watermark = max(filter(None, [state.truncate_position, truncate_pos]), default=None)

    stored = _stored_positions(table, request.key_columns, red.winners)
    tombs = _tombstone_positions(request, red.winners) if request.delete_mode == "hard" else {}
    revert_stale_toast_fills(red.winners, request.key_columns, stored)
    actions = _classify(red.winners, request.key_columns, stored, tombs, state.truncate_position, truncate_pos)
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
    if request.delete_mode == "hard":
        _record_tombstones(request, plan.columns, [c for c in live if c.event.is_delete])
        faults.point("after-tombstones")
    props = CommitProperties(
        app_transactions=[
            Transaction(app_id(topic, partition), offset, int(time.time() * 1000))
            for (topic, partition), offset in sorted(request.offsets.items())
        ],
        custom_metadata={
            BATCH_KEY: json.dumps(request.describe(outcome)),
            STATE_KEY: json.dumps({"primary_key": list(request.key_columns), "truncate_position": watermark}),
        },
    )
    source_rows = [c for c in live if not (request.delete_mode == "hard" and c.event.is_delete and
                                           _key(c, request.key_columns) not in stored)]
    before = table.version()
    faults.point("before-commit")
    try:
        if source_rows or truncate_pos:
            source = _source_table(source_rows, plan.columns, request.key_columns)
            metrics = _merge(table, request, plan.columns, source, truncate_pos, props)
            outcome.metrics = metrics
            matched = _matched_deletes(actions, red.winners, request, stored)
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


def revert_stale_toast_fills(winners: list[PositionedChange], key_columns: tuple[str, ...],
                             stored: dict[Key, tuple[str, bool]]) -> None:
    """Undo in-batch TOAST fills whose source image is not newer than the stored row.

    The stored value is then the right one, and the MERGE keeps it (the column is a placeholder again).
    """
    for change in winners:
        if not change.toast_sources or change.event.after is None:
            continue
        target = stored.get(_key(change, key_columns))
        if target is None:
            continue
        stale = {col for col, src in change.toast_sources.items() if src <= target[0]}
        if stale:
            for col in stale:
                change.event.after[col] = UNAVAILABLE
                del change.toast_sources[col]
            change.event.unavailable = change.event.unavailable | stale


def _classify(
    winners: list[PositionedChange],
    key_columns: tuple[str, ...],
    stored: dict[Key, tuple[str, bool]],
    tombs: dict[Key, str],
    old_truncate: str | None,
    new_truncate: str | None,
) -> list[Action]:
    actions: list[Action] = []
    for change in winners:
        pos = change.event.position.encode()
        key = _key(change, key_columns)
        target = stored.get(key)
        if target is not None and new_truncate is not None and target[0] < new_truncate:
            target = None  # the truncate in this batch removes that row first
        if (old_truncate is not None and pos <= old_truncate) or (target is not None and target[0] >= pos) or (
            _buried(tombs.get(key), pos, change.event.is_delete, target is not None)
        ):
            actions.append("stale")
        elif change.event.is_delete:
            actions.append("delete")
        elif target is None or target[1]:
            actions.append("insert")
        else:
            actions.append("update")
    return actions


def _buried(tomb: str | None, pos: str, is_delete: bool, row_in_table: bool) -> bool:
    """True if a remembered delete makes this change stale.

    Tombstones are written before the MERGE commit (a separate commit). A delete that meets its own
    tombstone (same position) while its row is still in the table is a replay after a crash between
    the two: it must apply again, or the row would outlive its delete. Without the row it is a
    duplicate, and stale.
    """
    if tomb is None:
        return False
    return tomb > pos or (tomb == pos and not (is_delete and row_in_table))


def _matched_deletes(actions: list[Action], winners: list[PositionedChange], request: MergeRequest,
                     stored: dict[Key, tuple[str, bool]]) -> int:
    return sum(1 for a, c in zip(actions, winners, strict=True)
               if a == "delete" and _key(c, request.key_columns) in stored and request.delete_mode == "hard")


def _stored_positions(table: DeltaTable, key_columns: tuple[str, ...], winners: list[PositionedChange]
                      ) -> dict[Key, tuple[str, bool]]:
    """``key -> (stored position, soft-deleted)`` for the batch's keys present in the table."""
    if not winners:
        return {}
    first = key_columns[0]
    values = [c.event.key[first] for c in winners]
    lo, hi = min(values), max(values)
    # A range filter on the first key column lets delta-rs skip files by their min/max stats.
    where = f"{quote(first)} >= {_literal(lo)} AND {quote(first)} <= {_literal(hi)}" if _literal(lo) else None
    found = read_all(table, columns=[*key_columns, "_cdc_position", "_cdc_deleted"], where=where)
    if found.num_rows == 0:
        return {}
    wanted = pa.table({k: pa.array([c.event.key[k] for c in winners]) for k in key_columns})
    wanted = wanted.cast(pa.schema([found.schema.field(k) for k in key_columns]))
    found = found.join(wanted, keys=list(key_columns), join_type="inner")
    keys = zip(*(found[k].to_pylist() for k in key_columns), strict=True)
    return {
        key: (pos, bool(deleted))
        for key, pos, deleted in zip(keys, found["_cdc_position"].to_pylist(),
                                     found["_cdc_deleted"].to_pylist(), strict=True)
    }


def _literal(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return sql_string(value)
    return None


def _tombstone_positions(request: MergeRequest, winners: list[PositionedChange]) -> dict[Key, str]:
    table = open_table(request.tombstones_path)
    if table is None or not winners:
        return {}
    rows = read_all(table, columns=[*request.key_columns, "_cdc_position"])
    keys = zip(*(rows[k].to_pylist() for k in request.key_columns), strict=True)
    return dict(zip(keys, rows["_cdc_position"].to_pylist(), strict=True))


# -- writing ------------------------------------------------------------------------------------------
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
        commit_properties=CommitProperties(custom_metadata={
            STATE_KEY: json.dumps({"primary_key": list(request.key_columns), "truncate_position": None})}),
    )


def _widen(table: DeltaTable, request: MergeRequest, plan: SchemaPlan) -> DeltaTable:
    """Rewrite the table with widened column types (data unchanged) before the batch's commit."""
    current = read_all(table)
    target = pa.schema(
        [pa.field(c.name, arrow_type(c.type)) for c in plan.columns if c.name in current.column_names]
        + _framework_schema()
    )
    write_deltalake(
        table,
        current.select(target.names).cast(target),
        mode="overwrite",
        schema_mode="overwrite",
        commit_properties=CommitProperties(custom_metadata={"cdc.schema_change": plan.describe()}),
    )
    table.update_incremental()
    return table


def _source_table(rows: list[PositionedChange], columns: list[ColumnSpec], key_columns: tuple[str, ...]) -> pa.Table:
    """The MERGE source: user columns, framework columns and TOAST flags, one row per change."""
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
        data[col.name] = pa.array(values, arrow_type(col.type))
    events = [c.event for c in rows]
    data["_cdc_op"] = pa.array([e.op for e in events], pa.string())
    data["_cdc_position"] = pa.array([e.position.encode() for e in events], pa.string())
    data["_cdc_source_ts"] = _millis_to_timestamp([e.source_ts_ms for e in events])
    data["_cdc_topic"] = pa.array([c.coords.topic for c in rows], pa.string())
    data["_cdc_partition"] = pa.array([c.coords.partition for c in rows], pa.int32())
    data["_cdc_offset"] = pa.array([c.coords.offset for c in rows], pa.int64())
    data["_cdc_ingested_at"] = pa.array([now] * len(rows), pa.timestamp("us", tz="UTC"))
    data["_cdc_deleted"] = pa.array([e.is_delete for e in events], pa.bool_())
    table = pa.table(data)
    return table.sort_by([(k, "ascending") for k in key_columns]) if rows else table


def _millis_to_timestamp(values: list[int | None]) -> pa.Array:
    return pa.array(values, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))


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
    framework_updates = {quote(c): f"s.{quote(c)}" for c in framework}
    inserts = {quote(c): f"s.{quote(c)}" for c in user + framework}
    newer = "s._cdc_position > t._cdc_position"
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in request.key_columns)

    merger = table.merge(source, on, source_alias="s", target_alias="t", merge_schema=True,
                         commit_properties=props)
    if request.delete_mode == "hard":
        merger = (merger.when_matched_delete(f"s._cdc_deleted AND {newer}")
                  .when_matched_update(all_updates, f"NOT s._cdc_deleted AND {newer}")
                  .when_not_matched_insert(inserts, "NOT s._cdc_deleted"))
        if truncate_pos:
            merger = merger.when_not_matched_by_source_delete(f"t._cdc_position < {sql_string(truncate_pos)}")
    else:
        merger = (merger.when_matched_update(framework_updates, f"s._cdc_deleted AND {newer}")
                  .when_matched_update(all_updates, newer)
                  .when_not_matched_insert(inserts))
        if truncate_pos:
            merger = merger.when_not_matched_by_source_update(
                {"_cdc_deleted": "true", "_cdc_op": "'t'", "_cdc_position": sql_string(truncate_pos)},
                f"t._cdc_position < {sql_string(truncate_pos)} AND NOT t._cdc_deleted",
            )
    return merger.execute()


def _record_tombstones(request: MergeRequest, columns: list[ColumnSpec], deletes: list[PositionedChange]) -> None:
    """Remember deleted keys with their position (hard mode), idempotently and guarded by position."""
    if not deletes:
        return
    types = {c.name: c.type for c in columns}
    data = {k: pa.array([c.event.key[k] for c in deletes], arrow_type(types[k])) for k in request.key_columns}
    data["_cdc_position"] = pa.array([c.event.position.encode() for c in deletes], pa.string())
    data["_cdc_deleted_at"] = _millis_to_timestamp([c.event.source_ts_ms for c in deletes])
    source = pa.table(data)
    table = open_table(request.tombstones_path)
    if table is None:
        write_deltalake(str(request.tombstones_path), source, mode="append")
        return
    on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in request.key_columns)
    (table.merge(source, on, source_alias="s", target_alias="t")
     .when_matched_update_all("s._cdc_position > t._cdc_position")
     .when_not_matched_insert_all()
     .execute())


def purge_tombstones(tombstones_path: Path, older_than: datetime) -> int:
    """Forget deletes older than the retention; returns how many were removed."""
    table = open_table(tombstones_path)
    if table is None:
        return 0
    stamp = older_than.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    # The column is UTC-aware: compare with a UTC literal (a naive `::timestamp` fails in delta-rs's delete).
    result = table.delete(f"_cdc_deleted_at < arrow_cast('{stamp}Z', 'Timestamp(Microsecond, Some(\"UTC\"))')")
    return int(result.get("num_deleted_rows", 0))


def live_row_count(path: Path) -> int:
    table = open_table(path)
    if table is None:
        return 0
    result = query(table, "SELECT count(*) AS n FROM t WHERE NOT coalesce(_cdc_deleted, false)")
    return int(pc.sum(result["n"]).as_py() or 0)
