"""The writers' contract: one planned batch in, one atomic Delta commit out (docs/architecture.md#writers).

Two writers implement :class:`Writer`: :class:`~ingest.commit.delta_rs.DeltaRsWriter` (delta-rs
on the driver, copy-on-write files) and :class:`~ingest.commit.delta_spark.DeltaSparkWriter`
(delta-spark's MERGE as Spark jobs, deletion vectors). The rows a request carries are where the
placement planned them (:data:`Rows`): an Arrow table on the driver, which both write, or a
DataFrame on Spark's executors, which only delta-spark writes (the configuration refuses the other
pairing when it loads). Whatever the writer, a CDC commit carries in its commit info:

* ``cdc.batch``: the batch's audit record (:mod:`ingest.records.audit` restores lost audit rows from it);
* ``cdc.state``: primary key, latest truncate position, position format, flattened-ness;
* ``cdc.offsets``: the last applied offset of every topic-partition the table has seen, carried
  forward from commit to commit (``"<topic>:<partition>" -> offset``).

delta-rs also records each partition's offset as its own Delta app transaction
(``cdc:<topic>:<partition>``). delta-spark's MERGE records one app transaction per commit, so it
records ``cdc:table:<table>`` with a version one above the last, and the offsets travel in
``cdc.offsets`` of the same commit. :class:`~ingest.commit.state.TableState` reads both, so either
writer continues a table the other wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pyarrow as pa

from ingest import crashpoints
from ingest.commit import remembered
from ingest.commit.merge_sql import Dialect, FrameSource, MergeStatement, current_merge, history_merge
from ingest.commit.state import BATCH_KEY, OFFSETS_KEY, POSITION_FORMAT, STATE_KEY, TableState
from ingest.lake.delta import records_change_feed
from ingest.lake.location import LakePath
from ingest.lake.lookup import KeyLookup
from ingest.model import SourceMark
from ingest.rules.schema import SchemaPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True, slots=True)
class ArrowRows:
    """Rows on the driver, as an Arrow table (the driver placement's plan)."""

    table: pa.Table

    @property
    def count(self) -> int:
        return self.table.num_rows

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)


@dataclass(frozen=True, slots=True)
class SparkRows:
    """Rows on Spark's executors, as a DataFrame (the executors placement's plan), with what the
    driver knows of them: how many there are and their first key column's least and greatest value
    (``bounds``, a table of those two rows). Only delta-spark writes from here."""

    frame: DataFrame
    count: int
    bounds: pa.Table

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns)


#: The rows a commit writes, wherever the placement left them.
Rows = ArrowRows | SparkRows


