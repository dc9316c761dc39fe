"""The executors placement: a batch's change rows stay a Spark DataFrame, each rule run per key share.

The batch is assembled where the decode step left it (:mod:`.assembly`), split by a hash of the key
(:mod:`.shares`), and every per-key rule runs on each share in a Python worker: the reduce
(:mod:`.reduction`), the current-row plan against the stored rows Spark reads (:mod:`.merge_plan`)
and the scd2 versions (:mod:`.versions`). The driver receives what the audit and the commit need --
counts, schemas, the MERGE source's key bounds -- and the few rows it must quarantine: undecodable
messages, changes whose key is not the table's, Kafka tombstones (and, to resolve them, the key and
position of the changes they follow), and the rows the quality gate holds. The MERGE's source stays
on the executors, where delta-spark reads it (:class:`~ingest.commit.writer.SparkRows`).

Every frame the placement persists is released by :meth:`ExecutorsPlacement.release`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import NullType

from ingest.apply.batch import BatchFacts, Held, MicroBatch, unify_parts
from ingest.apply.placement import CurrentPlan, Reduced, VersionsPlan, Withdrawn
from ingest.apply.placement.executors.assembly import assemble_on_executors
from ingest.apply.placement.executors.merge_plan import plan_on_executors, remembered_on_executors, stored_on_executors
from ingest.apply.placement.executors.reduction import SparkReduction, reduce_on_executors
from ingest.apply.placement.executors.versions import history_on_executors
from ingest.columns import normalize
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import TableState
from ingest.commit.writer import SparkRows
from ingest.config import TableSpec
from ingest.model import SNAPSHOT_CLOSERS, ColumnSpec, SourceMark
from ingest.rules.moved import COORDINATES
from ingest.rules.reduce import Reduction, nulls_as_unchanged
from ingest.rules.withdraw import withdraw
from ingest.spark.session import arrow_frame, spark_type
from ingest.spark.sql import ident

if TYPE_CHECKING:
    from ingest.lake.location import LakePath
    from ingest.quality.gate import QualityGate
    from ingest.quality.verdict import QualityReport


class ExecutorsPlacement:
    """A table's batch on Spark's executors (see module docstring).

    Args:
        spark: the session the stored rows and remembered deletes are read in (the writer's).
        path: the target table.
        shares: key shares per rule (default: one per core of the session's context).
    """

    name: Literal["executors"] = "executors"

    def __init__(self, spark: SparkSession, path: LakePath, *, shares: int | None = None) -> None:
        self.spark, self.path, self.shares = spark, path, shares
        self._kept: list[Any] = []  # what release() lets go of
        self._layout: pa.Schema | None = None
        self._marks: pa.Table | None = None

    def assemble(self, decoded: DataFrame, state: TableState, spec: TableSpec,
                 key_columns: tuple[str, ...]) -> MicroBatch[DataFrame]:
        batch = assemble_on_executors(decoded, spec.topic, state, table=spec.name, select=spec.columns,
                                      key_columns=key_columns)
        self._kept.append(batch)
        self._layout = unify_parts([], batch.columns).schema
        return batch

    def facts(self, changes: DataFrame) -> BatchFacts:
        changed = F.col("_cdc_op") != F.lit("t")
        tracked, reads = F.col("_cdc_txn").isNotNull(), F.col("_cdc_op") == F.lit("r")
        found = changes.agg(
            F.max(F.when(changed, F.col("_cdc_flattened"))).alias("flattened"),
            F.collect_set(F.when(changed, F.col("_cdc_key_columns"))).alias("keys"),
            F.count(F.when(changed, True)).alias("rows"),
            # the source mark (ingest.apply.batch.source_mark_of, on the driver)
            F.max_by(F.when(tracked, F.struct("_cdc_txn", "_cdc_txn_order", "_cdc_position")),
                     F.when(tracked, F.col("_cdc_position"))).alias("last"),
            F.count(F.when(F.col("_cdc_snapshot").isin(*sorted(SNAPSHOT_CLOSERS)), True)).alias("closers"),
            F.count(F.when(reads & F.coalesce(F.col("_cdc_snapshot") != F.lit("incremental"), F.lit(True)),
                           True)).alias("reads"),
            F.count(F.when(~reads & ~tracked, True)).alias("untracked"),
            F.count(F.when(changed & (F.col("_cdc_old_key").isNotNull() | F.col("_cdc_new_key").isNotNull()),
                           True)).alias("moved"),
            F.max(F.unix_micros("_cdc_source_ts")).alias("newest"),
            F.count(F.when(reads, True)).alias("all_reads"),
            F.count(F.when(reads & (F.col("_cdc_snapshot") == F.lit("incremental")), True)).alias("incremental")
        ).first()
        assert found is not None
        last = found["last"]
        snapshot = "closed" if last is not None or found["closers"] else "open" if found["reads"] else "none"
        txn, order, position = last if last is not None else (None, None, None)
        mark = SourceMark(txn, order, position, snapshot, int(found["untracked"]))  # type: ignore[arg-type]
        newest = None if found["newest"] is None else datetime.fromtimestamp(found["newest"] / 1e6, UTC)
        return BatchFacts(found["flattened"], sorted(k for k in found["keys"] if k), int(found["rows"]), mark,
                          int(found["moved"]), newest, int(found["all_reads"]), int(found["incremental"]))

    def take_foreign_keys(self, changes: DataFrame, key_columns: tuple[str, ...]) -> tuple[DataFrame, pa.Table]:
        # as on the driver, a change that declares no key is not foreign
        foreign = F.coalesce((F.col("_cdc_op") != F.lit("t")) & (F.col("_cdc_key_columns") != F.lit(json.dumps(
            list(key_columns)))), F.lit(False))
        rows = normalize(changes.where(foreign).select(*(F.col(ident(c)) for c in changes.columns)).toArrow())
        return (changes.where(~foreign) if rows.num_rows else changes), rows

    def rows_of_keys(self, changes: DataFrame, keys: pa.Table, columns: list[str]) -> pa.Table:
        types = {f.name: f.dataType for f in changes.schema.fields}
        wanted = arrow_frame(changes.sparkSession, keys).select(
            *(F.col(ident(k)).cast(types[k]).alias(k) for k in keys.column_names)).distinct()
        found = (changes.where(F.col("_cdc_op") != F.lit("t")).join(F.broadcast(wanted), keys.column_names, "left_semi")
                 .select(*(F.col(ident(c)) for c in columns)))
        return normalize(found.toArrow())

    def layout(self, changes: DataFrame) -> pa.Schema:
        assert self._layout is not None, "assemble() first"
        return self._layout

    def with_rows(self, changes: DataFrame, rows: pa.Table) -> DataFrame:
        if not rows.num_rows:
            return changes
        extra = arrow_frame(changes.sparkSession, rows).select(
            *(F.col(ident(f.name)).cast(f.dataType).alias(f.name) for f in changes.schema.fields))
        return changes.unionByName(extra)

    def moved(self, changes: DataFrame) -> pa.Table:
        created = (~F.col("_cdc_op").isin("d", "t") & F.col("_cdc_old_key").isNotNull()
                   & (F.coalesce(F.size(F.col("_cdc_toast")), F.lit(0)) > 0))
        found = changes.where(created | ((F.col("_cdc_op") == F.lit("d")) & F.col("_cdc_new_key").isNotNull()))
        return normalize(found.select(*(F.col(ident(c)) for c in changes.columns)).toArrow())

    def incremental_keys(self, changes: DataFrame, key_columns: tuple[str, ...]) -> pa.Table:
        reads = (F.col("_cdc_op") == F.lit("r")) & (F.col("_cdc_snapshot") == F.lit("incremental"))
        return normalize(changes.where(reads).select(*(F.col(ident(k)) for k in key_columns)).distinct().toArrow())

    def replaced(self, changes: DataFrame, rows: pa.Table) -> DataFrame:
        if not rows.num_rows:
            return changes
        at = arrow_frame(changes.sparkSession, rows.select(list(COORDINATES)))
        return self.with_rows(changes.join(F.broadcast(at), list(COORDINATES), "left_anti"), rows)

    def with_key_columns(self, changes: DataFrame, key_columns: tuple[str, ...],
                         types: dict[str, pa.DataType]) -> DataFrame:

        for k in key_columns:
            if k not in changes.columns:
                changes = changes.withColumn(k, F.lit(None).cast(from_arrow_type(types[k], prefer_timestamp_ntz=True)))
                assert self._layout is not None
                self._layout = self._layout.append(pa.field(k, types[k]))
        return changes

    def typed_nulls(self, changes: DataFrame, columns: list[ColumnSpec]) -> DataFrame:

        final = {c.name: c.type for c in columns}
        for f in changes.schema.fields:
            if isinstance(f.dataType, NullType) and f.name in final:
                changes = changes.withColumn(f.name, F.col(ident(f.name)).cast(spark_type(final[f.name])))
        return changes

    def nulls_as_unchanged(self, changes: DataFrame, key_columns: tuple[str, ...],
                           columns: list[ColumnSpec]) -> DataFrame:
        def each(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                rows = normalize(pa.Table.from_batches([batch]))
                yield from nulls_as_unchanged(rows, key_columns, columns).to_batches()

        done = changes.mapInArrow(each, changes.schema).persist()  # every later step reads it
        self._kept.append(done)
        return done

    def reduce(self, changes: DataFrame, key_columns: tuple[str, ...], columns: list[ColumnSpec], *,
               soft: bool) -> SparkReduction:
        reduction = reduce_on_executors(changes, key_columns, columns, soft=soft, shares=self.shares)
        self._kept.append(reduction)
        self._marks = reduction.marks
        return reduction

    def validate(self, gate: QualityGate, reduced: Reduced, changes: DataFrame, state: TableState,
                 key_columns: tuple[str, ...], held: Held, *, batch_id: int,
                 run_id: str) -> tuple[QualityReport, Withdrawn[DataFrame] | None]:
        """The gate validates the winners where they are; only the rows it holds are collected, with
        the earlier changes of their keys (bound for quarantine with them), and their winners leave
        the reduction on the executors."""
        assert isinstance(reduced, SparkReduction)
        report, rows = gate.check_frame(reduced.winners, state.columns, key_columns, batch_id=batch_id,
                                        run_id=run_id)
        if not report.held:
            return report, None
        before = len(held)
        chosen = rows.take(pa.array(sorted(report.held), pa.int64()))
        types = {f.name: f.dataType for f in reduced.tagged.schema.fields}
        keys = arrow_frame(changes.sparkSession, chosen.select(list(key_columns))).select(
            *(F.col(ident(k)).cast(types[k]).alias(k) for k in key_columns)).distinct()
        earlier = changes.where(F.col("_cdc_op") != F.lit("t")).join(F.broadcast(keys), list(key_columns), "left_semi")
        collected = normalize(earlier.select(*(F.col(ident(c)) for c in changes.columns)).toArrow())
        local = Reduction(winners=rows, truncate=reduced.truncate)
        out = withdraw(local, collected, report.held)
        held.add_rows(out.rows, "quality", out.reasons, out.expectations, out.row_keys)
        reduced.superseded += local.superseded  # the earlier changes move from superseded to quarantined
        reduced.drop_winners(keys, key_columns)
        return report, Withdrawn(keys, collected.num_rows, len(held) - before)

    def without_keys(self, changes: DataFrame, withdrawn: Withdrawn[DataFrame]) -> DataFrame:
        # a truncate has no key: it stays
        return changes.join(F.broadcast(withdrawn.keys), withdrawn.keys.columns, "left_anti")

    def plan_current(self, reduced: Reduced, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                     state: TableState, remembered: RememberedDeletes, hard: bool,
                     new_truncate: str | None) -> CurrentPlan:
        assert isinstance(reduced, SparkReduction)
        key_types = {c.name: c.type for c in columns if c.name in key_columns}
        stored = stored_on_executors(self.spark, self.path, state.table, key_columns, reduced.tagged)
        tombs = remembered_on_executors(self.spark, remembered, key_columns, key_types, reduced.tagged) if hard \
            else None
        plan = plan_on_executors(reduced, key_columns=key_columns, columns=columns, stored=stored, tombstones=tombs,
                                 old_truncate=state.truncate_position, new_truncate=new_truncate, hard=hard,
                                 shares=self.shares)
        self._kept.append(plan)
        return CurrentPlan(plan.counts, SparkRows(plan.source, plan.source_rows, plan.bounds),
                           SparkRows(plan.deletes, plan.counts.deleted, plan.bounds.slice(0, 0)), plan.stored_keys)

    def plan_versions(self, changes: DataFrame, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                      tracked: list[str] | None, state: TableState) -> VersionsPlan:
        plan, where = history_on_executors(changes, key_columns=key_columns, columns=columns, tracked=tracked,
                                           path=self.path, table=state.table,
                                           watermark=state.truncate_position, truncate_log=state.truncate_log,
                                           shares=self.shares, marks=self._marks)
        self._kept.append(where)
        return VersionsPlan(plan, SparkRows(where.source, where.source_rows, where.bounds))

    def release(self) -> None:
        for kept in reversed(self._kept):
            if isinstance(kept, DataFrame):
                kept.unpersist()
            else:
                kept.release()
        self._kept.clear()
