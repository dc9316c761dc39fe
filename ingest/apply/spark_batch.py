"""One table's batch applied with its rows on Spark's executors, from change rows to the commit.

The driver's journey (:mod:`ingest.apply.pipeline`) holds the batch's rows as Arrow tables. Here
they stay in Spark: the reduce (:mod:`ingest.apply.spark_reduce`), the stored rows and remembered
deletes of the batch's keys, the plan (:mod:`ingest.apply.spark_plan`), the remembered deletes this
batch adds, and the MERGE's source, which the delta-spark engine reads from the executors
(:attr:`~ingest.commit.writer.CommitRequest.frame`). The driver handles the table's state, the
schema plan, the counts and the commit's metadata.

The stream takes this path for a delta-spark table when ``target.plan_on`` is ``executors``
(:func:`apply_decoded`). Undecodable messages are quarantined from the driver (they are among the
few rows it collects); so are the Kafka tombstones, which in a flattened stream become deletes
joined to the changes on the executors. The quality gate validates the winners' DataFrame with
GX's Spark engine; the rows it holds, and the earlier changes of their keys, are collected for
quarantine (:func:`_withdraw`). A ``history_mode: scd2`` table's versions are derived on the
executors too (:mod:`ingest.apply.spark_history`), from every change of the batch less those of the
keys the gate held. What this path does not do yet, so a batch that needs it has its change rows
collected and takes the driver's journey: a batch of truncates or tombstones only (it has no change
rows to keep off the driver), and changes that declare different keys for a table that has none
yet (the driver takes the first one seen). Changes whose key is not the table's are collected for
quarantine.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ingest import crashpoints
from ingest.apply.batch import MicroBatch, unify_parts
from ingest.apply.pipeline import (
    BatchResult,
    Held,
    RawFetch,
    check_position_format,
    hold_foreign_keys,
    process_batch,
    refuse_to_move_backwards,
)
from ingest.apply.rules.history import check_history_mode, count_history
from ingest.apply.rules.kafka_tombstones import are_deletes, resolve
from ingest.apply.rules.ordering import later_than_stored, later_than_stored_sql
from ingest.apply.rules.reduce import Reduction
from ingest.apply.rules.schema import SchemaPlan, plan_schema
from ingest.apply.rules.withdraw import withdraw
from ingest.apply.spark_history import history_on_executors
from ingest.apply.spark_microbatch import ExecutorBatch
from ingest.apply.spark_plan import SparkPlan, plan_on_executors, stored_on_executors
from ingest.apply.spark_reduce import SparkReduction, reduce_on_executors
from ingest.apply.stored import KeyLookup
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import OpenTables, TableState
from ingest.commit.writer import CommitOutcome, CommitRequest, Writer
from ingest.config import TableSpec
from ingest.errors import TableError
from ingest.lake import locks
from ingest.lake.delta import normalize, open_table
from ingest.lake.location import LakePath
from ingest.lake.tables import TablePaths
from ingest.model import ColumnSpec
from ingest.quality.gate import QualityGate, QualityReport
from ingest.records import audit, quarantine
from ingest.records.audit import AuditRecord

if TYPE_CHECKING:
    from ingest.commit.delta_spark import DeltaSparkWriter


def remembered_on_executors(spark: SparkSession, remembered: RememberedDeletes, key_columns: tuple[str, ...],
                            key_types: Mapping[str, str], keys: DataFrame) -> DataFrame | None:
    """:meth:`RememberedDeletes.read <ingest.commit.remembered.RememberedDeletes.read>` of the keys in ``keys``,
    read and matched by Spark (``None``: nothing remembered yet)."""
    from ingest.commit.delta_spark import frame_of_keys, ident

    delta = remembered.open(key_types)
    if delta is None:
        return None
    return frame_of_keys(spark, LakePath.of(remembered.path), delta.version(), key_columns,
                         keys.select(*(F.col(ident(k)) for k in key_columns)).distinct(),
                         [*key_columns, "_cdc_position"])


def remember_on_executors(spark: SparkSession, remembered: RememberedDeletes, key_columns: tuple[str, ...],
                          key_types: Mapping[str, str], deletes: DataFrame) -> None:
    """:meth:`RememberedDeletes.record <ingest.commit.remembered.RememberedDeletes.record>` of ``deletes`` (the key
    columns, ``_cdc_position`` and ``_cdc_source_ts`` of each delete) by delta-spark: the same
    columns, the same position guard."""
    from delta.tables import DeltaTable

    from ingest.commit.delta_spark import ident
    from ingest.spark.session import spark_location, spark_type

    now = datetime.now(UTC)
    source = deletes.select(
        *(F.col(ident(k)).cast(spark_type(key_types[k])).alias(k) for k in key_columns),
        F.col("_cdc_position"), F.col("_cdc_source_ts").cast("timestamp").alias("_cdc_deleted_at"),
        F.lit(now).cast("timestamp").alias("_cdc_recorded_at"))
    location = spark_location(spark, LakePath.of(remembered.path))
    if remembered.open(key_types) is None:
        source.write.format("delta").mode("append").save(location)
        return
    on = " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in key_columns)
    (DeltaTable.forPath(spark, location).alias("t").merge(source.alias("s"), on)
     .whenMatchedUpdateAll(later_than_stored_sql("s._cdc_position", "t._cdc_position"))
     .whenNotMatchedInsertAll()
     .execute())


def apply_on_executors(spec: TableSpec, paths: TablePaths, changes: DataFrame, columns: list[ColumnSpec], *,
                       state: TableState, engine: object, record: AuditRecord,
                       offsets: dict[tuple[str, int], int], flattened: bool | None,
                       declared: tuple[str, ...] | None = None, shares: int | None = None,
                       gate: QualityGate | None = None, held: Held | None = None,
                       before_commit: Callable[[QualityReport], None] | None = None) -> CommitOutcome:
    """Reduce, validate, plan and commit ``changes`` (the columns of
    :attr:`~ingest.apply.batch.MicroBatch.changes`, of the combined ``columns``) on the
    executors, with the delta-spark ``engine``; ``record`` gets the batch's counts. ``declared``:
    the primary key the batch's changes declare (the table's own, once it has one, prevails).
    A ``history_mode: scd2`` table's versions are derived from every change (:func:`_commit_history`):
    it is reduced only for its gate.

    Args:
        gate: the table's quality gate (required when it names an expectations suite): it validates
            the winners where they are; the ones it holds are withdrawn with their keys' earlier
            changes into ``held``, as on the driver (:func:`_withdraw`).
        before_commit: called with the gate's report once the batch is validated, before anything
            is planned or written (the caller quarantines there, then checks its guards).

    Raises:
        QualityGateError: expectations under policy ``fail`` failed; nothing was written.
        TableError: the table needs what this path does not do yet (module docstring).
    """
    from ingest.apply.pipeline import empty_plan
    from ingest.commit.delta_spark import DeltaSparkWriter

    if not isinstance(engine, DeltaSparkWriter):
        raise TableError(spec.name, "only the delta-spark engine applies a batch on the executors")
    if spec.expectations and (gate is None or held is None):
        raise TableError(spec.name, f"names expectations suite {spec.expectations!r} but no quality gate was loaded")
    key_columns = tuple(state.key_columns or spec.primary_key or declared or ())
    if not key_columns:
        raise TableError(spec.name, "a batch without a primary key is applied on the driver")
    spark = engine.session()
    schema = plan_schema(spec.name, state.columns, columns)
    soft, hard = spec.delete_mode == "soft", spec.delete_mode == "hard"
    history = spec.history_mode == "scd2"
    gated = gate is not None and held is not None
    # scd2 plans every change, not the winners: only the gate needs them
    reduction = reduce_on_executors(changes, key_columns, schema.columns, soft=soft,
                                    nulls_unchanged=spec.ignore_null_updates, shares=shares) \
        if gated or not history else None
    plan: SparkPlan | None = None
    try:
        report, withdrawn = QualityReport(), None
        if gated:
            assert gate is not None and held is not None and reduction is not None
            report, rows = gate.check_frame(reduction.winners, state.columns, key_columns, batch_id=record.batch_id,
                                            run_id=record.run_id)
            if report.held:
                before = len(held)
                keys, earlier = _withdraw(reduction, changes, rows, report, held, key_columns)
                withdrawn = (keys, earlier, len(held) - before)
        record.expectations_evaluated, record.expectations_failed = report.evaluated, report.failed
        record.quality_status, record.quality_failures = report.status, report.failures_json()
        if before_commit is not None:
            before_commit(report)
        if history:
            return _commit_history(spec, paths, changes, withdrawn, schema, key_columns=key_columns, state=state,
                                   engine=engine, record=record, offsets=offsets, flattened=flattened, shares=shares,
                                   marks=reduction.marks if reduction is not None else None)
        assert reduction is not None
        truncate = reduction.truncate.position if reduction.truncate else None
        if truncate is not None and state.truncate_position is not None and not later_than_stored(
                truncate, state.truncate_position):
            truncate = None  # an older or replayed truncate changes nothing
        table = open_table(paths.table)
        key_types = {c.name: c.type for c in schema.columns if c.name in key_columns}
        remembered = RememberedDeletes(paths.tombstones, spec.name)
        stored = stored_on_executors(spark, paths.table, table, key_columns, reduction.tagged)
        tombs = remembered_on_executors(spark, remembered, key_columns, key_types, reduction.tagged) if hard else None
        plan = plan_on_executors(reduction, key_columns=key_columns, columns=schema.columns, stored=stored,
                                 tombstones=tombs, old_truncate=state.truncate_position, new_truncate=truncate,
                                 hard=hard, shares=shares)
        record.superseded = reduction.superseded
        record.truncates = 1 if truncate else 0
        record.inserted, record.updated, record.deleted = plan.inserted, plan.updated, plan.deleted
        record.stale = plan.stale + (1 if reduction.truncate is not None and not truncate else 0)
        record.toast_unknown = plan.toast_unknown
        record.schema_change = schema.describe()
        record.engine = engine.name
        counts = replace(empty_plan(schema.columns), matched_deletes=plan.matched_deletes,
                         matched_updates=plan.matched_updates)
        request = CommitRequest(
            table=spec.name, path=paths.table, tombstones=remembered, delete_mode=spec.delete_mode,
            key_columns=key_columns, schema=schema, plan=counts, truncate=truncate,
            watermark=truncate or state.truncate_position, offsets=offsets,
            flattened=flattened if flattened is not None else state.flattened, history_mode=spec.history_mode,
            describe=lambda outcome: record.to_metadata(),
            new_keys_only=state.table is not None and plan.stored_keys == 0 and truncate is None, frame=plan)
        return engine.commit(request, state)
    finally:
        if plan is not None:
            plan.release()
        if reduction is not None:
            reduction.release()


def _commit_history(spec: TableSpec, paths: TablePaths, changes: DataFrame,
                    withdrawn: tuple[DataFrame, int, int] | None, schema: SchemaPlan, *, key_columns: tuple[str, ...],
                    state: TableState, engine: DeltaSparkWriter, record: AuditRecord,
                    offsets: dict[tuple[str, int], int], flattened: bool | None, shares: int | None,
                    marks: pa.Table | None = None) -> CommitOutcome:
    """The scd2 plan and commit of ``changes`` (:mod:`ingest.apply.spark_history`), less every
    change of the keys the gate held (``withdrawn``: those keys, how many changes of them were
    collected, how many records the gate quarantined), as the driver's journey commits it.
    ``marks``: the batch's truncates, when the gate's reduce collected them already."""
    from ingest.apply.pipeline import empty_plan

    if withdrawn is not None:  # a truncate has no key: it stays
        changes = changes.join(F.broadcast(withdrawn[0]), list(key_columns), "left_anti")
    tracked = [c.name for c in schema.columns if spec.track_history is None or spec.track_history.keeps(c.name)]
    plan = history_on_executors(changes, key_columns=key_columns, columns=schema.columns, tracked=tracked,
                                path=paths.table, table=state.table, watermark=state.truncate_position,
                                truncate_log=state.truncate_log, nulls_unchanged=spec.ignore_null_updates,
                                shares=shares, marks=marks)
    try:
        count_history(record, plan, withdrawn=withdrawn[1] if withdrawn else 0, held=withdrawn[2] if withdrawn else 0)
        record.schema_change = schema.describe()
        record.engine = engine.name
        request = CommitRequest(
            table=spec.name, path=paths.table, tombstones=RememberedDeletes(paths.tombstones, spec.name),
            delete_mode=spec.delete_mode, key_columns=key_columns, schema=schema, plan=empty_plan(schema.columns),
            truncate=plan.truncate, watermark=plan.watermark, truncate_log=plan.truncate_log, offsets=offsets,
            flattened=flattened if flattened is not None else state.flattened, history_mode="scd2", history=plan,
            describe=lambda outcome: record.to_metadata())
        return engine.commit(request, state)
    finally:
        plan.frame.release()


def _withdraw(reduction: SparkReduction, changes: DataFrame, rows: pa.Table, report: QualityReport, held: Held,
              key_columns: tuple[str, ...]) -> tuple[DataFrame, int]:
    """:func:`~ingest.apply.rules.withdraw.withdraw` of the winners the gate holds (``rows``, which
    ``report.held`` indexes) from a reduction on the executors: the earlier changes of their keys
    are collected (bound for quarantine with them), and the winners of those keys leave the
    reduction on the executors. Returns those keys (distinct, a DataFrame) and how many changes of
    them were collected."""
    from ingest.commit.delta_spark import ident
    from ingest.spark.session import arrow_frame

    spark = changes.sparkSession
    chosen = rows.take(pa.array(sorted(report.held), pa.int64()))
    types = {f.name: f.dataType for f in reduction.tagged.schema.fields}
    keys = arrow_frame(spark, chosen.select(list(key_columns))).select(
        *(F.col(ident(k)).cast(types[k]).alias(k) for k in key_columns)).distinct()
    earlier = changes.where(F.col("_cdc_op") != F.lit("t")).join(F.broadcast(keys), list(key_columns), "left_semi")
    local = Reduction(winners=rows, truncate=reduction.truncate)
    collected = normalize(earlier.select(*(F.col(ident(c)) for c in changes.columns)).toArrow())
    withdraw(local, collected, report, held)
    reduction.superseded += local.superseded  # the earlier changes move from superseded to quarantined
    reduction.drop_winners(keys, key_columns)
    return keys, collected.num_rows


def apply_decoded(spec: TableSpec, paths: TablePaths, decoded: DataFrame, *, opened: OpenTables, batch_id: int,
                  run_id: str, engine: Writer, decode_ms: int = 0, fetch_raw: RawFetch | None = None,
                  defer_audit: bool = False, shares: int | None = None, gate: QualityGate | None = None) -> BatchResult:
    """:func:`~ingest.apply.pipeline.apply_parts` of the table's share of ``decoded`` (the decode
    step's parts as a DataFrame), its rows kept on the executors: assembled there
    (:func:`~ingest.apply.spark_microbatch.assemble_on_executors`), then reduced, validated by
    ``gate`` (the table's quality gate, with a Spark session), planned and committed by
    :func:`apply_on_executors`, with the same quarantine, guards, fault points and audit row as
    the driver's journey.

    A batch this path does not reach (module docstring; a batch of truncates or tombstones only)
    has its change rows collected and goes the driver's journey instead
    (:func:`~ingest.apply.pipeline.process_batch`): the same outcome.
    """
    from ingest.apply.spark_microbatch import assemble_on_executors

    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    state = opened.state()
    batch = assemble_on_executors(decoded, spec.topic, state, table=spec.name, select=spec.columns,
                                  key_columns=tuple(spec.primary_key or ()))
    try:
        if batch.received == 0:
            return BatchResult(None, already_applied=batch.already_applied)
        facts = batch.changes.agg(
            F.max(F.when(F.col("_cdc_op") != F.lit("t"), F.col("_cdc_flattened"))).alias("flattened"),
            F.collect_set(F.when(F.col("_cdc_op") != F.lit("t"), F.col("_cdc_key_columns"))).alias("keys"),
            F.count(F.when(F.col("_cdc_op") != F.lit("t"), True)).alias("rows")).first()
        assert facts is not None
        flattened = facts["flattened"]
        declared = sorted(k for k in facts["keys"] if k)
        key_columns = tuple(state.key_columns or spec.primary_key or (json.loads(declared[0]) if declared else ()))
        known = state.key_columns or spec.primary_key  # else the batch's first change declares it
        if not key_columns or facts["rows"] == 0 or (len(declared) > 1 and not known):
            return _on_driver(spec, paths, batch, state, opened, batch_id=batch_id, run_id=run_id, engine=engine,
                              decode_ms=decode_ms, fetch_raw=fetch_raw, defer_audit=defer_audit, gate=gate)
        record = AuditRecord(table=spec.name, run_id=run_id, batch_id=batch_id, received=batch.received,
                             started_at=started_at, decode_ms=decode_ms)
        record.offsets = json.dumps({f"{t}:{p}": span for (t, p), span in sorted(batch.offsets.items())})
        held = Held()
        meta = batch.meta
        held.add_rows(meta.filter(pc.equal(meta["_cdc_kind"], "error")), "decode")
        controls = Counter(k for k in meta["_cdc_kind"].to_pylist() if k != "error")
        changes = batch.changes
        if declared != [json.dumps(list(key_columns))]:
            changes = _hold_foreign_keys_of(changes, key_columns, held)
        if are_deletes(spec.kafka_tombstones, flattened, state.flattened):
            changes = _with_tombstone_deletes(batch, changes, key_columns, engine.lookup(paths.table), state, held,
                                              controls)
        else:
            controls["tombstone"] += batch.tombstones.num_rows
        record.skipped = sum(controls.values())
        checked, held_records = QualityReport(), []

        def quarantine_first(report: QualityReport) -> None:
            """Quarantine, then the guards (the driver's steps 5 and 6), once the winners are validated."""
            nonlocal checked, held_records
            checked, held_records = report, held.resolve(spec, fetch_raw, batch_id=batch_id, run_id=run_id)
            quarantine.write(paths.quarantine, held_records)
            record.quarantined = len(held)
            crashpoints.point("after-quarantine")
            refuse_to_move_backwards(spec.name, batch, state, True)  # type: ignore[arg-type]
            locks.check(paths.table)
            check_position_format(spec.name, state)
            check_history_mode(spec.name, spec.history_mode, state)

        outcome = apply_on_executors(spec, paths, changes, batch.columns, state=state, engine=engine,
                                     record=record, flattened=flattened,
                                     offsets={tp: span[1] for tp, span in batch.offsets.items()},
                                     declared=key_columns, shares=shares, gate=gate, held=held,
                                     before_commit=quarantine_first)
        crashpoints.point("after-delta-commit")
        record.status = "committed" if outcome.committed else "nothing-to-commit"
        record.rows_truncated = outcome.rows_truncated
        record.delta_version = outcome.delta_version
        record.apply_ms = outcome.merge_ms
        record.merge_metrics = json.dumps({k: v for k, v in sorted(outcome.metrics.items())
                                           if isinstance(v, int | float)})
        record.total_ms = decode_ms + int((time.perf_counter() - t0) * 1000)
        record.finished_at = datetime.now(UTC)
        if not defer_audit:
            audit.append(paths.audit, [record])
        crashpoints.point("after-batch")
        return BatchResult(record, already_applied=batch.already_applied, controls=controls,
                           quality=checked, held=held_records)
    finally:
        batch.release()


def _hold_foreign_keys_of(changes: DataFrame, key_columns: tuple[str, ...], held: Held) -> DataFrame:
    """:func:`~ingest.apply.pipeline.hold_foreign_keys` on the executors: the changes whose primary
    key is not the table's are collected (bound for quarantine) and leave the batch."""
    from ingest.commit.delta_spark import ident

    # as there, a change that declares no key is not foreign
    foreign = F.coalesce((F.col("_cdc_op") != F.lit("t")) & (F.col("_cdc_key_columns") != F.lit(json.dumps(
        list(key_columns)))), F.lit(False))
    rows = normalize(changes.where(foreign).select(*(F.col(ident(c)) for c in changes.columns)).toArrow())
    hold_foreign_keys(rows, key_columns, held)
    return changes.where(~foreign)


def _with_tombstone_deletes(batch: ExecutorBatch, changes: DataFrame, key_columns: tuple[str, ...],
                            lookup: KeyLookup, state: TableState, held: Held, controls: Counter[str]) -> DataFrame:
    """``changes`` (the batch's, less those held) with the deletes the batch's Kafka tombstones
    stand for (a flattened stream), as the driver's journey derives them
    (:func:`~ingest.apply.rules.kafka_tombstones.resolve`).

    The tombstones are on the driver already. Of the change rows, only what ``resolve`` reads comes
    to it: the key, coordinates, position and operation of the changes of the keys the tombstones
    name. The deletes it derives join the changes on the executors. Tombstones whose key could not
    be read, or is not the table's, are held for quarantine (stage ``key``); those that delete
    nothing are counted as skipped.
    """
    from ingest.commit.delta_spark import ident
    from ingest.spark.session import arrow_frame

    meta = batch.meta
    unreadable = meta.filter(pc.and_(pc.equal(meta["_cdc_kind"], "tombstone"), pc.is_valid(meta["_cdc_reason"])))
    held.add_rows(unreadable, "key", [f"tombstone: {r}" for r in unreadable["_cdc_reason"].to_pylist()])
    controls["tombstone"] -= unreadable.num_rows
    if not batch.tombstones.num_rows:
        return changes
    spark = changes.sparkSession
    types = {f.name: f.dataType for f in changes.schema.fields}
    named = batch.tombstones.filter(pc.equal(batch.tombstones["_cdc_key_columns"], json.dumps(list(key_columns))))
    keys = arrow_frame(spark, named.select(list(key_columns))).select(
        *(F.col(ident(k)).cast(types[k]).alias(k) for k in key_columns)).distinct()
    read = [*key_columns, "_cdc_partition", "_cdc_offset", "_cdc_position", "_cdc_op"]
    found = normalize(changes.where(F.col("_cdc_op") != F.lit("t")).join(keys, list(key_columns), "left_semi")
                      .select(*(F.col(ident(c)) for c in read)).toArrow())
    # The changes' layout, only those columns filled: the derived deletes take it.
    layout = unify_parts([], batch.columns).schema
    candidates = pa.Table.from_arrays(
        [found[f.name].cast(f.type) if f.name in read else pa.nulls(found.num_rows, f.type) for f in layout],
        schema=layout)
    resolution = resolve(batch.tombstones, candidates, key_columns, state.table, lookup=lookup)
    held.add_rows(resolution.unusable, "key")
    controls["tombstone"] += resolution.skipped
    if not resolution.deletes.num_rows:
        return changes
    deletes = arrow_frame(spark, resolution.deletes).select(
        *(F.col(ident(f.name)).cast(f.dataType).alias(f.name) for f in changes.schema.fields))
    return changes.unionByName(deletes)


def _on_driver(spec: TableSpec, paths: TablePaths, batch: ExecutorBatch, state: TableState, opened: OpenTables,
               **kwargs: Any) -> BatchResult:
    """The driver's journey for a batch assembled on the executors: its change rows collected."""
    rows = MicroBatch(changes=normalize(batch.changes.toArrow()).cast(unify_parts([], batch.columns).schema),
                      tombstones=batch.tombstones, meta=batch.meta, columns=batch.columns, received=batch.received,
                      already_applied=batch.already_applied, offsets=batch.offsets)
    return process_batch(spec, paths, rows, state=state, remembered=opened.tombstones, **kwargs)
