"""What a target table's Delta log says: user columns, primary key, applied offsets, truncate mark.

Progress lives in the table (docs/architecture.md#progress-lives-in-the-table). Every CDC commit
carries, in its commit info, ``cdc.state`` (primary key, latest truncate position and the table's
:class:`~ingest.model.SourceMark`, carried forward), ``cdc.offsets`` (the last applied offset of every
topic-partition, carried forward) and ``cdc.batch`` (the audit record). delta-rs commits put
them at the top of the commit info and also record one Delta app transaction per topic-partition
(``cdc:<topic>:<partition>``); delta-spark commits hold them as one JSON object in the commit's
``userMetadata`` and record one app transaction per table (``cdc:table:<table>``). Tables written
before ``cdc.offsets`` existed have the app transactions only, and are read the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from ingest.columns import FRAMEWORK_NAMES, delta_type_name
from ingest.commit.remembered import RememberedDeletes
from ingest.lake.delta import has_deletion_vectors, latest_table, table_schema
from ingest.lake.location import Location
from ingest.lake.side import SideTable
from ingest.model import ColumnSpec, SourceMark, ends_before

if TYPE_CHECKING:
    from ingest.lake.layout import TablePaths

STATE_KEY = "cdc.state"
BATCH_KEY = "cdc.batch"
OFFSETS_KEY = "cdc.offsets"
_CDC_KEYS = (STATE_KEY, BATCH_KEY, OFFSETS_KEY)
#: How ``_cdc_position`` is encoded (:meth:`ingest.model.SourcePosition.encode`). 1: fixed-width
#: hex of three 64-bit components; 2: variable-width components with Kafka fallback positions apart.
POSITION_FORMAT = 2
_HISTORY_PAGE = 50


def app_id(topic: str, partition: int) -> str:
    """Delta app-transaction id that records progress for one topic-partition."""
    return f"cdc:{topic}:{partition}"


def table_app_id(table: str) -> str:
    """Delta app-transaction id of a table's delta-spark commits (its version counts them)."""
    return f"cdc:table:{table}"


@dataclass(slots=True)
class TableState:
    """A snapshot of one target table's CDC bookkeeping."""

    table: DeltaTable | None
    columns: list[ColumnSpec] | None
    key_columns: tuple[str, ...] | None
    truncate_position: str | None
    position_format: int | None = None
    #: whether the stream is known to carry ``ExtractNewRecordState`` rows (``None``: not known yet).
    flattened: bool | None = None
    #: ``cdc.offsets`` of the latest CDC commit: ``"<topic>:<partition>" -> offset``
    offsets: dict[str, int] = field(default_factory=dict)
    #: scd2 tables: every truncate seen, ``(position, source time)`` in source order
    truncate_log: list[tuple[str, datetime | None]] = field(default_factory=list)
    #: whether the table keeps every version (``history_mode: scd2``: it has ``_cdc_is_current``)
    history: bool = False
    #: how far into the source's transactions the table's changes reach (``cdc.state``'s ``source``)
    mark: SourceMark = field(default_factory=SourceMark)
    #: the table's version when this state was read (``None``: the table's, whenever asked)
    read_at: int | None = None
    #: the newest CDC commit's info (decoded) that the state was read from
    newest: dict[str, Any] | None = None

    @property
    def version(self) -> int | None:
        """The version this state was read at: a writer that brings the same table handle forward
        (delta-rs's) does not move it."""
        if self.read_at is not None:
            return self.read_at
        return self.table.version() if self.table is not None else None

    def applied_offset(self, topic: str, partition: int) -> int | None:
        """Last offset of ``topic``/``partition`` applied to this table: from ``cdc.offsets`` of its latest
        CDC commit, else (a partition that commit does not name) from the partition's app transaction."""
        if self.table is None:
            return None
        recorded = self.offsets.get(f"{topic}:{partition}")
        return recorded if recorded is not None else self.table.transaction_version(app_id(topic, partition))

    def ends_before(self, topic: str, ends: dict[int, int]) -> dict[int, tuple[int, int]]:
        """The partitions of ``topic`` that end (``ends``: next offset per partition) at or before an offset
        this table applied, as a deleted and recreated topic does (:class:`~ingest.errors.TopicBehindTableError`):
        partition -> (the last offset applied, the end offset)."""
        return ends_before(ends, lambda p: self.applied_offset(topic, p))

    @property
    def deletion_vectors(self) -> bool:
        """Whether the table's protocol has deletion vectors (delta-rs can then neither read nor write it)."""
        return self.table is not None and has_deletion_vectors(self.table)


