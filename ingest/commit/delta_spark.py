"""The delta-spark writer: the planned batch MERGEd by delta-spark, as Spark jobs.

See docs/architecture.md#atomicity and docs/architecture.md#progress-lives-in-the-table.

The same steps and predicates as :mod:`ingest.commit.delta_rs`, run by Delta's own MERGE:

1. create the table if needed (deletion vectors on by default), add the batch's new columns
   (``ALTER TABLE ... ADD COLUMNS``) and rewrite it first when a column widens (data unchanged);
2. remember the batch's deletes in the tombstone table (hard mode), before the MERGE;
3. one MERGE -- inserts, updates, deletes and the truncate together -- guarded again by position,
   with the table's app transaction (``cdc:table:<table>``, one version above the last) and
   ``cdc.batch``, ``cdc.state`` and ``cdc.offsets`` in the commit's ``userMetadata``; a batch with
   nothing to change appends nothing under the same markers, so its progress is still recorded. A
   batch of keys the table does not hold (an initial snapshot, an append-only table) is appended
   under the same markers instead (:func:`~ingest.commit.writer.may_append`), without the MERGE's
   join and its many small Spark jobs.

delta-spark records one app transaction per commit (``spark.databricks.delta.write.txnAppId`` /
``txnVersion``), which is why the offsets travel in the commit's metadata (see
:mod:`ingest.commit.writer`). Two writers that planned the same version: Delta skips the second
commit, and the writer reports it as a conflict. Those settings are per Spark session, so every
thread that commits has its own session (``SparkSession.newSession``: same context and jars).

The MERGE itself, its Spark SQL and which batches list their keys in its condition, is
:mod:`ingest.commit.spark_merge`'s; the audit record gets the MERGE's own metrics (deletion-vector
ones included).

The plan looks up the stored rows of the batch's keys before the MERGE (their positions, soft-delete
flags and unknown columns; scd2: every column of their versions). Where the files the keys' range
reaches hold more than ``driver_lookup_rows`` rows (``target.driver_lookup_rows``, default
:data:`DRIVER_LOOKUP_ROWS`), the executors do it (:meth:`DeltaSparkWriter.lookup`): the driver
receives the rows found, not every row of that range.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

import pyarrow as pa
from delta.exceptions import DeltaConcurrentModificationException
from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from ingest import crashpoints
from ingest.columns import arrow_type
from ingest.commit.delta_rs import initial_rows, table_schema_of
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.spark_merge import merge
from ingest.commit.state import STATE_KEY, TableState, table_app_id
from ingest.commit.writer import (
    ArrowRows,
    CommitOutcome,
    CommitRequest,
    SparkRows,
    commit_info,
    creates_with_rows,
    may_append,
    remember_deletes,
    remembers_deletes,
    state_metadata,
    switches_feed_on,
)
from ingest.config import TargetSpec
from ingest.errors import CommitConflictError
from ingest.lake.delta import CHANGE_DATA_FEED, open_table, rows_in_range
from ingest.lake.location import LakePath
from ingest.lake.lookup import KeyLookup, rows_of_keys
from ingest.model import ColumnSpec
from ingest.rules.history import DROP
from ingest.rules.ordering import later_than_stored_sql
from ingest.spark.reads import spark_rows_of_keys
from ingest.spark.session import arrow_frame, snapshot_tasks, spark_location, spark_type, use_s3a
from ingest.spark.sql import ident, string

#: ``target.driver_lookup_rows``' default: a batch's stored rows are read on the driver when the files
#: its key range reaches hold at most this many rows, and by Spark's executors beyond that
#: (:meth:`DeltaSparkWriter.lookup`): the driver then holds the rows found, not every row of the
#: range. Below it the driver's read costs less than a Spark job (``benchmarks/bench_merge.py
#: --engine delta-spark``, its *driver lookup* baseline).
DRIVER_LOOKUP_ROWS: Final[int] = TargetSpec.model_fields["driver_lookup_rows"].default
_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
#: MERGE metrics (``operationMetrics``) copied into the outcome, deletion-vector ones included.
_METRICS = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
            "numTargetRowsMatchedDeleted", "numTargetRowsNotMatchedBySourceDeleted",
            "numTargetRowsNotMatchedBySourceUpdated", "numTargetRowsCopied", "numTargetFilesAdded",
            "numTargetFilesRemoved", "numTargetDeletionVectorsAdded", "numTargetDeletionVectorsRemoved",
            "numTargetDeletionVectorsUpdated", "numOutputRows")
#: An append's (a ``WRITE``'s) metrics under the names a MERGE gives them, so every batch's audit
#: row reads alike whether the batch was merged or appended.
_APPEND_METRICS = {"numOutputRows": "numTargetRowsInserted", "numFiles": "numTargetFilesAdded"}




@dataclass
class DeltaSparkWriter:
    """Commits planned batches with delta-spark's MERGE, on the Spark session's executors."""

    spark: SparkSession
    #: tables this writer creates write deletion vectors
    deletion_vectors: bool = True
    #: tables this writer creates record the change data feed
    change_data_feed: bool = True
    #: a batch's stored rows are read on the driver while their key range reaches at most this many
    #: rows, else on the executors (:meth:`lookup`)
    driver_lookup_rows: int = DRIVER_LOOKUP_ROWS
    name: str = "delta-spark"
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def settle(self) -> None:
        """Nothing to wait for: delta-spark writes a checkpoint inside the commit that reaches it."""

    def session(self) -> SparkSession:
        """This thread's session: the commit markers are session settings, and tables commit in parallel."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = snapshot_tasks(self.spark.newSession())
        return session

    def lookup(self, path: LakePath) -> KeyLookup:
        """Reads the stored rows of a batch's keys on the driver while the files their key range
        reaches hold at most ``driver_lookup_rows`` rows, else with Spark (see :func:`spark_rows_of_keys`)."""
        def rows(table: DeltaTable, key_columns: tuple[str, ...], keys: pa.Table,
                 columns: list[str] | None = None) -> pa.Table:
            if rows_in_range(table, keys, key_columns[0]) <= self.driver_lookup_rows:
                return rows_of_keys(table, key_columns, keys, columns)
            return spark_rows_of_keys(self.session(), path, table, key_columns, keys, columns)
        return rows

    def commit(self, request: CommitRequest, state: TableState) -> CommitOutcome:
        """Apply ``request`` in one commit.

        Raises:
            CommitConflictError: another writer committed to the table at the same time.
        """

        started = time.perf_counter()
        outcome = CommitOutcome()
        spark = self.session()
        if not request.path.is_local:
            use_s3a(spark, request.path)
        path = request.path.spark_uri
        columns = request.schema.columns
        app = table_app_id(request.table)
        born = creates_with_rows(request, state)
        try:
            if state.table is None and not born:
                self._create(spark, request)
            elif state.table is not None:
                if switches_feed_on(state, self.change_data_feed):
                    feed = f"{string(CHANGE_DATA_FEED)} = 'true'"
                    spark.sql(f"ALTER TABLE delta.{ident(path)} SET TBLPROPERTIES ({feed})")
                self._add_columns(spark, path, columns, state.columns or [])
            if request.schema.widened and state.table is not None:
                crashpoints.point("before-widen")
                _widen(spark, path, columns, request.schema.describe())
                crashpoints.point("after-widen")
            _remember(spark, request)
            existing = open_table(request.path)
            before = existing.version() if existing is not None else -1
            txn = 1 + ((existing.transaction_version(app) or 0) if existing is not None else 0)
            metadata = json.dumps(commit_info(request, state, outcome))
            crashpoints.point("before-commit")
            with _markers(spark, app, txn, metadata):
                if born:
                    self._write_new(_writer(spark, request, app, txn, metadata), request)
                elif request.source.count and may_append(request, state, lambda: before):
                    # Only new keys: the rows the MERGE would insert, without its join.
                    _writer(spark, request, app, txn, metadata).mode("append").save(path)
                elif request.source.count or (request.truncate and state.columns):
                    merge(spark, request, existing)
                else:
                    # Nothing to change: an empty append records the progress markers.
                    spark.read.format("delta").load(path).limit(0).write.format("delta").mode("append").save(path)
        except DeltaConcurrentModificationException as exc:
            raise CommitConflictError(request.table, f"commit failed, another writer changed the table: {exc}"
                                      ) from exc
        # The table as opened before the commit, brought up to date (a new table: opened now).
        table = existing if existing is not None else open_table(request.path)
        assert table is not None  # written above
        if existing is not None:
            table.update_incremental()
        # Delta skips, silently, a write whose app-transaction version is already recorded: find ours.
        ours = [c for c in table.history(max(1, table.version() - before)) if c.get("userMetadata") == metadata]
        if not ours:
            raise CommitConflictError(
                request.table, f"Delta skipped the commit: version {txn} of {app} was "
                "already recorded, so another writer committed a batch at the same time")
        last = ours[0]
        reported = (last.get("operationMetrics") or {}).items()
        if last.get("operation") == "WRITE":  # an append: its metrics under the MERGE's names
            metrics = {_APPEND_METRICS[k]: int(v) for k, v in reported if k in _APPEND_METRICS}
        else:
            metrics = {k: int(v) for k, v in reported if k in _METRICS}
        outcome.metrics = metrics
        removed = ("numTargetRowsNotMatchedBySourceDeleted" if request.delete_mode == "hard"
                   and not request.history else "numTargetRowsNotMatchedBySourceUpdated")
        outcome.rows_truncated = metrics.get(removed, 0)
        outcome.committed = True
        outcome.delta_version = int(last["version"])
        outcome.merge_ms = int((time.perf_counter() - started) * 1000)
        return outcome

    def _properties(self) -> dict[str, str]:
        """The table properties of the tables this writer creates."""
        out = {}
        if self.deletion_vectors:
            out["delta.enableDeletionVectors"] = "true"
        if self.change_data_feed:
            out[CHANGE_DATA_FEED] = "true"
        return out

    def _write_new(self, writer: DataFrameWriter, request: CommitRequest) -> None:
        """Create the table holding the batch's rows (:func:`~ingest.commit.delta_rs.initial_rows`)."""

        writer = writer.mode("error")
        for key, value in self._properties().items():
            writer = writer.option(key, value)
        try:
            writer.save(request.path.spark_uri)
        except AnalysisException as exc:
            if "exist" not in str(exc).lower():
                raise
            raise CommitConflictError(request.table, f"creating the table failed, another writer was first: {exc}"
                                      ) from exc

    def _create(self, spark: SparkSession, request: CommitRequest) -> None:

        builder = (SparkDeltaTable.createIfNotExists(spark).location(request.path.spark_uri)
                   .addColumns(from_arrow_schema(table_schema_of(request.schema.columns, request.history_mode)))
                   .comment(f"CDC target table {request.table} (primary key {', '.join(request.key_columns)})"))
        for key, value in self._properties().items():
            builder = builder.property(key, value)
        state = {STATE_KEY: state_metadata(request.key_columns, None, request.flattened)}
        with _markers(spark, None, None, json.dumps(state)):
            builder.execute()

    @staticmethod
    def _add_columns(spark: SparkSession, path: str, columns: list[ColumnSpec], stored: list[ColumnSpec]) -> None:
        """New source columns become table columns before the MERGE writes them (a metadata commit)."""

        have = {c.name for c in stored}
        new = [c for c in columns if c.name not in have]
        if new:
            spec = ", ".join(f"{ident(c.name)} {from_arrow_type(_arrow(c)).simpleString()}" for c in new)
            spark.sql(f"ALTER TABLE delta.{ident(path)} ADD COLUMNS ({spec})")


