"""Reduce on Spark's executors: the driver's reduce, run on shares of the batch split by key.

:func:`~ingest.rules.reduce.reduce_changes` keeps each key's latest change. Every rule it applies
is a rule about one key's changes (their order, their lives between deletes, the TOAST fills from
earlier images of the same life) plus the batch's latest truncate. So the batch can be split by
a hash of the key into shares -- every change of a key lands in the same share -- and each share
reduced by the same function in a Python worker (``groupBy(...).applyInArrow``), with:

* the batch's truncates added to every share: each share then finds the same latest truncate,
  and drops (or, in soft mode, keeps as truncated) its own keys' changes before it;
* the batch's list of TOAST columns passed to every share, so every share's winners have the same
  ``_cdc_fill_<n>`` columns whether or not it holds a placeholder itself;
* the counts the driver's reduce gives made whole again: the superseded truncates are counted
  once, not once per share.

``ignore_null_updates`` (:func:`~ingest.rules.reduce.nulls_as_unchanged`) is a rule about one
change, applied to every change before the reduce (the journey asks the placement for it): the
batch's list of TOAST columns then also names every column an update of the batch leaves null.

A change's rank in the batch order (``_cdc_ord``) is then its rank in its share: the order of
any two changes of one key, and of a change and a truncate, is the same, and nothing after the
reduce reads the rank itself.

Nothing of the batch's rows comes to the driver but its truncates and the names of its TOAST
columns (both small). ``benchmarks/bench_reduce_where.py`` measures what this costs against the
driver's reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ingest.apply.placement.executors.shares import SIDE, share_of
from ingest.columns import normalize
from ingest.model import ColumnSpec
from ingest.rules.reduce import Reduction, TruncateMark, reduce_changes
from ingest.spark.sql import ident


@dataclass(slots=True)
class SparkReduction:
    """:class:`~ingest.rules.reduce.Reduction`, its row sets as Spark DataFrames (persisted: call
    :meth:`release` when done)."""

    winners: DataFrame
    truncated: DataFrame | None
    toast_columns: list[str]
    truncate: TruncateMark | None
    truncates: int
    superseded: int
    #: the frame both row sets read: winners and truncated rows, told apart by :data:`SIDE`
    tagged: DataFrame
    #: the persisted frame ``tagged`` reads (itself, until :meth:`drop_winners`)
    cached: DataFrame | None = None
    #: the batch's truncates (every one, as collected for the shares)
    marks: pa.Table | None = None

    def __post_init__(self) -> None:
        if self.cached is None:
            self.cached = self.tagged

    def drop_winners(self, keys: DataFrame, key_columns: tuple[str, ...]) -> None:
        """Take the winners of ``keys`` (the key columns, distinct) out of the reduction."""
        mark = "_cdc_dropped"
        kept = (self.tagged.join(F.broadcast(keys.withColumn(mark, F.lit(True))), list(key_columns), "left")
                .where(F.col(mark).isNull() | (F.col(SIDE) != F.lit("winner")))
                .select(*(F.col(ident(c)) for c in self.tagged.columns)))
        self.tagged = kept
        self.winners = kept.where(F.col(SIDE) == F.lit("winner")).drop(SIDE)
        if self.truncated is not None:
            self.truncated = kept.where(F.col(SIDE) == F.lit("truncated")).drop(SIDE)

    def winners_count(self) -> int:
        return self.winners.count()

    def release(self) -> None:
        if self.cached is not None:
            self.cached.unpersist()


def reduce_on_executors(changes: DataFrame, key_columns: tuple[str, ...], columns: list[ColumnSpec], *,
                        soft: bool = False, shares: int | None = None) -> SparkReduction:
    """:func:`~ingest.rules.reduce.reduce_changes` of ``changes`` (the columns of
    :attr:`~ingest.apply.batch.MicroBatch.changes`), in ``shares`` shares by key hash (default:
    one per core of the session's context), on the executors (see module docstring)."""

    spark = changes.sparkSession
    shares = shares or spark.sparkContext.defaultParallelism
    is_truncate = F.col("_cdc_op") == F.lit("t")
    marks = normalize(changes.where(is_truncate).toArrow())
    placeholders = F.coalesce("_cdc_toast", F.array().cast("array<string>"))
    summary = changes.agg(
        F.count(F.when(~is_truncate, True)).alias("changed"),
        F.array_distinct(F.flatten(F.collect_list(placeholders))).alias("toast")).first()
    assert summary is not None
    changed, present = int(summary["changed"]), set(summary["toast"] or [])
    fills = [c.name for c in columns if c.name in present]
    # The shape every share returns: the driver's reduce of no rows, with the batch's fills.
    empty = normalize(changes.limit(0).toArrow())
    shape = _tagged(reduce_changes(empty, key_columns, columns, soft=soft, fills=fills), soft)
    truncate = _latest(marks)

    def reduce_share(rows: pa.Table) -> pa.Table:
        rows = normalize(rows)
        if marks.num_rows:
            rows = pa.concat_tables([rows, marks.cast(rows.schema)])
        return _tagged(reduce_changes(rows, key_columns, columns, soft=soft, fills=fills), soft).cast(shape.schema)

    share = share_of(key_columns, shares)
    reduced = (changes.where(~is_truncate).groupBy(share.alias("_cdc_share"))
               .applyInArrow(reduce_share, from_arrow_schema(shape.schema, prefer_timestamp_ntz=True)))
    reduced = reduced.persist()
    winners_count = reduced.where(F.col(SIDE) == F.lit("winner")).count()
    winners = reduced.where(F.col(SIDE) == F.lit("winner")).drop(SIDE)
    truncated = reduced.where(F.col(SIDE) == F.lit("truncated")).drop(SIDE) if soft and truncate else None
    superseded = (marks.num_rows - 1 if marks.num_rows else 0) + changed - winners_count
    return SparkReduction(winners=winners, truncated=truncated, toast_columns=fills, truncate=truncate,
                          truncates=marks.num_rows, superseded=superseded, tagged=reduced, marks=marks)


def _tagged(reduction: Reduction, soft: bool) -> pa.Table:
    """A reduction's winners and (soft mode) truncated rows in one table, told apart by :data:`SIDE`."""
    winners = reduction.winners
    parts = [winners.append_column(SIDE, pa.array(["winner"] * winners.num_rows, pa.string()))]
    if soft and reduction.truncated is not None:
        truncated = reduction.truncated.select(winners.column_names).cast(winners.schema)
        parts.append(truncated.append_column(SIDE, pa.array(["truncated"] * truncated.num_rows, pa.string())))
    return pa.concat_tables(parts)


def _latest(marks: pa.Table) -> TruncateMark | None:
    """The batch's latest truncate, as :func:`~ingest.rules.reduce.reduce_changes` picks it."""
    if not marks.num_rows:
        return None
    order = pc.sort_indices(marks, sort_keys=[("_cdc_position", "descending"), ("_cdc_partition", "ascending"),
                                              ("_cdc_offset", "ascending")])
    top = marks.take(order.slice(0, 1)).to_pylist()[0]
    return TruncateMark(top["_cdc_position"], top["_cdc_partition"], top["_cdc_offset"])

