"""A Delta table's rows by key, read by Spark: the one read behind every look-up on the executors.

The stored rows and remembered deletes of a batch's keys (the executors placement), and the
delta-spark writer's look-up of a large table's rows for a plan made on the driver.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import broadcast

from ingest.columns import normalize
from ingest.lake.delta import key_range, table_schema
from ingest.lake.location import LakePath
from ingest.spark.session import arrow_frame, spark_location
from ingest.spark.sql import ident, string


def spark_rows_of_keys(spark: SparkSession, path: LakePath, table: DeltaTable, key_columns: tuple[str, ...],
                       keys: pa.Table, columns: list[str] | None = None) -> pa.Table:
    """:func:`~ingest.apply.stored.rows_of_keys` as a Spark job: the same rows, in the same types.

    The executors read the version of the table ``table`` is at (deletion vectors applied), bounded
    by the keys' range like the driver's read, and keep the rows whose key is among ``keys``' (a
    semi-join with the keys broadcast). The driver receives only the rows found -- for a current-row
    table at most one per key -- where its own read would hold every row of the range in memory.
    """

    schema = normalize(table_schema(table).empty_table()).schema
    names = columns or schema.names
    wanted = broadcast(arrow_frame(spark, keys.select(list(key_columns))))
    found = frame_of_keys(spark, path, table.version(), key_columns, wanted, names,
                          where=key_range(keys, key_columns[0], ident=ident, string=string))
    return normalize(found.toArrow()).cast(pa.schema([schema.field(n) for n in names]))


def frame_of_keys(spark: SparkSession, path: LakePath, version: int, key_columns: tuple[str, ...], keys: DataFrame,
                  columns: list[str], *, where: str | None = None) -> DataFrame:
    """``columns`` of the rows of the table at ``path`` (at ``version``, deletion vectors applied)
    whose key is among ``keys``' -- a semi-join, narrowed first by ``where`` -- as a DataFrame: the
    one Spark read behind every look-up of stored rows and remembered deletes by key."""
    frame = spark.read.format("delta").option("versionAsOf", version).load(spark_location(spark, path))
    if where is not None:
        frame = frame.where(where)
    return frame.select(*(ident(n) for n in columns)).join(
        keys.select(*(ident(k) for k in key_columns)), on=list(key_columns), how="left_semi")
