"""The delta-rs writer: one planned batch, one Delta commit, on the driver.

See docs/architecture.md#atomicity and docs/architecture.md#progress-lives-in-the-table.

1. create the table if needed, and rewrite it first when a column widens (data unchanged);
2. remember the batch's deletes in the tombstone table (hard mode) -- a separate commit, made before
   the MERGE so that a crash between the two is repaired by the replay (see :mod:`ingest.rules.plan`);
3. one MERGE -- inserts, updates, deletes and the truncate together -- guarded again by position in
   its predicates, with one Delta app transaction per topic-partition (the batch's offsets) and the
   table state and audit record in the commit info; a batch with nothing to change still commits
   its progress markers. A batch of keys the table does not hold is appended instead, under the same
   markers (:func:`~ingest.commit.writer.may_append`): the MERGE would only insert them, and an
   append costs neither its join nor its many threads on a busy driver.

delta-rs writes copy-on-write files (it cannot write deletion vectors): a MERGE rewrites every file
that holds a touched key. It refuses a table with deletion vectors (see :data:`DELETION_VECTORS_REFUSED`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.schema import Schema

from ingest import crashpoints
from ingest.columns import FRAMEWORK_COLUMNS, arrow_type, laid_out
from ingest.commit.merge_sql import Dialect, MergeStatement
from ingest.commit.state import STATE_KEY, TableState, app_id
from ingest.commit.writer import (
    ArrowRows,
    CommitOutcome,
    CommitRequest,
    as_json,
    commit_info,
    creates_with_rows,
    may_append,
    merge_statement,
    remember_deletes,
    state_metadata,
    switches_feed_on,
)
from ingest.errors import CommitConflictError, TableError
from ingest.lake.checkpoints import AFTER_COMMIT, Checkpoints
from ingest.lake.delta import (
    CHANGE_DATA_FEED,
    log_version,
    quote,
    read_all,
    sql_string,
    table_schema,
    utc_literal,
    write_table,
)
from ingest.lake.location import LakePath
from ingest.lake.lookup import KeyLookup, rows_of_keys
from ingest.model import ColumnSpec
from ingest.rules.history import DROP, history_schema

#: Why delta-rs stops at a table delta-spark wrote with deletion vectors, and the ways out.
DELETION_VECTORS_REFUSED = (
    "the table has deletion vectors (written by the delta-spark writer), which delta-rs can neither write nor "
    "read; keep it on delta-spark (writer: delta-spark for this table), or remove them with Spark SQL first: "
    "ALTER TABLE delta.`<path>` SET TBLPROPERTIES ('delta.enableDeletionVectors' = false), "
    "REORG TABLE delta.`<path>` APPLY (PURGE), ALTER TABLE delta.`<path>` DROP FEATURE deletionVectors "
    "(README: choosing a writer)")


@dataclass(slots=True)
class DeltaRsWriter:
    """Commits planned batches with delta-rs, on the driver (DataFusion, multi-threaded)."""

    #: bytes of the Parquet files a new table's writes aim at (its ``delta.targetFileSize``)
    target_file_size: int = 64 * 1024 * 1024
    #: tables this writer creates record the change data feed
    change_data_feed: bool = True
    name: str = "delta-rs"
    #: the data tables' checkpoints, written after their commits return (:mod:`ingest.lake.checkpoints`)
    checkpoints: Checkpoints = field(default_factory=Checkpoints)

    def _properties(self) -> dict[str, str]:
        """The table properties of the tables this writer creates."""
        out = {"delta.targetFileSize": str(self.target_file_size)}
        if self.change_data_feed:
            out[CHANGE_DATA_FEED] = "true"
        return out

    def settle(self) -> None:
        """Return once the checkpoints of the commits so far are written."""
        self.checkpoints.wait()

    def lookup(self, path: LakePath) -> KeyLookup:
        """:func:`~ingest.apply.stored.rows_of_keys`: the stored rows are read here, on the driver."""
        return rows_of_keys

    def commit(self, request: CommitRequest, state: TableState) -> CommitOutcome:
        """Apply ``request`` in one commit.

        Raises:
            CommitConflictError: another writer committed to the table at the same time.
            TableError: a key column cannot hold the batch's values.
        """
        started = time.perf_counter()
        outcome = CommitOutcome()
        if not isinstance(request.source, ArrowRows):
            raise TableError(request.table, "delta-rs writes a plan made on the driver; this one is on Spark's "
                                            "executors (plan_on: executors needs writer: delta-spark)")
        if state.deletion_vectors:
            raise TableError(request.table, DELETION_VECTORS_REFUSED)
        columns = request.schema.columns
        born = creates_with_rows(request, state)
        table = state.table if state.table is not None or born else _create(request, self._properties())
        if table is not None and not born and switches_feed_on(state, self.change_data_feed):
            table.alter.set_table_properties({CHANGE_DATA_FEED: "true"})
        if request.schema.widened:
            assert table is not None  # a widening has a table to widen (so the batch did not create it)
            crashpoints.point("before-widen")
            table = _widen(table, columns, request.schema.describe())
            crashpoints.point("after-widen")
        if table is not None and not born:
            _add_key_columns(table, request, state)
        remember_deletes(request)
        props = CommitProperties(
            app_transactions=[Transaction(app_id(topic, partition), offset, int(time.time() * 1000))
                              for (topic, partition), offset in sorted(request.offsets.items())],
            custom_metadata=as_json(commit_info(request, state, outcome)),
        )
        crashpoints.point("before-commit")
        if born:
            return _create_with_rows(request, props, self._properties(), self.target_file_size, outcome, started)
        assert table is not None
        before = table.version()
        try:
            # The handle stays at the plan's version; another writer's commit since shows in the log only.
            if request.source.count and may_append(request, state, lambda: log_version(table)):
                outcome.metrics = _append(table, request, props, self.target_file_size)
            # A table without user columns (created by a truncate) holds no rows: nothing to merge.
            elif request.source.count or (request.truncate and state.columns):
                metrics = _merge(table, request, props)
                outcome.metrics = metrics
                outcome.rows_truncated = _truncated_rows(request, metrics)
                table.update_incremental()
            if table.version() == before:
                # MERGE writes no commit when it changes nothing; progress must still be recorded.
                table.create_write_transaction([], "append", table.schema(), commit_properties=props,
                                               post_commithook_properties=AFTER_COMMIT)
        except CommitFailedError as exc:
            raise CommitConflictError(request.table, f"commit failed, another writer changed the table: {exc}") from exc
        table.update_incremental()
        self.checkpoints.after_commit(table, request.path)
        outcome.committed = True
        outcome.delta_version = table.version()
        outcome.merge_ms = int((time.perf_counter() - started) * 1000)
        return outcome


def _add_key_columns(table: DeltaTable, request: CommitRequest, state: TableState) -> None:
    """A table a truncate created has no user columns: its first MERGE needs the key columns its
    join names (the MERGE's schema merge adds the other new columns itself)."""

    have = {c.name for c in state.columns or []}
    missing = [c for c in request.schema.columns if c.name in request.key_columns and c.name not in have]
    if missing:
        table.alter.add_columns(Schema.from_arrow(pa.schema([pa.field(c.name, arrow_type(c.type))
                                                              for c in missing])).fields)


def _framework_schema() -> list[pa.Field]:
    return [pa.field(name, typ) for name, typ in FRAMEWORK_COLUMNS]


def _truncated_rows(request: CommitRequest, metrics: dict[str, Any]) -> int:
    """Rows the batch's truncate removed (hard) or flagged deleted (soft, scd2: ended).

    The MERGE's counts include what the source's own rows matched; the rest is the truncate's.
    """
    if request.history:
        return max(0, metrics.get("num_target_rows_updated", 0) - request.updates)
    if request.delete_mode == "hard":
        return max(0, metrics.get("num_target_rows_deleted", 0) - request.matched_deletes)
    return max(0, metrics.get("num_target_rows_updated", 0) - request.matched_updates)


def table_schema_of(columns: list[ColumnSpec], history_mode: str = "scd1") -> pa.Schema:
    """The Delta table's schema: the source columns in their types, then the framework's (and scd2's)."""
    if history_mode == "scd2":
        return history_schema(columns)
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns] + _framework_schema())