def _arrow(column: ColumnSpec) -> pa.DataType:
    return arrow_type(column.type)


@contextmanager
def _markers(spark: SparkSession, app: str | None, version: int | None, metadata: str) -> Iterator[None]:
    """The commit's app transaction and ``userMetadata``, set for the statements run inside."""
    settings = {_USER_METADATA: metadata}
    if app is not None:
        settings |= {_TXN_APP: app, _TXN_VERSION: str(version)}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in settings:
            spark.conf.unset(key)


def _widen(spark: SparkSession, path: str, columns: list[ColumnSpec], describe: str) -> None:
    """Rewrite the table with widened column types (data unchanged) before the batch's commit."""

    current = spark.read.format("delta").load(path)
    types = {c.name: from_arrow_type(_arrow(c)) for c in columns}
    widened = current.select([current[ident(name)].cast(types[name]).alias(name) if name in types
                              else current[ident(name)] for name in current.columns])
    (widened.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("userMetadata", json.dumps({"cdc.schema_change": describe})).save(path))


def _initial(spark: SparkSession, request: CommitRequest) -> DataFrame:
    """The rows a new table starts with, or a batch of new keys appends
    (:func:`~ingest.commit.delta_rs.initial_rows`), as a DataFrame: from the driver's plan, or
    shaped on the executors from a plan that is there."""
    if isinstance(request.source, ArrowRows):
        return arrow_frame(spark, initial_rows(request))

    source = request.source.frame
    if request.history:
        source = source.where(~F.col(DROP))
    elif request.delete_mode == "hard":
        source = source.where(~F.col("_cdc_deleted"))
    schema = table_schema_of(request.schema.columns, request.history_mode)
    shaped = source.select(*(F.col(ident(f.name)).cast(from_arrow_type(f.type, prefer_timestamp_ntz=True)).alias(f.name)
                             for f in schema))
    return shaped.sortWithinPartitions(*request.key_columns) if request.key_columns else shaped


