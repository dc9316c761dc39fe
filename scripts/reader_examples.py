"""How other tools read the tables the engine writes: the examples docs/reading.md quotes.

The page includes the sections between the ``--8<--`` markers, so what a reader copies from the page
is this code, and ``tests/docs/test_reader_examples.py`` runs the examples that need no Spark on a
table it writes. Each function takes a table's path (a directory or an ``s3://`` URI) and returns the
live rows, or the rows the query asks for.

    .venv/bin/python scripts/reader_examples.py demo-work/tables/customers   # print each reader's count
"""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable


# --8<-- [start:deltalake]
def live_rows_deltalake(path: str) -> pa.Table:
    """delta-rs (the `deltalake` package): fine for tables without deletion vectors."""
    table = DeltaTable(path)
    rows = table.to_pyarrow_table()
    return rows.filter(pc.invert(pc.fill_null(rows["_cdc_deleted"], False)))
# --8<-- [end:deltalake]


# --8<-- [start:polars]
def live_rows_polars(path: str) -> pl.DataFrame:
    """polars: reads every table the engine writes, deletion vectors included."""
    return pl.scan_delta(path).filter(~pl.col("_cdc_deleted").fill_null(False)).collect()
# --8<-- [end:polars]


# --8<-- [start:duckdb]
def live_rows_duckdb(path: str, sql: str = "SELECT count(*) AS n FROM t") -> pa.Table:
    """DuckDB over the Arrow data polars reads (so deletion vectors are applied)."""
    t = pl.scan_delta(path).filter(~pl.col("_cdc_deleted").fill_null(False)).collect().to_arrow()  # noqa: F841
    relation = duckdb.sql(sql)  # DuckDB finds the local Arrow table `t` by its name
    assert relation is not None  # a query gives rows (a statement would give None)
    return relation.to_arrow_table()
# --8<-- [end:duckdb]


# --8<-- [start:as-of]
def as_of_version(path: str, version: int) -> pl.DataFrame:
    """A table as it was at one of its versions (`ingest history` lists them)."""
    return pl.scan_delta(path, version=version).filter(~pl.col("_cdc_deleted").fill_null(False)).collect()
# --8<-- [end:as-of]


# --8<-- [start:scd2]
def scd2_as_of(path: str, moment: datetime) -> pl.DataFrame:
    """An scd2 table's rows as they were at a source time: every version valid then."""
    valid_to = pl.col("_cdc_valid_to")
    return (pl.scan_delta(path)
            .filter(pl.col("_cdc_valid_from") <= moment)
            .filter(valid_to.is_null() | (valid_to > moment))
            .filter(pl.col("_cdc_op") != "d")  # a delete that found nothing to end leaves a marker row
            .collect())
# --8<-- [end:scd2]


# --8<-- [start:change-feed]
def changes_deltalake(path: str, from_version: int) -> pa.Table:
    """Delta's change data feed from a version on: inserts, update pre/post images, deletes."""
    return pa.table(DeltaTable(path).load_cdf(starting_version=from_version).read_all())
# --8<-- [end:change-feed]


# --8<-- [start:spark]
def live_rows_spark(spark: Any, path: str) -> Any:
    """Spark with delta-spark: every table, deletion vectors included; also the change feed."""
    rows = spark.read.format("delta").load(path).where("NOT coalesce(_cdc_deleted, false)")
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", 1).load(path))
    return rows, changes
# --8<-- [end:spark]


def main() -> None:
    path = sys.argv[1]
    print("deltalake:", live_rows_deltalake(path).num_rows)
    print("polars:", live_rows_polars(path).height)
    print("duckdb:", live_rows_duckdb(path).to_pylist()[0]["n"])


if __name__ == "__main__":
    main()
