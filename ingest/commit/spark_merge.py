"""The batch's MERGE as delta-spark runs it: :mod:`ingest.commit.merge_sql`'s statement in Spark
SQL, run with delta-spark's merge builder (:func:`merge`).

With deletion vectors a MERGE that deletes or updates rows marks them in a small vector file instead
of rewriting the Parquet file holding them. Such a MERGE still joins the batch with the rows of every
file it touches to write the changed rows, and a batch of keys spread over the table touches every
file: so a batch of up to :data:`KEY_LIST_LIMIT` keys into a table much larger than it
(:func:`dialect_for`) also lists them in the MERGE's condition (``t.key IN (...)``, implied by the
key equality), and Spark drops the other rows before that join instead of shuffling them all to it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession

from ingest.commit.merge_sql import Clause, Dialect, FrameSource, MergeStatement
from ingest.commit.writer import ArrowRows, CommitRequest, Rows, merge_statement
from ingest.lake.delta import rows_in_range
from ingest.spark.session import arrow_frame
from ingest.spark.sql import ident, string


def merge(spark: SparkSession, request: CommitRequest, table: DeltaTable | None) -> None:
    """The batch's MERGE (:mod:`ingest.commit.merge_sql`), the statement delta-rs runs too: current rows
    by key, or scd2 versions by key and position. ``table``: the target as the plan opened it, whose
    size decides whether the batch's keys are listed (:func:`dialect_for`)."""
    dialect = dialect_for(table, request.source, request.key_columns)
    source = request.source
    shape = source.table if isinstance(source, ArrowRows) else FrameSource(source.columns, source.bounds)
    statement = merge_statement(request, shape, dialect)
    run_merge(spark, request, source.table if isinstance(source, ArrowRows) else source.frame, statement)


def dialect_for(table: DeltaTable | None, rows: Rows, key_columns: tuple[str, ...]) -> Dialect:
    """:data:`DIALECT`, listing the batch's keys in the MERGE's condition only where that pays: the
    files their range reaches hold at least :data:`ROWS_PER_LISTED_KEY` rows per key (the rows the
    list keeps out of the join). How many keys a list may hold, :func:`~ingest.commit.merge_sql.key_list`
    decides with the dialect's ``key_list_limit``. Rows on the executors list nothing: the driver
    does not hold their keys."""
    unlisted = replace(DIALECT, key_list_limit=0)
    if not isinstance(rows, ArrowRows):
        return unlisted
    source = rows.table
    if table is None or not key_columns or key_columns[0] not in source.column_names:
        return unlisted
    keys = pc.count_distinct(source[key_columns[0]]).as_py()
    if keys == 0:
        return unlisted
    return DIALECT if rows_in_range(table, source, key_columns[0]) >= ROWS_PER_LISTED_KEY * keys else unlisted


def _timestamp(value: datetime | None) -> str:
    if value is None:
        return "CAST(NULL AS TIMESTAMP)"
    return f"CAST({string(value.astimezone(UTC).isoformat())} AS TIMESTAMP)"


#: A batch of at most this many keys lists them in the MERGE's condition (``merge_sql._on``): its
#: rewrite join then takes only the batch's rows of the touched files, not all of them.
KEY_LIST_LIMIT: Final = 20_000
#: A batch lists its keys only when the files its key range reaches hold at least this many rows per
#: key: the list costs Spark its analysis, which the rows kept out of the join repay only in a large
#: table (``benchmarks/bench_key_list.py`` at 200k and 2M rows, ``bench_merge.py --engine delta-spark``).
ROWS_PER_LISTED_KEY: Final = 100


def _integer(value: int, kind: pa.DataType) -> str:
    """An integer literal of Spark's type for ``kind`` (``7L`` a BIGINT), so a list of them needs no
    cast per value against a column of that type: at most slightly faster than an untyped list
    (``benchmarks/bench_key_list.py``, its figures in docs/benchmarks.md)."""
    if pa.types.is_unsigned_integer(kind):  # Spark has no unsigned types: let it type the value
        return str(value)
    suffix = {8: "Y", 16: "S", 32: ""}.get(kind.bit_width, "L")
    return f"{value}{suffix}"


#: Spark SQL, as delta-spark's MERGE reads it.
DIALECT: Final = Dialect(ident=ident, string=string, timestamp=_timestamp, key_list_limit=KEY_LIST_LIMIT,
                         integer=_integer)


def run_merge(spark: SparkSession, request: CommitRequest, source: pa.Table | DataFrame,
              statement: MergeStatement) -> None:
    """Run ``statement`` with delta-spark's merge builder, ``source`` as a DataFrame."""

    def sets(clause: Clause) -> dict[str, str | Column]:
        assert clause.sets is not None
        return dict(clause.sets)

    merger = SparkDeltaTable.forPath(spark, request.path.spark_uri).alias("t").merge(
        (source if isinstance(source, DataFrame) else arrow_frame(spark, source)).alias("s"), statement.on)
    for clause in statement.clauses:
        if clause.kind == "matched_delete":
            merger = merger.whenMatchedDelete(clause.condition)
        elif clause.kind == "matched_update":
            merger = merger.whenMatchedUpdate(clause.condition, sets(clause))
        elif clause.kind == "not_matched_insert":
            merger = (merger.whenNotMatchedInsert(values=sets(clause)) if clause.condition is None
                      else merger.whenNotMatchedInsert(clause.condition, sets(clause)))
        elif clause.kind == "not_matched_by_source_delete":
            merger = merger.whenNotMatchedBySourceDelete(clause.condition)
        else:
            merger = merger.whenNotMatchedBySourceUpdate(clause.condition, sets(clause))
    merger.execute()
