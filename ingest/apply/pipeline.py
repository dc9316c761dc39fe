"""One table's micro-batch on the driver: from the decode step's parts to an audited Delta commit.

The journey (each step columnar; only messages held back become Python objects, as quarantine rows):

1. unify the parts and drop what the table already applied (:class:`~ingest.apply.batch.MicroBatch`);
2. hold back what cannot be applied: undecodable messages, changes whose key is not the table's;
   Kafka tombstones of a flattened stream become the deletes of their keys
   (:mod:`ingest.apply.rules.kafka_tombstones`); the schema change is planned (an incompatible one stops
   the table here, before anything is written);
3. reduce to the latest change per key (:mod:`ingest.apply.rules.reduce`);
4. validate those after-images with the table's expectations suite (:mod:`ingest.quality`); a
   ``fail`` raises here, so the table's offsets do not move;
5. quarantine first: if we crash after it, the replay finds the rows already there;
6. plan the MERGE against the stored rows (:mod:`ingest.apply.rules.plan`) and commit it with the engine
   (:mod:`ingest.commit.delta_rs`), progress and audit record in the same commit; a ``history_mode:
   scd2`` table instead derives its touched keys' versions from every change (:mod:`ingest.apply.rules.history`);
7. append the audit row.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest import crashpoints
from ingest.apply.batch import MicroBatch
from ingest.apply.rules.history import HistoryInput, check_history_mode, history_changes, plan_history
from ingest.apply.rules.kafka_tombstones import are_deletes, resolve
from ingest.apply.rules.ordering import later_than_stored
from ingest.apply.rules.plan import MergePlan, plan_merge
from ingest.apply.rules.reduce import Reduction, nulls_as_unchanged, reduce_changes
from ingest.apply.rules.schema import check_column_names, plan_schema
from ingest.apply.stored import KeyLookup, stored_rows
from ingest.commit import remembered as tombstones
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.state import OpenTables, TableState, load_state
from ingest.commit.writer import CommitOutcome, CommitRequest, Writer
from ingest.config import TableSpec
from ingest.errors import TableError
from ingest.lake import locks
from ingest.lake.delta import arrow_type
from ingest.lake.location import LakePath
from ingest.lake.tables import TablePaths
from ingest.model import ColumnSpec
from ingest.quality.gate import QualityGate, QualityReport
from ingest.records import audit, quarantine
from ingest.records.audit import AuditRecord
from ingest.records.quarantine import QuarantineRecord, Stage

#: Raw key and value (and Kafka timestamp) of messages by ``(topic, partition, offset)``, fetched
#: again from the source for changes held back after decoding.
RawFetch = Callable[[list[tuple[str, int, int]]], dict[tuple[str, int, int], tuple[Any, Any, Any]]]


@dataclass(slots=True)
class BatchResult:
    """What the driver did with one table's batch."""

    record: AuditRecord | None
    already_applied: int = 0
    controls: Counter[str] = field(default_factory=Counter)
    quality: QualityReport | None = None
    #: the messages held back (quarantined, or -- for a replay -- still failing)
    held: list[QuarantineRecord] = field(default_factory=list)


