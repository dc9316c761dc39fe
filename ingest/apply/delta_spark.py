"""The delta-spark apply engine: the planned batch MERGEd by delta-spark, as Spark jobs (DESIGN 3.4, 3.5).

The same steps and predicates as :mod:`ingest.apply.delta_rs`, run by Delta's own MERGE:

1. create the table if needed (deletion vectors on by default), add the batch's new columns
   (``ALTER TABLE ... ADD COLUMNS``) and rewrite it first when a column widens (data unchanged);
2. remember the batch's deletes in the tombstone table (hard mode), before the MERGE;
3. one MERGE -- inserts, updates, deletes and the truncate together -- guarded again by position,
   with the table's app transaction (``cdc:table:<table>``, one version above the last) and
   ``cdc.batch``, ``cdc.state`` and ``cdc.offsets`` in the commit's ``userMetadata``; a batch with
   nothing to change appends nothing under the same markers, so its progress is still recorded.

delta-spark records one app transaction per commit (``spark.databricks.delta.write.txnAppId`` /
``txnVersion``), which is why the offsets travel in the commit's metadata (see
:mod:`ingest.apply.commit`). Two writers that planned the same version: Delta skips the second
commit, and the engine reports it as a conflict. Those settings are per Spark session, so every
thread that commits has its own session (``SparkSession.newSession``: same context and jars).

With deletion vectors a MERGE that deletes or updates rows marks them in a small vector file instead
of rewriting the Parquet file holding them; the audit record gets the MERGE's own metrics.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession

from ingest.apply.commit import (
    CommitOutcome,
    CommitRequest,
    commit_info,
    creates_with_rows,
    remember_deletes,
    state_metadata,
    switches_feed_on,
)
from ingest.apply.delta_rs import initial_rows, table_schema_of
from ingest.apply.history import DROP, history_schema
from ingest.apply.ordering import later_than_stored_sql, replaces_stored_sql
from ingest.apply.plan import TOAST_FLAG
from ingest.apply.tablestate import STATE_KEY, TableState, table_app_id
from ingest.deltaio import CHANGE_DATA_FEED, FRAMEWORK_COLUMNS, arrow_type, key_range, open_table
from ingest.errors import CommitConflictError
from ingest.events import ColumnSpec
from ingest.proof import faults
from ingest.spark import use_s3a

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
#: MERGE metrics (``operationMetrics``) copied into the outcome, deletion-vector ones included.
_METRICS = ("numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
            "numTargetRowsMatchedDeleted", "numTargetRowsNotMatchedBySourceDeleted",
            "numTargetRowsNotMatchedBySourceUpdated", "numTargetRowsCopied", "numTargetFilesAdded",
            "numTargetFilesRemoved", "numTargetDeletionVectorsAdded", "numTargetDeletionVectorsRemoved",
            "numTargetDeletionVectorsUpdated", "numOutputRows")


def ident(name: str) -> str:
    """Quote an identifier for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def string(value: str) -> str:
    """A Spark SQL string literal (Spark escapes with backslashes; two quotes would be two literals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class DeltaSparkEngine:
    """Commits planned batches with delta-spark's MERGE, on the Spark session's executors."""

    spark: SparkSession
    #: tables this engine creates write deletion vectors
    deletion_vectors: bool = True
    #: tables this engine creates record the change data feed
    change_data_feed: bool = True
    name: str = "delta-spark"
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def session(self) -> SparkSession:
        """This thread's session: the commit markers are session settings, and tables commit in parallel."""
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self.spark.newSession()
            # Delta rebuilds a table's snapshot in 50 tasks by default: on a small cluster most of a
            # small MERGE's time (8 s -> 3.5 s per 5-row MERGE on local[2]). One task per core.
            if session.conf.get(_SNAPSHOT_PARTITIONS, None) is None:
                session.conf.set(_SNAPSHOT_PARTITIONS, str(session.sparkContext.defaultParallelism))
        return session

    def commit(self, request: CommitRequest, state: TableState) -> CommitOutcome:
        """Apply ``request`` in one commit.

        Raises:
            CommitConflictError: another writer committed to the table at the same time.
        """
        from delta.exceptions import DeltaConcurrentModificationException

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
                faults.point("before-widen")
                _widen(spark, path, columns, request.schema.describe())
                faults.point("after-widen")
            remember_deletes(request)
            existing = open_table(request.path)
            before = existing.version() if existing is not None else -1
            txn = 1 + ((existing.transaction_version(app) or 0) if existing is not None else 0)
            metadata = json.dumps(commit_info(request, state, outcome))
            faults.point("before-commit")
            with _markers(spark, app, txn, metadata):
                if born:
                    self._write_new(spark, request)
                elif request.history is not None:
                    if request.history.source.num_rows or (request.history.truncate and state.columns):
                        _merge_history(spark, request)
                    else:
                        spark.read.format("delta").load(path).limit(0).write.format("delta").mode("append").save(path)
                elif request.plan.source.num_rows or (request.truncate and state.columns):
                    _merge(spark, request, columns)
                else:
                    # Nothing to change: an empty append records the progress markers.
                    spark.read.format("delta").load(path).limit(0).write.format("delta").mode("append").save(path)
        except DeltaConcurrentModificationException as exc:
            raise CommitConflictError(request.table, f"commit failed, another writer changed the table: {exc}"
                                      ) from exc
        table = open_table(request.path)
        assert table is not None  # written above
        # Delta skips, silently, a write whose app-transaction version is already recorded: find ours.
        ours = [c for c in table.history(max(1, table.version() - before)) if c.get("userMetadata") == metadata]
        if not ours:
            raise CommitConflictError(
                request.table, f"Delta skipped the commit: version {txn} of {app} was "
                "already recorded, so another writer committed a batch at the same time")
        last = ours[0]
        metrics = {k: int(v) for k, v in (last.get("operationMetrics") or {}).items() if k in _METRICS}
        outcome.metrics = metrics
        removed = ("numTargetRowsNotMatchedBySourceDeleted" if request.delete_mode == "hard"
                   and request.history_mode == "scd1" else "numTargetRowsNotMatchedBySourceUpdated")
        outcome.rows_truncated = metrics.get(removed, 0)
        outcome.committed = True
        outcome.delta_version = int(last["version"])
        outcome.merge_ms = int((time.perf_counter() - started) * 1000)
        return outcome

    def _properties(self) -> dict[str, str]:
        """The table properties of the tables this engine creates."""
        out = {}
        if self.deletion_vectors:
            out["delta.enableDeletionVectors"] = "true"
        if self.change_data_feed:
            out[CHANGE_DATA_FEED] = "true"
        return out

    def _write_new(self, spark: SparkSession, request: CommitRequest) -> None:
        """Create the table holding the batch's rows (:func:`~ingest.apply.delta_rs.initial_rows`)."""
        from pyspark.errors import AnalysisException

        frame = _frame(spark, initial_rows(request))
        writer = frame.write.format("delta").mode("error")
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
        from delta.tables import DeltaTable
        from pyspark.sql.pandas.types import from_arrow_schema

        builder = (DeltaTable.createIfNotExists(spark).location(request.path.spark_uri)
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
        from pyspark.sql.pandas.types import from_arrow_type

        have = {c.name for c in stored}
        new = [c for c in columns if c.name not in have]
        if new:
            spec = ", ".join(f"{ident(c.name)} {from_arrow_type(_arrow(c)).simpleString()}" for c in new)
            spark.sql(f"ALTER TABLE delta.{ident(path)} ADD COLUMNS ({spec})")


def _arrow(column: ColumnSpec) -> pa.DataType:
    return arrow_type(column.type)


def _frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` as a DataFrame whose types are the Delta types the columns stand for.

    The schema is explicit: left to itself, pyspark reads a timestamp without time zone as Spark's
    ``timestamp`` (``spark.sql.timestampType``), and a ``timestamp_ntz`` column would change type.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    # pyspark cannot convert a column of no chunks (a truncate-only batch has no rows): give it one
    rows = table if table.num_rows else table.schema.empty_table()
    return spark.createDataFrame(rows, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True))


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
    from pyspark.sql.pandas.types import from_arrow_type

    current = spark.read.format("delta").load(path)
    types = {c.name: from_arrow_type(_arrow(c)) for c in columns}
    widened = current.select([current[ident(name)].cast(types[name]).alias(name) if name in types
                              else current[ident(name)] for name in current.columns])
    (widened.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
     .option("userMetadata", json.dumps({"cdc.schema_change": describe})).save(path))


def _merge(spark: SparkSession, request: CommitRequest, columns: list[ColumnSpec]) -> None:
    from delta.tables import DeltaTable

    source = request.plan.source
    toast = {name[len(TOAST_FLAG):] for name in source.column_names if name.startswith(TOAST_FLAG)}

    def value(col: str) -> str:
        if col in toast:
            return f"CASE WHEN s.{ident(TOAST_FLAG + col)} THEN t.{ident(col)} ELSE s.{ident(col)} END"
        return f"s.{ident(col)}"

    framework = [name for name, _ in FRAMEWORK_COLUMNS]
    user = [c.name for c in columns]
    all_updates: dict[str, str | Column] = {ident(c): value(c) for c in user + framework}
    # A soft delete keeps the stored values, and with them what is known of them.
    framework_updates: dict[str, str | Column] = {ident(c): f"s.{ident(c)}" for c in framework
                                                  if c != "_cdc_unknown_columns"}
    inserts: dict[str, str | Column] = {ident(c): f"s.{ident(c)}" for c in user + framework}
    newer = replaces_stored_sql("s", "t")
    truncate = request.truncate
    on = " AND ".join(f"t.{ident(k)} = s.{ident(k)}" for k in request.key_columns)
    if on and not truncate:
        # Literal key bounds let Delta skip the files outside them (see ingest.apply.delta_rs).
        bounds = key_range(source, request.key_columns[0], "t", ident=ident, string=string)
        on = f"{bounds} AND {on}" if bounds else on
    removed_by_truncate = later_than_stored_sql(string(truncate), "t._cdc_position") if truncate else ""

    frame = _frame(spark, source)
    merger = DeltaTable.forPath(spark, request.path.spark_uri).alias("t").merge(frame.alias("s"), on or "false")
    if request.delete_mode == "hard":
        merger = (merger.whenMatchedDelete(f"s._cdc_deleted AND {newer}")
                  .whenMatchedUpdate(f"NOT s._cdc_deleted AND {newer}", all_updates)
                  .whenNotMatchedInsert("NOT s._cdc_deleted", inserts))
        if truncate:
            merger = merger.whenNotMatchedBySourceDelete(removed_by_truncate)
    else:
        merger = (merger.whenMatchedUpdate(f"s._cdc_op = 'd' AND {newer}", framework_updates)
                  .whenMatchedUpdate(newer, all_updates)
                  .whenNotMatchedInsert(values=inserts))
        if truncate:
            marks: dict[str, str | Column] = {"_cdc_deleted": "true", "_cdc_op": "'t'",
                                              "_cdc_position": string(truncate)}
            merger = merger.whenNotMatchedBySourceUpdate(f"{removed_by_truncate} AND NOT t._cdc_deleted", marks)
    merger.execute()


def _merge_history(spark: SparkSession, request: CommitRequest) -> None:
    """The scd2 MERGE (:mod:`ingest.apply.history`), as :func:`ingest.apply.delta_rs._merge_history` does it."""
    from delta.tables import DeltaTable

    plan = request.history
    assert plan is not None
    schema = history_schema(request.schema.columns)
    sets: dict[str, str | Column] = {ident(f.name): f"s.{ident(f.name)}" for f in schema}
    on = " AND ".join([*(f"t.{ident(k)} = s.{ident(k)}" for k in request.key_columns),
                       "t._cdc_position = s._cdc_position"])
    bounds = key_range(plan.source, request.key_columns[0], "t", ident=ident, string=string) \
        if not plan.truncate else None
    frame = _frame(spark, plan.source)
    merger = (DeltaTable.forPath(spark, request.path.spark_uri).alias("t")
              .merge(frame.alias("s"), f"{bounds} AND {on}" if bounds else on)
              .whenMatchedDelete(f"s.{DROP}")
              .whenMatchedUpdate(f"NOT s.{DROP}", sets)
              .whenNotMatchedInsert(f"NOT s.{DROP}", sets))
    if plan.truncate:
        stamp = "CAST(NULL AS TIMESTAMP)" if plan.truncate_ts is None else (
            f"CAST({string(plan.truncate_ts.astimezone(UTC).isoformat())} AS TIMESTAMP)")
        ended: dict[str, str | Column] = {"_cdc_is_current": "false", "_cdc_deleted": "true", "_cdc_valid_to": stamp,
                                          "_cdc_end_position": string(plan.truncate), "_cdc_end_op": "'t'"}
        merger = merger.whenNotMatchedBySourceUpdate(
            f"t._cdc_is_current AND {later_than_stored_sql(string(plan.truncate), 't._cdc_position')}", ended)
    merger.execute()