@dataclass(slots=True)
class CommitRequest:
    """Everything a writer needs to commit one planned batch.

    Attributes:
        table: table name.
        path: Delta table path.
        tombstones: the table's remembered deletes (hard mode).
        delete_mode: ``hard`` (live rows only) or ``soft`` (deleted rows flagged).
        key_columns: primary-key columns.
        schema: the table's user columns after this batch.
        source: the MERGE's source. scd1: one row per change, with the framework columns and the
            TOAST flags (:func:`ingest.rules.plan.merge_source`); scd2: the versions to write
            and, flagged :data:`~ingest.rules.history.DROP`, those to drop.
        truncate: the batch's truncate position if it applies, else ``None``.
        watermark: the latest truncate position the table will have seen after this commit.
        offsets: last offset of the batch per ``(topic, partition)`` (progress markers).
        flattened: whether the table's stream is known to be ``ExtractNewRecordState`` rows.
        describe: builds the audit record stored in the commit info (``cdc.batch``) from the
            outcome, just before the commit.
        history_mode: ``scd2``: the table keeps every version (:mod:`ingest.rules.history`);
            it is created with the history columns even when this batch has no versions.
        deletes: scd1, hard mode: the deletes to remember (key columns, ``_cdc_position``,
            ``_cdc_source_ts``), recorded before the MERGE.
        matched_deletes, matched_updates: scd1: the source's rows that delete (hard) or update
            (soft) a stored row; the MERGE's other deletions or updates are the truncate's.
        truncate_ts: scd2: the source time of ``truncate``, which ends the current version of
            every key the batch does not touch.
        truncate_log: scd2: every truncate the table has seen, ``(position, source time)``: a late
            change before one of them is ended by it.
        updates: scd2: source rows that update a stored version (the MERGE's other updates are
            the truncate's).
        mark: how far into the source's transactions the table's changes reach after this commit.
        new_keys_only: the table, at the version the plan read (``state``), stores none of the
            source's keys, and the batch has no truncate: every source row can only take the MERGE's
            insert clause, so the writer may append them instead (:func:`may_append`).
        new_deletes_only: hard mode: none of the batch's keys has a remembered delete (the plan read
            them), so its deletes may be appended to the remembered ones instead of merged.
    """

    table: str
    path: LakePath
    tombstones: remembered.RememberedDeletes
    delete_mode: Literal["hard", "soft"]
    key_columns: tuple[str, ...]
    schema: SchemaPlan
    source: Rows
    truncate: str | None
    watermark: str | None
    offsets: dict[tuple[str, int], int]
    flattened: bool | None
    describe: Callable[[CommitOutcome], dict[str, Any]]
    history_mode: Literal["scd1", "scd2"] = "scd1"
    deletes: Rows | None = None
    matched_deletes: int = 0
    matched_updates: int = 0
    truncate_ts: datetime | None = None
    truncate_log: list[tuple[str, datetime | None]] | None = None
    updates: int = 0
    new_keys_only: bool = False
    mark: SourceMark | None = None
    new_deletes_only: bool = False

    @property
    def history(self) -> bool:
        """Whether the table keeps every version (``history_mode: scd2``)."""
        return self.history_mode == "scd2"


@dataclass(slots=True)
class CommitOutcome:
    """What the commit did."""

    committed: bool = False
    delta_version: int | None = None
    rows_truncated: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    merge_ms: int = 0


class Writer(Protocol):
    """Commits planned batches to Delta tables."""

    name: str

    def lookup(self, path: LakePath) -> KeyLookup:
        """What reads the stored rows of a batch's keys from the table at ``path``, for its plan."""
        ...

    def commit(self, request: CommitRequest, state: TableState) -> CommitOutcome:
        """Apply ``request`` in one commit (see the module docstring for what it records).

        Raises:
            CommitConflictError: another writer committed to the table at the same time.
            TableError: the table cannot take the batch (a key column, a protocol the writer cannot write).
        """
        ...

    def settle(self) -> None:
        """Return once what the writer still does after its commits returned (a checkpoint) is done."""
        ...


def creates_with_rows(request: CommitRequest, state: TableState) -> bool:
    """Whether the batch creates its table and writes its rows in the same commit.

    A MERGE into an empty table would cost a second commit and a join; a batch that truncates or
    widens needs the table first.
    """
    return state.table is None and not request.truncate and not request.schema.widened


def may_append(request: CommitRequest, state: TableState, latest_version: Callable[[], int | None]) -> bool:
    """Whether the batch's rows may be appended instead of merged: the same rows, one cheap commit.

    True when the plan found none of the batch's keys stored (``request.new_keys_only``) and
    ``latest_version()``, the table's version just before the commit (``None``: unknown; asked only
    of a batch the flags let through, as it may list the log), is still the one the plan read: a
    MERGE would then insert exactly the rows :func:`~ingest.commit.delta_rs.initial_rows` gives, and
    neither match nor delete a stored row.
    Any commit since -- another writer's, or this batch's own preparation (a column added, a type
    widened, the change feed switched on) -- means a MERGE. A writer that commits between that check
    and the append is still caught when it records the same app transaction: Delta refuses or skips
    the second of the two. A batch that adds a column merges too: delta-rs's MERGE adds it in the
    same commit, where an append would need one first.

    The truncate and the table's existence are checked again though the flag implies both: a request
    built by other code than the pipeline's, with the flag set wrongly, then merges, which is always
    correct, instead of appending, which would not be.
    """
    return (request.new_keys_only and not request.history and not request.truncate and not request.schema.added
            and state.table is not None and latest_version() == state.version)


