"""``ingest retype <table> <column> <type>``: follow a source's incompatible column change.

A column whose source type changes in a way that is not a widening (``integer`` to ``text``, say)
stops its table: nothing later can be applied until the table's column has a type the new values
fit. This rewrites the table once with the column cast to the new type, under the table's writer
lock, and leaves everything else as it was: rows, framework columns, table properties, and the
offsets the table's Delta log records (the engine reads them from its own commits, which the
rewrite does not replace), so the next run applies the change that stopped it and goes on.

A value that does not convert (``'abc'`` to ``long``) refuses the whole rewrite, naming the
column; nothing is written. A table with deletion vectors (delta-spark's) is rewritten with Spark,
any other with delta-rs. The rewrite is one Delta commit: time travel shows the table before it, and
the change data feed shows it as a rewrite of every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake

from ingest.columns import arrow_type
from ingest.config import IngestConfig
from ingest.errors import ConfigError, TableError
from ingest.lake import locks
from ingest.lake.delta import has_deletion_vectors, open_table, read_all
from ingest.lake.location import LakePath

#: The commit's ``userMetadata``-like marker: who rewrote the table and why.
RETYPE_KEY = "cdc.retype"


@dataclass(frozen=True, slots=True)
class Retyped:
    """What :func:`retype` did."""

    table: str
    column: str
    was: str
    now: str
    rows: int
    version: int
    rewritten_by: str


def retype(config: IngestConfig, table: str, column: str, new_type: str) -> Retyped:
    """Rewrite ``table`` with ``column`` cast to the Delta type ``new_type`` (see the module docstring).

    Raises:
        ConfigError: an unknown table, column or type, or a framework column.
        TableError: the table does not exist yet, a value does not convert, or a run holds the table.
    """
    config.table(table)  # an unknown table is a ConfigError
    try:
        target = arrow_type(new_type)
    except KeyError:
        raise ConfigError(f"unknown type {new_type!r}: use a Delta type name (string, long, double, "
                          "decimal(p,s), timestamp, date, boolean, binary, ...)") from None
    if column.startswith("_cdc_"):
        raise ConfigError(f"{column} is the engine's own column; it keeps its type")
    where = LakePath.of(config.table_path(table))
    held = locks.acquire_all(config.tables_root, [table], lease_seconds=config.target.storage.lease_seconds)
    try:
        delta = open_table(where)
        if delta is None:
            raise TableError(table, "has no Delta table yet; nothing to retype")
        fields = {f.name: f for f in pa.schema(delta.schema().to_arrow())}
        if column not in fields:
            raise ConfigError(f"table {table!r} has no column {column!r} (it has {', '.join(sorted(fields))})")
        was = str(fields[column].type)
        if has_deletion_vectors(delta):
            rows = _with_spark(config, where, table, column, new_type)
            by = "delta-spark"
        else:
            rows = _with_delta_rs(delta, where, table, column, target)
            by = "delta-rs"
        version = open_table(where).version()  # type: ignore[union-attr]
    finally:
        locks.release_all(held)
    return Retyped(table, column, was, new_type, rows, version, by)


def _with_delta_rs(delta: DeltaTable, where: LakePath, table: str, column: str, target: pa.DataType) -> int:
    data = read_all(delta)
    index = data.schema.get_field_index(column)
    try:
        cast = pc.cast(data[column], target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise TableError(table, f"column {column!r} does not convert to {target}: {exc}; nothing was "
                                "written") from None
    data = data.set_column(index, pa.field(column, target, nullable=data.schema.field(index).nullable), cast)
    write_deltalake(where.uri, data, mode="overwrite", schema_mode="overwrite",
                    storage_options=where.storage_options,
                    commit_properties=CommitProperties(custom_metadata={RETYPE_KEY: f"{column} -> {target}"}))
    return data.num_rows


def _with_spark(config: IngestConfig, where: LakePath, table: str, column: str, new_type: str) -> int:
    # Spark (seconds to start): only for a table with deletion vectors, which delta-rs cannot read
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    from ingest.spark.session import delta_session, spark_location, spark_type

    spark = delta_session(config.spark, s3=not where.is_local)
    uri = spark_location(spark, where)
    frame = spark.read.format("delta").load(uri)
    try:  # Spark refuses a cast between types, and (ANSI) a value that does not convert, before writing
        retyped = frame.withColumn(column, F.col(column).cast(spark_type(new_type)))
        (retyped.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
         .option("userMetadata", f"{RETYPE_KEY}: {column} -> {new_type}").save(uri))
    except PySparkException as exc:  # a cast Spark refuses: the plan's (analysis) or a value's (ANSI)
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise TableError(table, f"column {column!r} does not convert to {new_type}: {first}; nothing was "
                                "written") from None
    return int(spark.read.format("delta").load(uri).count())