def _create(request: CommitRequest, properties: dict[str, str]) -> DeltaTable:
    return DeltaTable.create(
        request.path.uri, table_schema_of(request.schema.columns, request.history_mode), mode="ignore",
        name=request.table, configuration=properties,
        description=_description(request),
        commit_properties=CommitProperties(custom_metadata={STATE_KEY: json.dumps(
            state_metadata(request.key_columns, None, request.flattened))}),
        storage_options=request.path.storage_options,
    )


def _create_with_rows(request: CommitRequest, props: CommitProperties, properties: dict[str, str],
                      target_file_size: int, outcome: CommitOutcome, started: float) -> CommitOutcome:
    """Create the table holding the batch's rows (:func:`initial_rows`), progress and state in its first commit."""
    rows = initial_rows(request)
    try:
        write_table(request.path, rows, mode="error", name=request.table, description=_description(request),
                        configuration=properties, target_file_size=target_file_size, commit_properties=props)
    except (CommitFailedError, DeltaError) as exc:  # another writer created it first
        raise CommitConflictError(request.table, f"creating the table failed, another writer was first: {exc}"
                                  ) from exc
    outcome.committed = True
    outcome.delta_version = 0
    outcome.merge_ms = int((time.perf_counter() - started) * 1000)
    return outcome