def merge_statement(request: CommitRequest, source: pa.Table | FrameSource, dialect: Dialect) -> MergeStatement:
    """The batch's MERGE in ``dialect``, the same for both writers (:mod:`ingest.commit.merge_sql`):
    current rows by key, or scd2 versions by key and position. ``source``: the planned rows, or the
    shape of rows on Spark's executors."""
    if request.history:
        return history_merge(source, dialect, key_columns=request.key_columns, columns=request.schema.columns,
                             truncate=request.truncate, truncate_ts=request.truncate_ts)
    return current_merge(source, dialect, key_columns=request.key_columns, columns=request.schema.columns,
                         delete_mode=request.delete_mode, truncate=request.truncate)


def switches_feed_on(state: TableState, enabled: bool) -> bool:
    """Whether the batch must first switch on the change data feed of its existing table.

    With ``target.change_data_feed`` on, a table created before (or with it off) records its changes
    from its next commit on, as a table created now would: one property commit, repeated harmlessly
    if a crash comes before the batch's own.
    """
    return enabled and state.table is not None and not records_change_feed(state.table)


def remembers_deletes(request: CommitRequest) -> bool:
    """Whether the batch's deletes are remembered before its commit (hard-delete mode, scd1; scd2
    keeps its deletes in the versions they end)."""
    return request.delete_mode == "hard" and not request.history and request.deletes is not None


def remember_deletes(request: CommitRequest) -> None:
    """Record the batch's deletes, planned on the driver, as remembered deletes before the commit.

    Written first, so a crash between the two leaves remembered deletes the replay rewrites, never a
    delete without its record.
    """
    if not remembers_deletes(request):
        return
    assert isinstance(request.deletes, ArrowRows)
    key_types = {c.name: c.type for c in request.schema.columns if c.name in request.key_columns}
    request.tombstones.record(request.key_columns, key_types, request.deletes.table,
                              new_keys_only=request.new_deletes_only)
    crashpoints.point("after-tombstones")


def state_metadata(key_columns: tuple[str, ...], watermark: str | None, flattened: bool | None,
                   truncate_log: list[tuple[str, datetime | None]] | None = None,
                   mark: SourceMark | None = None) -> dict[str, Any]:
    """The ``cdc.state`` a commit carries (read back by :func:`ingest.commit.state.load_state`)."""
    out: dict[str, Any] = {"primary_key": list(key_columns), "truncate_position": watermark,
                           "position_format": POSITION_FORMAT, "flattened": flattened}
    if truncate_log is not None:
        out["truncates"] = [[position, ts.isoformat() if ts else None] for position, ts in truncate_log]
    if mark is not None:
        out["source"] = mark.to_json()
    return out


def offsets_metadata(state: TableState, offsets: dict[tuple[str, int], int]) -> dict[str, int]:
    """The ``cdc.offsets`` a commit carries: what the table recorded, moved on by the batch's offsets."""
    merged = dict(state.offsets)
    merged.update({f"{topic}:{partition}": offset for (topic, partition), offset in offsets.items()})
    return dict(sorted(merged.items()))


def commit_info(request: CommitRequest, state: TableState, outcome: CommitOutcome) -> dict[str, Any]:
    """The CDC entries of a commit's info (``cdc.batch``, ``cdc.state``, ``cdc.offsets``)."""
    return {
        BATCH_KEY: request.describe(outcome),
        STATE_KEY: state_metadata(request.key_columns, request.watermark, request.flattened, request.truncate_log,
                                  request.mark if request.mark is not None else state.mark),
        OFFSETS_KEY: offsets_metadata(state, request.offsets),
    }


def as_json(entries: dict[str, Any]) -> dict[str, str]:
    """Commit-info entries as delta-rs stores them: one JSON string per entry."""
    return {key: json.dumps(value) for key, value in entries.items()}
