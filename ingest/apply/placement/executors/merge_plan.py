"""The merge plan on Spark's executors: the driver's plan, run on shares of the batch split by key.

:func:`~ingest.rules.plan.plan_merge` classifies each winner against what the table stores for its
key (and, in hard-delete mode, the key's remembered delete), undoes TOAST fills older than the
stored row and shapes the MERGE's source. All of it is per key, given the batch's truncate
positions and TOAST columns. So, as for the reduce (:mod:`ingest.apply.placement.executors.reduction`), the
winners and the stored rows are split by the same hash of the key and each share planned by the
same function in a Python worker (``cogroup(...).applyInArrow``); the stored rows are read by
Spark (:func:`stored_on_executors`), never by the driver.

What comes to the driver is what the audit and the commit need: the counts (one aggregate) and
which TOAST columns get a "keep the stored value" flag in the source. Every share's source has
those flags and the batch's one ``_cdc_ingested_at``, as the driver's would.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ingest.apply.placement.executors.reduction import SparkReduction
from ingest.apply.placement.executors.shares import SIDE, bound_aggregates, bounds_of, share_of
from ingest.columns import normalize
from ingest.commit.remembered import RememberedDeletes
from ingest.lake.delta import table_schema
from ingest.lake.location import LakePath
from ingest.model import ColumnSpec
from ingest.rules.plan import STORED_SCHEMA, UNKNOWN_COLUMNS, PlanCounts, live_rows, merge_source, plan_merge
from ingest.rules.reduce import Reduction
from ingest.spark.reads import frame_of_keys
from ingest.spark.sql import ident

#: The remembered delete's position, beside the stored row's columns in a share's right side.
_TOMB = "_cdc_tomb_position"


@dataclass(slots=True)
class SparkPlan:
    """:class:`~ingest.rules.plan.MergePlan`, its row sets as Spark DataFrames (``rows`` persisted:
    call :meth:`release` when done)."""

    rows: DataFrame
    source: DataFrame
    deletes: DataFrame
    #: the source's first key column's least and greatest value (a table of two rows, for the
    #: MERGE's bounds: :class:`~ingest.commit.merge_sql.FrameSource`)
    bounds: pa.Table
    #: rows in ``source``
    source_rows: int = 0
    #: winners whose key the table stores
    stored_keys: int = 0
    counts: PlanCounts = field(default_factory=PlanCounts)

    def release(self) -> None:
        self.rows.unpersist()


def stored_on_executors(spark: SparkSession, path: LakePath, table: DeltaTable | None, key_columns: tuple[str, ...],
                        keys: DataFrame) -> DataFrame:
    """:func:`~ingest.apply.stored.stored_rows` of the keys in ``keys``, read and matched by Spark."""
    names = {f.name for f in table_schema(table)} if table is not None else set()
    key_types = {f.name: f.dataType.simpleString() for f in keys.schema.fields if f.name in key_columns}
    if table is None or not key_columns or any(k not in names for k in key_columns):
        fields = ", ".join([*(f"{ident(k)} {key_types[k]}" for k in key_columns),
                            "s_pos string, s_part int, s_off bigint, s_deleted boolean, s_unknown array<string>"])
        return spark.createDataFrame([], fields)
    unknown = UNKNOWN_COLUMNS in names
    wanted = [*key_columns, "_cdc_position", "_cdc_partition", "_cdc_offset", "_cdc_deleted",
              *([UNKNOWN_COLUMNS] if unknown else [])]
    distinct = keys.select(*(F.col(ident(k)) for k in key_columns)).distinct()
    found = frame_of_keys(spark, path, table.version(), key_columns, distinct, wanted)
    if not unknown:
        found = found.withColumn(UNKNOWN_COLUMNS, F.lit(None).cast("array<string>"))
    return found.toDF(*key_columns, *(name for name, _ in STORED_SCHEMA))


def remembered_on_executors(spark: SparkSession, remembered: RememberedDeletes, key_columns: tuple[str, ...],
                            key_types: Mapping[str, str], keys: DataFrame) -> DataFrame | None:
    """:meth:`RememberedDeletes.read <ingest.commit.remembered.RememberedDeletes.read>` of the keys in
    ``keys``, read and matched by Spark (``None``: nothing remembered yet)."""
    delta = remembered.open(key_types)
    if delta is None:
        return None
    return frame_of_keys(spark, LakePath.of(remembered.path), delta.version(), key_columns,
                         keys.select(*(F.col(ident(k)) for k in key_columns)).distinct(),
                         [*key_columns, "_cdc_position"])


def plan_on_executors(reduction: SparkReduction, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                      stored: DataFrame, tombstones: DataFrame | None, old_truncate: str | None,
                      new_truncate: str | None, hard: bool, shares: int | None = None) -> SparkPlan:
    """:func:`~ingest.rules.plan.plan_merge` of ``reduction`` against ``stored`` (as
    :func:`stored_on_executors` reads it) and, in hard mode, ``tombstones`` (the key columns and
    ``_cdc_position`` of the remembered deletes), in shares by key hash on the executors."""

    spark = reduction.tagged.sparkSession
    shares = shares or spark.sparkContext.defaultParallelism
    toast = reduction.toast_columns
    left = reduction.tagged
    key_types = {f.name: f.dataType for f in left.schema.fields if f.name in key_columns}
    # The right side: each key's stored row and remembered delete, keys in the winners' types (the
    # hash of a value depends on its type).
    right = stored.select(*(F.col(k).cast(key_types[k]).alias(k) for k in key_columns),
                          *(name for name, _ in STORED_SCHEMA))
    if tombstones is not None:
        tombs = tombstones.select(*(F.col(k).cast(key_types[k]).alias(k) for k in key_columns),
                                  F.col("_cdc_position").alias(_TOMB))
        right = right.join(tombs, on=list(key_columns), how="full_outer")
    else:
        right = right.withColumn(_TOMB, F.lit(None).cast("string"))
    remembered = tombstones is not None  # the share functions must not hold a DataFrame
    empty_left = normalize(left.limit(0).toArrow())
    empty_right = normalize(right.limit(0).toArrow())

    def planned(winners: pa.Table, found: pa.Table) -> pa.Table:
        winners, found = normalize(winners), normalize(found)
        side = winners[SIDE]
        chosen = Reduction(
            winners=winners.filter(pc.equal(side, "winner")).drop_columns([SIDE]), toast_columns=toast,
            truncated=winners.filter(pc.equal(side, "truncated")).drop_columns([SIDE]))
        held = found.filter(pc.is_valid(found["s_pos"])).drop_columns([_TOMB])
        tombs = (found.filter(pc.is_valid(found[_TOMB])).select([*key_columns, _TOMB])
                 .rename_columns([*key_columns, "_cdc_position"]) if remembered else None)
        plan = plan_merge(chosen, key_columns=key_columns, columns=columns, stored=held, tombstones=tombs,
                          old_truncate=old_truncate, new_truncate=new_truncate, hard=hard)
        return plan.rows

    shape = planned(empty_left, empty_right).schema

    def plan_share(winners: pa.Table, found: pa.Table) -> pa.Table:
        return planned(winners, found).cast(shape)

    share = share_of(key_columns, shares)
    rows = (left.groupBy(share.alias("_cdc_share")).cogroup(right.groupBy(share.alias("_cdc_share")))
            .applyInArrow(plan_share, from_arrow_schema(shape, prefer_timestamp_ntz=True))).persist()
    plan, bounds = _counted(rows, toast, hard, key_columns[0])
    flagged = [name for n, name in enumerate(toast) if plan.pop(f"flag_{n}")]
    now = datetime.now(UTC)

    def source_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            live = live_rows(normalize(pa.Table.from_batches([batch])), hard=hard)
            yield from merge_source(live, columns, toast, new_truncate, flagged=flagged, now=now).to_batches()

    source_shape = merge_source(live_rows(shape.empty_table(), hard=hard), columns, toast, new_truncate,
                           flagged=flagged, now=now).schema
    source = rows.mapInArrow(source_of, from_arrow_schema(source_shape, prefer_timestamp_ntz=True))
    deletes = rows.where(F.col("_cdc_action") == F.lit("delete")).select(*key_columns, "_cdc_position",
                                                                         "_cdc_source_ts")
    sizes = {name: plan.pop(name) for name in ("source_rows", "stored_keys")}
    return SparkPlan(rows=rows, source=source, deletes=deletes, bounds=bounds, counts=PlanCounts(**plan), **sizes)


def _counted(rows: DataFrame, toast: list[str], hard: bool, first_key: str) -> tuple[dict[str, int], pa.Table]:
    """The plan's counts as :func:`~ingest.rules.plan.plan_merge` takes them, whether each TOAST
    column's flag is set in some live row (``flag_<n>``), and the live rows' first-key bounds, in
    one aggregate."""
    action = F.col("_cdc_action")
    live = action.isin("insert", "update", "delete", "truncated")
    if hard:
        live = live & ~((F.col("_cdc_op") == F.lit("d")) & ~F.col("_cdc_stored"))

    def count(condition: Column) -> Column:
        return F.count(F.when(condition, True))

    aggregates = [
        count(action == "insert").alias("inserted"), count(action == "update").alias("updated"),
        count(action == "delete").alias("deleted"), count(action == "stale").alias("stale"),
        count(live & F.col(UNKNOWN_COLUMNS).isNotNull()).alias("toast_unknown"),
        count((action == "delete") & F.col("_cdc_stored") if hard else F.lit(False)).alias("matched_deletes"),
        count(F.lit(False) if hard else live & F.col("_cdc_stored")).alias("matched_updates"),
        count(live).alias("source_rows"), count(F.col("_cdc_stored")).alias("stored_keys"),
        *(count(live & F.col(f"_cdc_flag_{n}")).alias(f"flag_{n}") for n in range(len(toast))),
        *bound_aggregates(first_key, live),
    ]
    found = rows.agg(*aggregates).toArrow()
    bounds = bounds_of(found, first_key)
    counts = found.drop_columns(["_lo", "_hi"]).to_pylist()[0]
    return {k: int(v) for k, v in counts.items()}, bounds
