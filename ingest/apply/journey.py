"""THE sequence of a table's batch: from the decode step's output to an audited Delta commit.

Every table, every configuration, takes these steps in this order (docs/architecture.md#the-journey):

1. assemble the table's share of the micro-batch, less what its Delta log says it applied;
2. hold back what cannot be applied: undecodable messages, changes whose key is not the table's,
   Kafka tombstones that are not the table's deletes; a flattened stream's tombstones become the
   deletes of their keys (:mod:`~ingest.rules.kafka_tombstones`); the schema change is
   planned (an incompatible one stops the table here, before anything is written);
3. fill the unchanged values of rows whose primary key moved from the old key's row
   (:mod:`~ingest.rules.moved`), name the keys whose incremental snapshot read contradicts the change
   streamed before it, to be read again (:mod:`~ingest.rules.rereads`), then reduce to the latest
   change per key (:mod:`~ingest.rules.reduce`);
4. validate those after-images with the table's expectations suite (:mod:`ingest.quality`); a
   ``fail`` raises here, so the table's offsets do not move;
5. quarantine first: if we crash after it, the replay finds the rows already there;
6. the guards: progress never moves backwards, this run holds the table, the table's positions and
   history mode are this version's;
7. plan against the stored rows -- current rows (:mod:`~ingest.rules.plan`) or, for a
   ``history_mode: scd2`` table, every version of the touched keys (:mod:`~ingest.rules.history`);
8. ask for the suspect reads to be read again (the caller's ``on_suspect_reads``), then commit with
   the table's writer: rows, progress and audit record in one Delta commit;
9. append the audit row.

Where the rows are worked on is the :class:`~ingest.apply.placement.Placement`'s business (the
driver, or Spark's executors); who writes the commit is the :class:`~ingest.commit.writer.Writer`'s.
A batch the executors placement cannot plan -- truncates or tombstones only, or changes declaring
different keys for a table that has none yet -- has its rows collected and goes on with the driver
placement, through the same steps. The crash points (:mod:`ingest.crashpoints`) are where the
consistency proof kills the process.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest import crashpoints, logs
from ingest.apply.batch import BatchResult, Held, MicroBatch, RawFetch, foreign_key_reasons, unify_parts
from ingest.apply.moves import fill_moves
from ingest.apply.placement import CurrentPlan, Placement, VersionsPlan, Withdrawn
from ingest.apply.placement.driver import DriverPlacement
from ingest.apply.rereads import find_suspect_reads
from ingest.apply.stored import stored_rows
from ingest.columns import arrow_type, laid_out, normalize
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import POSITION_FORMAT, OpenTables, TableState
from ingest.commit.writer import CommitOutcome, CommitRequest, Writer
from ingest.config import PlacementName, TableSpec
from ingest.errors import OffsetsConflictError, TableError
from ingest.lake import locks
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath
from ingest.model import SourceMark
from ingest.quality.gate import QualityGate
from ingest.quality.verdict import QualityReport
from ingest.records import audit, quarantine
from ingest.records.audit import AuditRecord
from ingest.rules.history import REBUILD_STEPS, check_history_mode, count_history
from ingest.rules.kafka_tombstones import are_deletes, resolve
from ingest.rules.ordering import later_than_stored
from ingest.rules.rereads import SuspectReads
from ingest.rules.schema import SchemaPlan, check_column_names, plan_schema

log = logging.getLogger(__name__)

#: The state a replay assembles against: the messages it re-applies sit below the table's offsets.
_NOTHING_APPLIED = TableState(None, None, None, None)


def apply_batch(spec: TableSpec, paths: TablePaths, decoded: Any, *, placement: Placement[Any], writer: Writer,
                opened: OpenTables, batch_id: int, run_id: str, decode_ms: int = 0, gate: QualityGate | None = None,
                fetch_raw: RawFetch | None = None, replay: bool = False, defer_audit: bool = False,
                on_suspect_reads: Callable[[SuspectReads], object] | None = None) -> BatchResult:
    """Apply one table's share of a micro-batch (see module docstring). Idempotent under replay.

    Args:
        decoded: the decode step's output as ``placement`` takes it: Arrow parts on the driver, a
            DataFrame of parts on the executors.
        placement: where the batch's rows are worked on (one object per batch: it is released here).
        writer: who writes the table's commit.
        opened: the table's Delta handles, kept open from one batch to the next.
        gate: the table's quality gate (required when the table names an expectations suite).
        fetch_raw: fetches raw bytes of held-back changes from the source.
        replay: a quarantine replay: no offsets are recorded (the stream's progress does not move),
            messages that fail again are returned rather than quarantined a second time, and the
            audit row (status ``replayed``) is written only if something was committed.
        defer_audit: leave the audit row to the caller (``result.record``), which appends the rows
            of many tables in one commit. The table's commit carries the row in its metadata, so a
            crash before the caller appends loses nothing: :func:`ingest.records.audit.reconcile`
            restores it.
        on_suspect_reads: called with the batch's suspect reads before its commit, to have them read
            again (:mod:`ingest.stream.rereads`): a run that stops after the commit has asked already,
            and one that stops before it asks again when it applies the batch again.

    Raises:
        QualityGateError: expectations under policy ``fail`` failed; nothing was written.
        SchemaIncompatibleError, CommitConflictError, OffsetsConflictError, TableError: nothing was committed.
    """
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    state = opened.state()
    try:
        # 1. Assemble.
        batch = placement.assemble(decoded, _NOTHING_APPLIED if replay else state, spec,
                                   tuple(state.key_columns or spec.primary_key or ()))
        if batch.received == 0:
            return BatchResult(None, already_applied=batch.already_applied)
        if spec.expectations and gate is None:
            raise TableError(spec.name, f"names expectations suite {spec.expectations!r} but no quality gate was "
                                        "loaded")
        facts = placement.facts(batch.changes)
        known = state.key_columns or spec.primary_key
        if placement.name == "executors" and (facts.rows == 0 or (not known and len(facts.declared) != 1)):
            collected = _collected(batch)  # what the executors cannot plan, the driver does: same steps, outcome
            placement.release()
            batch, placement = collected, DriverPlacement(writer, paths.table)
            facts = placement.facts(batch.changes)
        declared = tuple(json.loads(facts.declared[0])) if facts.declared else None
        key_columns = tuple(known or declared or batch.tombstone_key() or ())
        record = AuditRecord(table=spec.name, run_id=run_id, batch_id=batch_id, received=batch.received,
                             started_at=started_at, decode_ms=decode_ms)
        record.offsets = json.dumps({f"{t}:{p}": span for (t, p), span in sorted(batch.offsets.items())})

        # 2. Hold back what cannot be applied; tombstones; the schema change.
        held, controls = Held(), batch.controls
        held.add_rows(batch.errors, "decode")
        changes = batch.changes
        if key_columns and facts.declared != [json.dumps(list(key_columns))]:
            changes, foreign = placement.take_foreign_keys(changes, key_columns)
            held.add_rows(foreign, "key", foreign_key_reasons(foreign, key_columns))
        if key_columns:
            changes = placement.with_key_columns(changes, key_columns, _key_types(key_columns, state, batch))
        changes = _tombstone_deletes(spec, batch, changes, key_columns, facts.flattened, state, writer, paths,
                                     placement, held, controls)
        schema = plan_schema(spec.name, state.columns, list(batch.columns))
        check_column_names(spec.name, schema.columns)
        changes = placement.typed_nulls(changes, schema.columns)
        record.skipped = sum(controls.values())

        # 3. Reduce (scd2 plans every change: its reduce is only for the gate); 4. validate the winners.
        keeps_history = spec.history_mode == "scd2"
        if key_columns and spec.ignore_null_updates:
            changes = placement.nulls_as_unchanged(changes, key_columns, schema.columns)
        if key_columns and facts.moved:  # primary-key moves: unchanged values from the old key's row
            changes = fill_moves(spec, placement, changes, key_columns, schema.columns, state, writer, paths.table,
                                 opened.moves)
        suspects = None
        if key_columns and facts.incremental and not replay:
            changes, suspects = find_suspect_reads(spec, placement, changes, key_columns, schema.columns, state,
                                                   writer, paths.table, opened.tombstones)
        record.suspect_reads = len(suspects) if suspects is not None else 0
        reduced = placement.reduce(changes, key_columns, schema.columns, soft=spec.delete_mode == "soft") \
            if not keeps_history or spec.expectations else None
        report, withdrawn = QualityReport(), None
        if spec.expectations and reduced is not None and key_columns:
            assert gate is not None
            report, withdrawn = placement.validate(gate, reduced, changes, state, key_columns, held,
                                                   batch_id=batch_id, run_id=run_id)
        record.expectations_evaluated, record.expectations_failed = report.evaluated, report.failed
        record.quality_status, record.quality_failures = report.status, report.failures_json()

        # 5. Quarantine first.
        held_records = held.resolve(spec.name, None if replay else fetch_raw, batch_id=batch_id, run_id=run_id)
        if not replay:
            quarantine.write(paths.quarantine, held_records)
        record.quarantined = len(held)
        crashpoints.point("after-quarantine")

        # 6. The guards; 7. plan; 8. commit.
        if not replay:
            refuse_to_move_backwards(spec.name, batch, state)
        locks.check(paths.table)  # on an object store: this run still holds the table's lease
        check_position_format(spec.name, state)
        check_history_mode(spec.name, spec.history_mode, state)
        record.engine = writer.name  # before the commit: the commit info carries the record
        if replay:
            record.status = "replayed"  # so `ingest history` tells a replay's commit from the stream's
        mark = state.mark if replay else state.mark.merged(facts.mark)
        request = _plan(spec, paths, placement, changes, reduced, withdrawn, schema, key_columns, state, record,
                        batch, facts.flattened, opened.tombstones, mark, replay=replay)
        if suspects and on_suspect_reads is not None:
            on_suspect_reads(suspects)
        outcome = writer.commit(request, state) if request is not None else CommitOutcome()
        crashpoints.point("after-delta-commit")

        # 9. The audit row.
        record.status = "replayed" if replay else "committed" if outcome.committed else "nothing-to-commit"
        # Only a table with columns can hold rows from before (a truncate creates one without any).
        unfilled = schema.unfilled_defaults(spec.name) if outcome.committed and state.columns else None
        if unfilled:
            logs.event(log, "source-defaults-not-filled", unfilled, table=spec.name, batch=batch_id,
                       level=logging.WARNING, columns=schema.added_defaults())
        record.rows_truncated = outcome.rows_truncated
        record.delta_version = outcome.delta_version
        record.apply_ms = outcome.merge_ms
        record.merge_metrics = json.dumps({k: v for k, v in sorted(outcome.metrics.items())
                                           if isinstance(v, int | float)})
        record.total_ms = decode_ms + int((time.perf_counter() - t0) * 1000)
        record.finished_at = datetime.now(UTC)
        record.source_committed_at = facts.newest
        record.snapshot_reads = facts.reads
        kept = not replay or outcome.committed
        if kept and not defer_audit:
            audit.append(paths.audit, [record])
        crashpoints.point("after-batch")
        return BatchResult(record if kept else None, already_applied=batch.already_applied, controls=controls,
                           quality=report, held=held_records, suspect_reads=suspects)
    finally:
        placement.release()


def apply_parts(spec: TableSpec, paths: TablePaths, parts: Sequence[pa.RecordBatch], *, writer: Writer | None = None,
                opened: OpenTables | None = None, **kwargs: Any) -> BatchResult:
    """:func:`apply_batch` of the decode step's parts, on the driver (``writer``: default delta-rs)."""
    writer = writer or DeltaRsWriter()
    own = opened is None  # nothing keeps the handles for a next batch: what they left behind is awaited here
    handles = OpenTables(paths, spec.name) if opened is None else opened
    try:
        return apply_batch(spec, paths, parts, placement=DriverPlacement(writer, paths.table), writer=writer,
                           opened=handles, **kwargs)
    finally:
        if own:
            handles.settle()


def placement_for(name: PlacementName, writer: Writer, path: LakePath, *, shares: int | None = None
                  ) -> Placement[Any]:
    """A new placement of kind ``name`` for one batch of the table at ``path``, written by ``writer``.

    The executors placement reads in the writer's session (delta-spark's; the configuration pairs
    no other writer with it); ``shares``: its key shares per rule (default: one per core).
    """
    if name == "driver":
        return DriverPlacement(writer, path)
    # Imported here: the executors placement brings pyspark, which a driver-only run need not load.
    from ingest.apply.placement.executors import ExecutorsPlacement

    session = getattr(writer, "session", None)
    if session is None:
        raise TableError(str(path), f"the executors placement needs writer delta-spark, not {writer.name}")
    return ExecutorsPlacement(session(), path, shares=shares)


def _plan(spec: TableSpec, paths: TablePaths, placement: Placement[Any], changes: Any, reduced: Any,
          withdrawn: Withdrawn[Any] | None, schema: SchemaPlan, key_columns: tuple[str, ...], state: TableState,
          record: AuditRecord, batch: MicroBatch[Any], flattened: bool | None, remembered: RememberedDeletes,
          mark: SourceMark, *, replay: bool) -> CommitRequest | None:
    """Steps 7 and 8's request: the plan, its counts in ``record``; ``None`` when nothing is to commit.

    A batch of control records only, for a table not created yet, has nothing to create it from
    and records nothing; a replay that finds nothing to apply commits nothing.
    """
    unborn = state.table is None and not schema.columns
    offsets = {} if replay else {tp: span[1] for tp, span in batch.offsets.items()}
    record.schema_change = schema.describe()

    def request(**planned: Any) -> CommitRequest:
        return CommitRequest(table=spec.name, path=paths.table, tombstones=remembered, delete_mode=spec.delete_mode,
                             key_columns=key_columns, schema=schema, offsets=offsets,
                             flattened=flattened if flattened is not None else state.flattened,
                             describe=lambda outcome: record.to_metadata(), mark=mark, **planned)

    if spec.history_mode == "scd2":
        if withdrawn is not None:
            changes = placement.without_keys(changes, withdrawn)
        tracked = [c.name for c in schema.columns if spec.track_history is None or spec.track_history.keeps(c.name)]
        versions: VersionsPlan = placement.plan_versions(changes, key_columns=key_columns, columns=schema.columns,
                                                         tracked=tracked, state=state)
        history = versions.plan
        if unborn and not history.truncates:
            return None
        count_history(record, history, withdrawn=withdrawn.changes if withdrawn else 0,
                      held=withdrawn.held if withdrawn else 0)
        if replay and versions.source.count == 0 and history.truncate is None:
            return None
        return request(source=versions.source, history_mode="scd2", truncate=history.truncate,
                       truncate_ts=history.truncate_ts, watermark=history.watermark,
                       truncate_log=history.truncate_log, updates=history.updates)
    assert reduced is not None
    if unborn and reduced.truncate is None:
        return None
    truncate = reduced.truncate.position if reduced.truncate else None
    if truncate is not None and state.truncate_position is not None and not later_than_stored(
            truncate, state.truncate_position):
        truncate = None  # an older or replayed truncate changes nothing
    plan: CurrentPlan = placement.plan_current(reduced, key_columns=key_columns, columns=schema.columns, state=state,
                                               remembered=remembered, hard=spec.delete_mode == "hard",
                                               new_truncate=truncate)
    record.superseded = reduced.superseded
    record.truncates = 1 if truncate else 0
    counts = plan.counts
    record.inserted, record.updated, record.deleted = counts.inserted, counts.updated, counts.deleted
    record.stale = counts.stale + (1 if reduced.truncate is not None and not truncate else 0)
    record.toast_unknown = counts.toast_unknown
    if replay and reduced.winners_count() == 0 and reduced.truncate is None:
        return None
    return request(source=plan.source, deletes=plan.deletes, truncate=truncate,
                   watermark=truncate or state.truncate_position, matched_deletes=counts.matched_deletes,
                   matched_updates=counts.matched_updates, history_mode=spec.history_mode,
                   new_keys_only=state.table is not None and plan.stored_keys == 0 and truncate is None,
                   new_deletes_only=plan.remembered_keys == 0)


def _tombstone_deletes(spec: TableSpec, batch: MicroBatch[Any], changes: Any, key_columns: tuple[str, ...],
                       flattened: bool | None, state: TableState, writer: Writer, paths: TablePaths,
                       placement: Placement[Any], held: Held, controls: Counter[str]) -> Any:
    """``changes`` with the deletes the batch's Kafka tombstones stand for, where they are deletes.

    Only what :func:`~ingest.rules.kafka_tombstones.resolve` reads of the changes comes to the
    driver: the key, coordinates, position and operation of the changes of the keys the tombstones
    name. Tombstones whose key could not be read, or is not the table's, are held for quarantine
    (stage ``key``); those that delete nothing are counted as skipped.
    """
    unreadable = batch.unreadable_tombstones
    if not batch.tombstones.num_rows and not unreadable.num_rows:
        return changes
    if not key_columns or not are_deletes(spec.kafka_tombstones, flattened, state.flattened):
        controls["tombstone"] += batch.tombstones.num_rows
        return changes
    held.add_rows(unreadable, "key", [f"tombstone: {r}" for r in unreadable["_cdc_reason"].to_pylist()])
    controls["tombstone"] -= unreadable.num_rows
    if not batch.tombstones.num_rows:
        return changes
    read = [*key_columns, "_cdc_partition", "_cdc_offset", "_cdc_position", "_cdc_op"]
    named = batch.tombstones.filter(pc.equal(batch.tombstones["_cdc_key_columns"], json.dumps(list(key_columns))))
    layout = placement.layout(changes)
    found = (placement.rows_of_keys(changes, named.select(list(key_columns)), read) if named.num_rows
             else pa.schema([layout.field(c) for c in read]).empty_table())
    candidates = laid_out(found.select(read), layout)
    lookup = writer.lookup(paths.table)
    resolution = resolve(batch.tombstones, candidates, key_columns,
                         stored_of=lambda keys: stored_rows(state.table, key_columns, keys, lookup=lookup))
    held.add_rows(resolution.unusable, "key")
    controls["tombstone"] += resolution.skipped
    return placement.with_rows(changes, resolution.deletes)


def _key_types(key_columns: tuple[str, ...], state: TableState, batch: MicroBatch[Any]) -> dict[str, pa.DataType]:
    """The Arrow type of each key column: the table's, else the tombstones', else text."""
    types = {c.name: arrow_type(c.type) for c in state.columns or ()}
    for k in key_columns:
        if k not in types:
            tombs = batch.tombstones
            types[k] = tombs.schema.field(k).type if k in tombs.column_names else pa.string()
    return types


def _collected(batch: MicroBatch[Any]) -> MicroBatch[pa.Table]:
    """A batch assembled on the executors, its change rows collected to the driver."""
    rows = normalize(batch.changes.toArrow()).cast(unify_parts([], batch.columns).schema)
    return MicroBatch(changes=rows, tombstones=batch.tombstones, meta=batch.meta, columns=batch.columns,
                      received=batch.received, already_applied=batch.already_applied, offsets=batch.offsets)


def refuse_to_move_backwards(table: str, batch: MicroBatch[Any], state: TableState) -> None:
    """The batch's offsets must be beyond what the table records (another writer may have moved it).

    Raises:
        OffsetsConflictError: some partition of the batch is applied up to or beyond its last offset.
    """
    for (topic, partition), (_first, last) in sorted(batch.offsets.items()):
        applied = state.applied_offset(topic, partition)
        if applied is not None and last <= applied:
            raise OffsetsConflictError(
                table, f"{topic}[{partition}] is already applied up to offset {applied}; this batch ends at {last}. "
                       "Refusing to move progress backwards (is another writer running on this table?)")


def check_position_format(table: str, state: TableState) -> None:
    """The table's positions must be encoded as this version encodes them (they are compared as text).

    Raises:
        TableError: the table was written with another format.
    """
    if state.table is not None and state.position_format != POSITION_FORMAT and state.key_columns is not None:
        raise TableError(table, f"was written with source-position format {state.position_format or 1}; this "
                                f"version writes format {POSITION_FORMAT} and cannot compare the two. Rebuild it "
                                f"({REBUILD_STEPS})")