def _writer(spark: SparkSession, request: CommitRequest, app: str, txn: int, metadata: str) -> DataFrameWriter:
    """A Delta writer of :func:`_initial`'s rows. A plan on the executors has its rows in the
    session they were read in, whose settings the write follows: the commit's markers then go as
    the writer's options (those of the writer's session would not reach it)."""
    writer = _initial(spark, request).write.format("delta")
    if isinstance(request.source, SparkRows):
        writer = writer.option("userMetadata", metadata).option("txnAppId", app).option("txnVersion", str(txn))
    return writer


def _remember(spark: SparkSession, request: CommitRequest) -> None:
    """:func:`~ingest.commit.writer.remember_deletes`; of a plan on the executors, written by delta-spark."""
    if not isinstance(request.deletes, SparkRows):
        remember_deletes(request)
        return
    if not remembers_deletes(request):
        return
    if request.deletes.count:  # a batch without deletes would pay a MERGE of nothing (seconds)
        key_types = {c.name: c.type for c in request.schema.columns if c.name in request.key_columns}
        remember_on_executors(spark, request.tombstones, request.key_columns, key_types, request.deletes.frame)
    crashpoints.point("after-tombstones")


def remember_on_executors(spark: SparkSession, remembered: RememberedDeletes, key_columns: tuple[str, ...],
                          key_types: Mapping[str, str], deletes: DataFrame) -> None:
    """:meth:`RememberedDeletes.record <ingest.commit.remembered.RememberedDeletes.record>` of
    ``deletes`` (the key columns, ``_cdc_position`` and ``_cdc_source_ts`` of each delete) by
    delta-spark: the same columns, the same position guard."""

    now = datetime.now(UTC)
    source = deletes.select(
        *(F.col(ident(k)).cast(spark_type(key_types[k])).alias(k) for k in key_columns),
        F.col("_cdc_position"), F.col("_cdc_source_ts").cast("timestamp").alias("_cdc_deleted_at"),
        F.lit(now).cast("timestamp").alias("_cdc_recorded_at"))
    location = spark_location(spark, LakePath.of(remembered.path))
    remembered.settle()  # the packing behind the last record, before this one writes
    if remembered.open(key_types) is None:
        source.write.format("delta").mode("append").save(location)
        return
    on = " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in key_columns)
    (SparkDeltaTable.forPath(spark, location).alias("t").merge(source.alias("s"), on)
     .whenMatchedUpdateAll(later_than_stored_sql("s._cdc_position", "t._cdc_position"))
     .whenNotMatchedInsertAll()
     .execute())
    remembered.pack()