def load_state(path: Location, table: DeltaTable | None = None, *, known: NewestCommit | None = None) -> TableState:
    """The table's state at its latest version.

    Args:
        table: the table as opened before (brought up to date: only the commits since are read).
        known: the newest CDC commit as of an earlier version of ``table`` (only the commits since
            are searched: a continuous run's every batch would otherwise read 50 of them). It is
            ignored when ``table``'s log could not be followed and the table was opened afresh.
    """
    kept = table
    table = latest_table(path, table)
    if table is not kept:
        known = None
    if table is None:
        return TableState(None, None, None, None)
    schema = table_schema(table)
    columns = [
        ColumnSpec(f.name, delta_type_name(f.type), True) for f in schema if f.name not in FRAMEWORK_NAMES
    ]
    latest = latest_cdc_commit(table, known)
    state = latest.get(STATE_KEY, {}) if latest else {}
    key = tuple(state["primary_key"]) if state.get("primary_key") else None
    offsets = {str(k): int(v) for k, v in (latest.get(OFFSETS_KEY) or {}).items()} if latest else {}
    log = [(p, datetime.fromisoformat(t) if t else None) for p, t in state.get("truncates") or []]
    return TableState(table, columns, key, state.get("truncate_position"), state.get("position_format"),
                      state.get("flattened"), offsets, log, any(f.name == "_cdc_is_current" for f in schema),
                      SourceMark.from_json(state.get("source")), table.version(), latest)


class OpenTables:
    """One table's Delta handles, kept by a stream from one batch to the next.

    Opening a Delta table replays its log, which grows by a commit with every batch; bringing an
    open table up to date reads only the commits since. The stream holds the table's lease, so
    nothing else replaces its tables meanwhile.
    """

    def __init__(self, paths: TablePaths, table: str) -> None:
        self.path = paths.table
        self.target: DeltaTable | None = None
        self.tombstones = RememberedDeletes(paths.tombstones, table)
        self.moves = SideTable(paths.moves, table, "moves")
        self._known: NewestCommit | None = None

    def state(self) -> TableState:
        """The target table's state at its latest version (:func:`load_state`), reading only the
        commits since the last call."""
        state = load_state(self.path, self.target, known=self._known)
        self.target = state.table
        self._known = NewestCommit(state.read_at, state.newest) if state.read_at is not None else None
        return state

    def settle(self) -> None:
        """Return once the work left behind the table's last batch is done (the packing of its side
        tables: :class:`~ingest.lake.side.SideTable`)."""
        self.tombstones.settle()
        self.moves.settle()


@dataclass(frozen=True, slots=True)
class NewestCommit:
    """The newest CDC commit's info (``None``: none) of a table as of its version ``as_of``."""

    as_of: int
    info: dict[str, Any] | None


def latest_cdc_commit(table: DeltaTable, known: NewestCommit | None = None) -> dict[str, Any] | None:
    """Commit info of the newest commit written by the engine (maintenance commits are skipped).

    ``known``: what an earlier version of the table had; only the commits since are read, unless the
    table's version is below it (the table was replaced).
    """
    if known is not None and 0 <= (newer := table.version() - known.as_of) <= _HISTORY_PAGE:
        found = newest_cdc_commit(table.history(newer)) if newer else None
        return found if found is not None else known.info
    limit = _HISTORY_PAGE
    while True:
        history = table.history(limit)
        found = newest_cdc_commit(history)
        if found is not None or len(history) < limit:
            return found
        limit *= 4


def newest_cdc_commit(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first engine commit (decoded) in ``history``, which delta-rs lists newest first."""
    for commit in history:
        decoded = decoded_commit(commit)
        if STATE_KEY in decoded:
            return decoded
    return None


def cdc_commits(table: DeltaTable, *, since_version: int = -1) -> list[dict[str, Any]]:
    """Runner commits newer than ``since_version``, oldest first."""
    decoded = (decoded_commit(c) for c in table.history())
    out = [c for c in decoded if BATCH_KEY in c and c.get("version", -1) > since_version]
    return sorted(out, key=lambda c: c["version"])


def decoded_commit(commit: dict[str, Any]) -> dict[str, Any]:
    """The commit info with the CDC entries parsed, wherever the engine put them."""
    out = dict(commit)
    user = out.get("userMetadata")
    if isinstance(user, str) and user.startswith("{"):
        try:
            lifted = json.loads(user)
        except ValueError:
            lifted = None
        if isinstance(lifted, dict):
            out.update({k: v for k, v in lifted.items() if k in _CDC_KEYS})
    for key in _CDC_KEYS:
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out