def initial_rows(request: CommitRequest) -> pa.Table:
    """The rows a new table starts with: those the MERGE would insert into an empty table -- every
    row of the plan's source, less hard deletes (a key the table never held) and, scd2, the versions
    to drop -- laid out by key."""
    assert isinstance(request.source, ArrowRows)
    source = request.source.table
    if request.history:
        source = source.filter(pc.invert(source[DROP]))
    elif request.delete_mode == "hard" and source.num_rows:
        source = source.filter(pc.invert(source["_cdc_deleted"]))
    if request.key_columns:
        source = source.sort_by([(k, "ascending") for k in request.key_columns])
    return laid_out(source, table_schema_of(request.schema.columns, request.history_mode))


def _description(request: CommitRequest) -> str:
    return f"CDC target table {request.table} (primary key {', '.join(request.key_columns)})"


def _widen(table: DeltaTable, columns: list[ColumnSpec], describe: str) -> DeltaTable:
    """Rewrite the table with widened column types (data unchanged) before the batch's commit."""
    current = read_all(table)
    user = {c.name for c in columns}
    target = pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns if c.name in current.column_names]
                       + [f for f in current.schema if f.name not in user])
    # int -> double is the one widening that rounds (beyond 2**53): pyarrow's checked cast refuses it.
    arrays = [current[f.name].cast(f.type, safe=not (pa.types.is_floating(f.type)
                                                      and pa.types.is_integer(current[f.name].type)))
              for f in target]
    write_deltalake(table, pa.Table.from_arrays(arrays, schema=target), mode="overwrite", schema_mode="overwrite",
                    commit_properties=CommitProperties(custom_metadata={"cdc.schema_change": describe}))
    table.update_incremental()
    return table


def _append(table: DeltaTable, request: CommitRequest, props: CommitProperties, target_file_size: int
            ) -> dict[str, int]:
    """Append the rows the MERGE would insert (:func:`~ingest.commit.writer.may_append`), placed by
    name in the table's own column order; returns the write's metrics under the MERGE's names.

    Nothing is written when no row is left (soft mode keeps a delete of a new key as a row; hard
    mode has none): the caller's empty commit then records the progress markers.
    """
    rows = initial_rows(request)
    if rows.num_rows == 0:
        return {}
    write_deltalake(table, laid_out(rows, table_schema(table)), mode="append", commit_properties=props,
                    post_commithook_properties=AFTER_COMMIT, target_file_size=target_file_size)
    table.update_incremental()
    reported = table.history(1)[0].get("operationMetrics") or {}
    return {merged: int(reported[written]) for written, merged in _APPEND_METRICS.items() if written in reported}


#: A delta-rs append's metrics (``WRITE``), under the names its MERGE reports the same counts by.
_APPEND_METRICS: Final = {"num_added_rows": "num_target_rows_inserted", "num_added_files": "num_target_files_added"}


def _merge(table: DeltaTable, request: CommitRequest, props: CommitProperties) -> dict[str, Any]:
    """The batch's MERGE (:mod:`ingest.commit.merge_sql`): current rows by key, or scd2 versions by key
    and position."""
    assert isinstance(request.source, ArrowRows)
    source = request.source.table
    if request.key_columns:
        source = source.sort_by([(k, "ascending") for k in request.key_columns])
    return run_merge(table, source, merge_statement(request, source, DIALECT), props)


def _timestamp(value: datetime | None) -> str:
    if value is None:
        return "NULL"
    return utc_literal(value)


#: DataFusion's SQL, as delta-rs's MERGE reads it.
DIALECT: Final = Dialect(ident=quote, string=sql_string, timestamp=_timestamp)


def run_merge(table: DeltaTable, source: pa.Table, statement: MergeStatement, props: CommitProperties
              ) -> dict[str, Any]:
    """Run ``statement`` with delta-rs's merge builder; returns its metrics."""
    merger = table.merge(source, statement.on, source_alias="s", target_alias="t", merge_schema=True,
                         commit_properties=props, post_commithook_properties=AFTER_COMMIT)
    for clause in statement.clauses:
        if clause.kind == "matched_delete":
            merger = merger.when_matched_delete(clause.condition)
        elif clause.kind == "matched_update":
            assert clause.sets is not None
            merger = merger.when_matched_update(clause.sets, clause.condition)
        elif clause.kind == "not_matched_insert":
            assert clause.sets is not None
            merger = merger.when_not_matched_insert(clause.sets, clause.condition)
        elif clause.kind == "not_matched_by_source_delete":
            merger = merger.when_not_matched_by_source_delete(clause.condition)
        else:
            assert clause.sets is not None
            merger = merger.when_not_matched_by_source_update(clause.sets, clause.condition)
    return merger.execute()
