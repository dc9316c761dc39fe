"""SCD type 2 on Spark's executors: the driver's history plan, run on shares of the batch split by key.

:func:`~ingest.rules.history.plan_history` derives the versions of every key a batch touches from
that key's story: its stored versions, the batch's changes of it and the table's truncates. All of
it is per key, given the truncates. So, as for the current-row plan
(:mod:`ingest.apply.placement.executors.merge_plan`), the batch's changes and the stored versions of
their keys (read by Spark) are split by the same hash of the key, and each share is planned by the
same function in a Python worker
(``cogroup(...).applyInArrow``), with the batch's truncates added to every share.

What comes to the driver: the batch's truncates (few), and one row of counts per share, summed in
one aggregate with the MERGE source's size and first-key bounds. The truncate fields of the plan --
which truncate ends the untouched keys' versions, the table's truncate log after the batch -- are
the driver's own :func:`~ingest.rules.history.plan_history` of the truncates alone. Each share
counts the truncates that change nothing once; they are counted once for the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ingest.apply.placement.executors.shares import bound_aggregates, bounds_of, share_of
from ingest.columns import normalize
from ingest.lake.delta import table_schema
from ingest.lake.location import LakePath
from ingest.model import ColumnSpec
from ingest.rules.history import HistoryPlan, plan_history
from ingest.spark.reads import frame_of_keys
from ingest.spark.sql import ident

#: The share's counts, as columns of its one counts row (null in its source rows).
COUNTS: Final = ("inserted", "updated", "deleted", "stale", "superseded", "updates", "toast_unknown")
#: Marks a share's counts row.
_COUNTED: Final = "_cdc_counted"


@dataclass(slots=True)
class SparkHistory:
    """A :class:`~ingest.rules.history.HistoryPlan`'s MERGE source on the executors (``rows``
    persisted: call :meth:`release` when done)."""

    rows: DataFrame
    #: the versions to write and, flagged :data:`~ingest.rules.history.DROP`, the ones to drop
    source: DataFrame
    #: the source's first key column's least and greatest value (two rows: the MERGE's bounds)
    bounds: pa.Table
    source_rows: int = 0

    def release(self) -> None:
        self.rows.unpersist()


def history_on_executors(changes: DataFrame, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                         tracked: list[str] | None, path: LakePath, table: DeltaTable | None,
                         watermark: str | None, truncate_log: list[tuple[str, datetime | None]],
                         shares: int | None = None, marks: pa.Table | None = None) -> tuple[HistoryPlan, SparkHistory]:
    """:func:`~ingest.rules.history.plan_history` of ``changes`` (the columns of
    :attr:`~ingest.apply.batch.MicroBatch.changes`), in shares by key hash on the executors: the
    plan's counts and truncate fields (its ``source`` is empty), and the source where it is.
    ``marks``: the batch's truncates, when collected already
    (:attr:`~ingest.apply.placement.executors.reduction.SparkReduction.marks`)."""

    spark = changes.sparkSession
    shares = shares or spark.sparkContext.defaultParallelism
    is_truncate = F.col("_cdc_op") == F.lit("t")
    if marks is None:
        marks = normalize(changes.where(is_truncate).toArrow())
    plan = plan_history(marks, key_columns=key_columns, columns=columns, tracked=tracked, watermark=watermark,
                        truncate_log=truncate_log, stored_of=lambda keys: None)
    unused = plan.stale  # the truncates that change nothing: every share counts them again
    rows = changes.where(~is_truncate)
    key_types = {f.name: f.dataType for f in rows.schema.fields if f.name in key_columns}
    stored_schema = normalize(table_schema(table).empty_table()).schema if table is not None else pa.schema([])
    names = stored_schema.names
    has_stored = bool(names) and all(k in names for k in key_columns)
    if has_stored:
        assert table is not None
        keys = rows.select(*(F.col(ident(k)) for k in key_columns)).distinct()
        found = frame_of_keys(spark, path, table.version(), key_columns, keys, names)
        # keys in the changes' types: the hash of a value depends on its type
        found = found.select(*(F.col(ident(n)).cast(key_types[n]).alias(n) if n in key_types else F.col(ident(n))
                               for n in names))
    else:
        # not derived from ``rows``: the cogroup would see one lineage on both sides
        found = spark.createDataFrame([], rows.select(*(F.col(ident(k)) for k in key_columns)).schema)

    def planned(batch: pa.Table, versions: pa.Table) -> pa.Table:
        batch = normalize(batch)
        truncates = marks.select(batch.column_names).cast(batch.schema)  # the shares' columns may be reordered
        stored = normalize(versions).cast(stored_schema) if has_stored else None
        share = plan_history(pa.concat_tables([batch, truncates]), key_columns=key_columns, columns=columns,
                             tracked=tracked, watermark=watermark, truncate_log=truncate_log,
                             stored_of=lambda keys: stored)
        counts = {n: getattr(share, n) for n in COUNTS}
        counts["stale"] -= unused
        source = share.source.append_column(_COUNTED, pa.array([False] * share.source.num_rows, pa.bool_()))
        tail = pa.Table.from_arrays(
            [pa.nulls(1, f.type) for f in share.source.schema] + [pa.array([True])], schema=source.schema)
        out = pa.concat_tables([source, tail])
        for name in COUNTS:
            value = counts[name]
            out = out.append_column(f"_cdc_n_{name}", pa.array([None] * source.num_rows + [value], pa.int64()))
        return out

    empty = normalize(rows.limit(0).toArrow())
    shape = planned(empty, normalize(found.limit(0).toArrow())).schema

    def plan_share(batch: pa.Table, versions: pa.Table) -> pa.Table:
        return planned(batch, versions).cast(shape)

    share = share_of(key_columns, shares)
    planned_rows = (rows.groupBy(share.alias("_cdc_share")).cogroup(found.groupBy(share.alias("_cdc_share")))
                    .applyInArrow(plan_share, from_arrow_schema(shape, prefer_timestamp_ntz=True))).persist()
    first = key_columns[0]
    in_source = ~F.col(_COUNTED)
    totals = planned_rows.agg(
        *(F.sum(f"_cdc_n_{n}").alias(n) for n in COUNTS), F.count(F.when(in_source, True)).alias("source_rows"),
        *bound_aggregates(first, in_source)).toArrow()
    bounds = bounds_of(totals, first)
    counted = {k: int(v or 0) for k, v in totals.drop_columns(["_lo", "_hi"]).to_pylist()[0].items()}
    for name in ("inserted", "updated", "deleted", "superseded", "updates", "toast_unknown"):
        setattr(plan, name, counted[name])
    plan.stale += counted["stale"]
    # one time of ingestion for the batch, as the driver's plan has
    now = F.lit(datetime.now(UTC)).cast("timestamp")
    source = planned_rows.where(in_source).select(
        *(now.alias(n) if n == "_cdc_ingested_at" else F.col(ident(n)) for n in plan.source.column_names))
    return plan, SparkHistory(rows=planned_rows, source=source, bounds=bounds, source_rows=counted["source_rows"])