@dataclass(slots=True)
class Held:
    """Messages held back so far: ``(row of a table, stage, reason, expectations)`` gathered by step."""

    records: list[QuarantineRecord] = field(default_factory=list)
    pending: list[tuple[dict[str, Any], Stage, str, str, str | None]] = field(default_factory=list)

    def add_rows(self, rows: pa.Table, stage: Stage, reasons: Sequence[str] | None = None,
                 expectations: Sequence[str] | None = None, row_keys: Sequence[str | None] | None = None) -> None:
        for i, row in enumerate(rows.select(["_cdc_topic", "_cdc_partition", "_cdc_offset", "_cdc_timestamp",
                                             "_cdc_reason", "_cdc_raw_key", "_cdc_raw_value"]).to_pylist()):
            reason = reasons[i] if reasons is not None else row["_cdc_reason"]
            self.pending.append((row, stage, reason, expectations[i] if expectations else "",
                                 row_keys[i] if row_keys else None))

    def __len__(self) -> int:
        return len(self.pending)

    def resolve(self, spec: TableSpec, fetch: RawFetch | None, *, batch_id: int, run_id: str) -> list[QuarantineRecord]:
        """Quarantine rows, with raw bytes fetched for the held changes that no longer carry them."""
        missing = [(r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]) for r, stage, *_ in self.pending
                   if stage != "decode" and r["_cdc_raw_value"] is None and r["_cdc_raw_key"] is None]
        raw = fetch(missing) if missing and fetch is not None else {}
        now = datetime.now(UTC)
        out = []
        for row, stage, reason, expectations, row_key in self.pending:
            coords = (row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"])
            key, value, _ts = raw.get(coords, (row["_cdc_raw_key"], row["_cdc_raw_value"], None))
            out.append(QuarantineRecord(
                table=spec.name, topic=coords[0], partition=coords[1], offset=coords[2],
                kafka_timestamp=row["_cdc_timestamp"], raw_key=key, raw_value=value, stage=stage, reason=reason,
                batch_id=batch_id, run_id=run_id, quarantined_at=now, expectations=expectations, row_key=row_key))
        return out


def apply_parts(spec: TableSpec, paths: TablePaths, parts: Sequence[pa.RecordBatch], *,
                opened: OpenTables | None = None, **kwargs: Any) -> BatchResult:
    """:func:`process_batch` of the decode step's parts, against the table's current state.

    Args:
        opened: the table's handles a stream keeps between batches (default: opened for this batch).
    """
    opened = opened or OpenTables(paths, spec.name)
    state = opened.state()
    batch = MicroBatch.from_parts(parts, state, table=spec.name, select=spec.columns,
                                  key_columns=spec.primary_key or ())
    return process_batch(spec, paths, batch, state=state, remembered=opened.tombstones, **kwargs)


def process_batch(spec: TableSpec, paths: TablePaths, batch: MicroBatch, *, batch_id: int, run_id: str,
                  state: TableState | None = None, decode_ms: int = 0, gate: QualityGate | None = None,
                  fetch_raw: RawFetch | None = None, engine: Writer | None = None,
                  replay: bool = False, defer_audit: bool = False,
                  remembered: tombstones.RememberedDeletes | None = None) -> BatchResult:
    """Apply one table's micro-batch (see module docstring). Idempotent under replay.

    Args:
        state: the table's state the batch was assembled against (read again if not given).
        gate: the table's quality gate (required when the table names an expectations suite).
        fetch_raw: fetches raw bytes of held-back changes from the source.
        replay: a quarantine replay: no offsets are recorded (the stream's progress does not move),
            messages that fail again are returned rather than quarantined a second time, and the
            audit row (status ``replayed``) is written only if something was committed.
        defer_audit: leave the audit row to the caller (``result.record``), which appends the rows
            of many tables in one commit. The table's commit carries the row in its metadata, so a
            crash before the caller appends loses nothing: :func:`ingest.records.audit.reconcile` restores it.
        remembered: the table's remembered deletes, as the caller keeps them open (default: opened here).

    Raises:
        QualityGateError: expectations under policy ``fail`` failed; nothing was written.
        SchemaIncompatibleError, CommitConflictError, TableError: nothing was committed.
    """
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    state = state if state is not None else load_state(paths.table)
    if batch.received == 0:
        return BatchResult(None, already_applied=batch.already_applied)
    record = AuditRecord(table=spec.name, run_id=run_id, batch_id=batch_id, received=batch.received,
                         started_at=started_at, decode_ms=decode_ms)
    record.offsets = json.dumps({f"{t}:{p}": span for (t, p), span in sorted(batch.offsets.items())})
    held = Held()
    controls = batch.controls
    engine = engine or DeltaRsWriter()
    lookup = engine.lookup(paths.table)

    # 2. What cannot be applied; tombstones; the schema change.
    meta = batch.meta
    held.add_rows(meta.filter(pc.equal(meta["_cdc_kind"], "error")), "decode")
    key_columns = state.key_columns or spec.primary_key or batch.key_columns() or _tombstone_key(batch)
    changes = hold_foreign_keys(batch.changes, key_columns, held)
    flattened = batch.flattened
    unreadable = meta.filter(pc.and_(pc.equal(meta["_cdc_kind"], "tombstone"), pc.is_valid(meta["_cdc_reason"])))
    tombstone_deletes = are_deletes(spec.kafka_tombstones, flattened, state.flattened)
    if batch.tombstones.num_rows or unreadable.num_rows:
        if not tombstone_deletes or not key_columns:
            controls["tombstone"] += batch.tombstones.num_rows
        else:
            held.add_rows(unreadable, "key", [f"tombstone: {r}" for r in unreadable["_cdc_reason"].to_pylist()])
            controls["tombstone"] -= unreadable.num_rows
            changes = _with_columns(changes, key_columns, state, batch.tombstones)
            resolution = resolve(batch.tombstones, changes, key_columns, state.table, lookup=lookup)
            held.add_rows(resolution.unusable, "key")
            controls["tombstone"] += resolution.skipped
            changes = pa.concat_tables([changes, resolution.deletes])
    schema = plan_schema(spec.name, state.columns, list(batch.columns))
    check_column_names(spec.name, schema.columns)
    changes = _typed_nulls(changes, schema.columns)
    record.skipped = sum(controls.values())

    # 3. Reduce; 4. validate the winners.
    if key_columns:
        changes = _with_columns(changes, key_columns, state, batch.tombstones)
        if spec.ignore_null_updates:
            changes = nulls_as_unchanged(changes, tuple(key_columns), schema.columns)
        reduction = reduce_changes(changes, tuple(key_columns), schema.columns, soft=spec.delete_mode == "soft")
    else:  # only truncates (or nothing): there is no key to reduce by
        reduction = _truncates_only(changes)
    candidates, n_held = reduction.winners, len(held)
    report = _check_quality(spec, gate, reduction, changes, state, held, batch_id=batch_id, run_id=run_id)
    history = None
    if spec.history_mode == "scd2":  # every change, less the keys quality holds back
        history = HistoryInput(history_changes(changes, candidates, reduction.winners, key_columns or ()),
                               changes.num_rows, len(held) - n_held)
    record.expectations_evaluated, record.expectations_failed = report.evaluated, report.failed
    record.quality_status, record.quality_failures = report.status, report.failures_json()

    # 5. Quarantine first.
    held_records = held.resolve(spec, None if replay else fetch_raw, batch_id=batch_id, run_id=run_id)
    if not replay:
        quarantine.write(paths.quarantine, held_records)
    record.quarantined = len(held)
    crashpoints.point("after-quarantine")

    # 6. Plan and commit.
    record.superseded = reduction.superseded
    record.engine = engine.name  # before the commit: the commit info carries the record
    remembered = remembered or tombstones.RememberedDeletes(paths.tombstones, spec.name)
    outcome = _commit(spec, paths, state, reduction, schema, tuple(key_columns or ()), record, batch,
                      flattened, not replay, engine, remembered, lookup, history)
    crashpoints.point("after-delta-commit")
    record.status = "replayed" if replay else "committed" if outcome.committed else "nothing-to-commit"
    record.rows_truncated = outcome.rows_truncated
    record.delta_version = outcome.delta_version
    record.apply_ms = outcome.merge_ms
    record.merge_metrics = json.dumps({k: v for k, v in sorted(outcome.metrics.items()) if isinstance(v, int | float)})
    record.total_ms = decode_ms + int((time.perf_counter() - t0) * 1000)
    record.finished_at = datetime.now(UTC)
    if (not replay or outcome.committed) and not defer_audit:
        audit.append(paths.audit, [record])
    crashpoints.point("after-batch")
    return BatchResult(record if not replay or outcome.committed else None, already_applied=batch.already_applied,
                       controls=controls, quality=report, held=held_records)


def _typed_nulls(changes: pa.Table, columns: list[ColumnSpec]) -> pa.Table:
    """Columns null in every schemaless message of the batch, in the type the table gives them."""
    final = {c.name: c.type for c in columns}
    for i, f in enumerate(changes.schema):
        if pa.types.is_null(f.type) and f.name in final:
            changes = changes.set_column(i, f.name, changes.column(i).cast(arrow_type(final[f.name])))
    return changes


def _commit(spec: TableSpec, paths: TablePaths, state: TableState, reduction: Reduction, schema: Any,
            key_columns: tuple[str, ...], record: AuditRecord, batch: MicroBatch, flattened: bool | None,
            record_offsets: bool, engine: Writer, remembered: tombstones.RememberedDeletes,
            lookup: KeyLookup, history: HistoryInput | None = None) -> CommitOutcome:
    refuse_to_move_backwards(spec.name, batch, state, record_offsets)
    locks.check(paths.table)  # on an object store: this run still holds the table's lease
    check_position_format(spec.name, state)
    check_history_mode(spec.name, spec.history_mode, state)
    if state.table is None and not schema.columns and reduction.truncate is None:
        return CommitOutcome()  # nothing to create a table from (only control records): nothing to record
    key_types = {c.name: c.type for c in schema.columns if c.name in key_columns}
    offsets = {tp: span[1] for tp, span in batch.offsets.items()} if record_offsets else {}
    if history is not None:
        plan_h = plan_history(
            history.changes, key_columns=key_columns, columns=schema.columns, table=state.table,
            tracked=[c.name for c in schema.columns if spec.track_history is None or spec.track_history.keeps(c.name)],
            watermark=state.truncate_position, truncate_log=state.truncate_log, lookup=lookup)
        history.count(record, plan_h)
        if not record_offsets and plan_h.source.num_rows == 0 and plan_h.truncate is None:
            return CommitOutcome()
        return engine.commit(CommitRequest(
            table=spec.name, path=paths.table, tombstones=remembered, delete_mode=spec.delete_mode,
            key_columns=key_columns, schema=schema, plan=empty_plan(schema.columns), truncate=plan_h.truncate,
            watermark=plan_h.watermark, truncate_log=plan_h.truncate_log, offsets=offsets,
            flattened=flattened if flattened is not None else state.flattened, history_mode="scd2", history=plan_h,
            describe=lambda outcome: _describe(record, outcome)), state)
    truncate = reduction.truncate.position if reduction.truncate else None
    if truncate is not None and state.truncate_position is not None and not later_than_stored(
            truncate, state.truncate_position):
        truncate = None  # an older or replayed truncate changes nothing
    record.truncates = 1 if truncate else 0
    hard = spec.delete_mode == "hard"
    if key_columns:
        parts = [t.select(list(key_columns)) for t in (reduction.winners, reduction.truncated) if t is not None]
        keys = pa.concat_tables(parts)
        stored = stored_rows(state.table, key_columns, keys, lookup=lookup)
        tombs = remembered.read(key_columns, key_types, keys, lookup=engine.lookup(LakePath.of(remembered.path))) \
            if hard and keys.num_rows else None
        plan = plan_merge(reduction, key_columns=key_columns, columns=schema.columns, stored=stored, tombstones=tombs,
                          old_truncate=state.truncate_position, new_truncate=truncate, hard=hard)
        new_keys_only = state.table is not None and stored.num_rows == 0 and truncate is None
    else:
        plan = empty_plan(schema.columns)
        new_keys_only = False
    record.inserted, record.updated, record.deleted = plan.inserted, plan.updated, plan.deleted
    record.stale = plan.stale + (1 if reduction.truncate is not None and not truncate else 0)
    record.toast_unknown = plan.toast_unknown
    record.schema_change = schema.describe()
    if not record_offsets and reduction.winners.num_rows == 0 and reduction.truncate is None:
        return CommitOutcome()  # a replay that found nothing to apply commits nothing
    request = CommitRequest(
        table=spec.name, path=paths.table, tombstones=remembered, delete_mode=spec.delete_mode,
        key_columns=key_columns, schema=schema, plan=plan, truncate=truncate,
        watermark=truncate or state.truncate_position,
        offsets=offsets, flattened=flattened if flattened is not None else state.flattened,
        history_mode=spec.history_mode, describe=lambda outcome: _describe(record, outcome),
        new_keys_only=new_keys_only,
    )
    return engine.commit(request, state)


def _describe(record: AuditRecord, outcome: CommitOutcome) -> dict[str, Any]:
    return record.to_metadata()


def refuse_to_move_backwards(table: str, batch: MicroBatch, state: TableState, record_offsets: bool) -> None:
    """The batch's offsets must be beyond what the table records (another writer may have moved it)."""
    from ingest.errors import OffsetsConflictError

    if not record_offsets:
        return
    for (topic, partition), (_first, last) in sorted(batch.offsets.items()):
        applied = state.applied_offset(topic, partition)
        if applied is not None and last <= applied:
            raise OffsetsConflictError(
                table, f"{topic}[{partition}] is already applied up to offset {applied}; this batch ends at {last}. "
                       "Refusing to move progress backwards (is another writer running on this table?)")


def check_position_format(table: str, state: TableState) -> None:
    """The table's positions must be encoded as this version encodes them (they are compared as text)."""
    from ingest.commit.state import POSITION_FORMAT

    if state.table is not None and state.position_format != POSITION_FORMAT and state.key_columns is not None:
        raise TableError(table, f"was written with source-position format {state.position_format or 1}; this "
                                f"version writes format {POSITION_FORMAT} and cannot compare the two. Rebuild it: "
                                "remove its directory and its _cdc_tombstones entry, then "
                                "`ingest run --from-beginning`")


def _tombstone_key(batch: MicroBatch) -> tuple[str, ...] | None:
    if batch.tombstones.num_rows == 0:
        return None
    return tuple(json.loads(batch.tombstones["_cdc_key_columns"][0].as_py()))


def hold_foreign_keys(changes: pa.Table, key_columns: Sequence[str] | None, held: Held) -> pa.Table:
    """Changes (not truncates) whose primary key is not the table's are held back (stage ``key``)."""
    if not key_columns or changes.num_rows == 0:
        return changes
    wanted = json.dumps(list(key_columns))
    foreign = pc.and_(pc.not_equal(changes["_cdc_op"], "t"), pc.not_equal(changes["_cdc_key_columns"], wanted))
    foreign = pc.fill_null(foreign, False)
    if not pc.any(foreign).as_py():
        return changes
    bad = changes.filter(foreign)
    reasons = [f"primary key columns {json.loads(k)} differ from the table's {list(key_columns)}"
               for k in bad["_cdc_key_columns"].to_pylist()]
    held.add_rows(bad, "key", reasons)
    return changes.filter(pc.invert(foreign))


def _with_columns(changes: pa.Table, key_columns: Sequence[str], state: TableState, tombs: pa.Table) -> pa.Table:
    """``changes`` with every key column present (a batch of tombstones only has none)."""
    types = {c.name: arrow_type(c.type) for c in state.columns or ()}
    for k in key_columns:
        if k not in changes.column_names:
            typ = types.get(k) or (tombs.schema.field(k).type if k in tombs.column_names else pa.string())
            changes = changes.append_column(pa.field(k, typ), pa.nulls(changes.num_rows, typ))
    return changes


def _truncates_only(changes: pa.Table) -> Reduction:
    from ingest.apply.rules.reduce import TruncateMark

    marks = changes.filter(pc.equal(changes["_cdc_op"], "t")).sort_by([("_cdc_position", "descending")])
    truncate = None
    if marks.num_rows:
        top = marks.slice(0, 1).to_pylist()[0]
        truncate = TruncateMark(top["_cdc_position"], top["_cdc_partition"], top["_cdc_offset"])
    return Reduction(winners=changes.slice(0, 0), truncate=truncate, truncates=marks.num_rows,
                     superseded=max(0, marks.num_rows - 1))


def empty_plan(columns: list[ColumnSpec]) -> MergePlan:
    """A merge plan with nothing to write (a source of no rows in the table's columns)."""
    from ingest.apply.rules.plan import _source

    empty = pa.schema([("_cdc_op", pa.string())]).empty_table()
    return MergePlan(rows=empty, source=_source(_EMPTY_LIVE, columns, [], None))


_EMPTY_LIVE = pa.schema([("_cdc_truncated", pa.bool_()), ("_cdc_op", pa.string()), ("_cdc_position", pa.string()),
                         ("_cdc_source_ts", pa.timestamp("us", tz="UTC")), ("_cdc_topic", pa.string()),
                         ("_cdc_partition", pa.int32()), ("_cdc_offset", pa.int64()),
                         ("_cdc_unknown_columns", pa.list_(pa.string()))]).empty_table()


def _check_quality(spec: TableSpec, gate: QualityGate | None, reduction: Reduction, changes: pa.Table,
                   state: TableState, held: Held, *, batch_id: int, run_id: str) -> QualityReport:
    """Step 4: run the gate; the winners it holds leave the reduction, with every earlier change of their keys."""
    from ingest.apply.rules.withdraw import withdraw

    if not spec.expectations:
        return QualityReport()
    if gate is None:
        raise TableError(spec.name, f"names expectations suite {spec.expectations!r} but no quality gate was loaded")
    report = gate.check(reduction.winners, state.columns, batch_id=batch_id, run_id=run_id)
    if report.held:
        withdraw(reduction, changes, report, held)
    return report
