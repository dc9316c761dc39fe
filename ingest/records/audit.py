"""The audit trail: one row per table per micro-batch (docs/architecture.md#nothing-is-lost-silently).

Balance that must hold in every row::

    received = inserted + updated + deleted + truncates + superseded + stale + quarantined + skipped

``skipped`` counts messages that carry no row change (Debezium tombstones after a full envelope's
delete -- in a flattened stream a tombstone is a delete and counts as one --, heartbeats,
schema-change and transaction records). ``quarantined`` counts every message held back, whether it
did not decode or failed the quality gate; when the gate holds a key's winning change, the key's
earlier changes in the batch (which it would have superseded) are held with it and counted as
quarantined rather than superseded, so each message stays in exactly one term. The terms count
changes: an update that moves a configured ``primary_key`` is two (the delete of the old key and the
new key's row, see docs/architecture.md#primary-key-moves), so ``received`` counts it twice.

Quality columns: ``expectations_evaluated``, ``expectations_failed``, ``quality_status``
(``passed``, ``warned``, ``quarantined``, ``failed``, ``skipped``) and ``quality_failures`` (JSON
``{expectation name: unexpected count}``; an aggregate expectation counts every validated row).
Replays of quarantined messages (``ingest quarantine replay``) add rows with ``batch_id`` -1 and
status ``replayed``. A batch stopped by policy ``fail`` commits nothing and leaves no row; its
validation result is kept for ``ingest quality show``.

The record is first written into the target table's commit info (``cdc.batch``) in the same
commit as the data, so it can never be lost; the audit Delta table is its queryable copy, appended
after the commit and repaired from the commit info (:func:`reconcile`) if a crash fell in between.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from ingest.commit.state import BATCH_KEY, cdc_commits
from ingest.lake import locks
from ingest.lake.delta import empty, latest_table, open_table, pack_small_files, read_all, sql_string, write_table
from ingest.lake.location import LakePath, Location
from ingest.secrets import redact

#: What a batch did: committed its changes and offsets; found nothing to write (offsets still move
#: only with a commit); or re-applied quarantined messages (no offsets).
BatchStatus = Literal["committed", "nothing-to-commit", "replayed"]
#: The quality gate's verdict on a batch (``skipped``: no suite, or nothing to validate).
QualityStatus = Literal["passed", "warned", "quarantined", "failed", "skipped"]

_LOCK = threading.Lock()  # one process appends for several tables' queries


@dataclass(slots=True)
class AuditRecord:
    """What happened to one table in one micro-batch."""

    table: str
    run_id: str
    batch_id: int
    received: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    truncates: int = 0
    superseded: int = 0
    stale: int = 0
    quarantined: int = 0
    skipped: int = 0
    rows_truncated: int = 0
    #: rows written with a column whose value is unknown (TOAST placeholder, no stored value); not a
    #: term of the balance, a flag on rows already counted (see ``_cdc_unknown_columns``).
    toast_unknown: int = 0
    offsets: str = "{}"
    delta_version: int | None = None
    status: BatchStatus = "committed"
    schema_change: str = ""
    error: str = ""
    expectations_evaluated: int = 0
    expectations_failed: int = 0
    quality_status: QualityStatus = "skipped"
    quality_failures: str = "{}"
    decode_ms: int = 0
    apply_ms: int = 0
    total_ms: int = 0
    #: the apply engine that committed the batch (delta-rs or delta-spark)
    engine: str = ""
    #: the MERGE's own metrics, as its engine names them (delta-spark: rows copied into rewritten
    #: files vs deletion vectors written; delta-rs: files rewritten)
    merge_metrics: str = "{}"
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: when the newest change the batch received was committed in the source (Debezium's
    #: ``source.ts_ms``); ``finished_at`` minus this is how far the table trailed its source
    source_committed_at: datetime | None = None
    #: snapshot reads among the received (``r``: the initial snapshot, or ``ingest resnapshot``'s)
    snapshot_reads: int = 0
    #: incremental snapshot reads that contradict the change streamed before them
    #: (:mod:`ingest.rules.rereads`): their rows are to be read again
    suspect_reads: int = 0

    @property
    def applied(self) -> int:
        return self.inserted + self.updated + self.deleted + self.truncates

    @property
    def balanced(self) -> bool:
        return self.received == self.applied + self.superseded + self.stale + self.quarantined + self.skipped

    def last_offsets(self, topic: str) -> dict[int, int]:
        """The last offset the batch read of each partition of ``topic`` (from ``offsets``)."""
        out = {}
        for key, (_, last) in json.loads(self.offsets).items():
            name, _, partition = key.rpartition(":")
            if name == topic:
                out[int(partition)] = int(last)
        return out

    def to_metadata(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("started_at", "finished_at", "source_committed_at"):
            out[key] = out[key].isoformat() if out[key] else None
        return out

    @classmethod
    def from_metadata(cls, data: dict[str, Any]) -> AuditRecord:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("started_at", "finished_at", "source_committed_at"):
            if isinstance(values.get(key), str):
                values[key] = datetime.fromisoformat(values[key])
        return cls(**values)


AUDIT_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("run_id", pa.string()),
        ("batch_id", pa.int64()),
        ("received", pa.int64()),
        ("inserted", pa.int64()),
        ("updated", pa.int64()),
        ("deleted", pa.int64()),
        ("truncates", pa.int64()),
        ("superseded", pa.int64()),
        ("stale", pa.int64()),
        ("quarantined", pa.int64()),
        ("skipped", pa.int64()),
        ("rows_truncated", pa.int64()),
        ("toast_unknown", pa.int64()),
        ("offsets", pa.string()),
        ("delta_version", pa.int64()),
        ("status", pa.string()),
        ("schema_change", pa.string()),
        ("error", pa.string()),
        ("expectations_evaluated", pa.int64()),
        ("expectations_failed", pa.int64()),
        ("quality_status", pa.string()),
        ("quality_failures", pa.string()),
        ("decode_ms", pa.int64()),
        ("apply_ms", pa.int64()),
        ("total_ms", pa.int64()),
        ("engine", pa.string()),
        ("merge_metrics", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("balanced", pa.bool_()),
        # added later: last, as tables written before and merged since have them
        ("source_committed_at", pa.timestamp("us", tz="UTC")),
        ("snapshot_reads", pa.int64()),
        ("suspect_reads", pa.int64()),
    ]
)


class AuditLog:
    """The audit table as a continuous run appends to it, a commit per micro-batch.

    Opening a Delta table replays its log, so appending to one opened afresh each time costs more
    with every commit. This keeps the table open from one append to the next, brought up to date
    before each, and packs the small file each append adds (:func:`~ingest.lake.delta.pack_small_files`);
    ``benchmarks/bench_audit_append.py`` compares the two.
    """

    def __init__(self) -> None:
        self._open: dict[str, DeltaTable] = {}

    def append(self, audit_path: Location, records: list[AuditRecord]) -> None:
        """:func:`append`, to the table kept open."""
        _append(audit_path, records, self._open)


def append(audit_path: Location, records: list[AuditRecord]) -> None:
    """Append audit rows (one process-wide lock keeps concurrent tables from racing commits)."""
    _append(audit_path, records, None)


def _append(audit_path: Location, records: list[AuditRecord], opened: dict[str, DeltaTable] | None) -> None:
    if not records:
        return
    rows = []
    for rec in records:
        row = asdict(rec)
        row["balanced"] = rec.balanced
        row["error"] = redact(row["error"]) if row["error"] else row["error"]
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=AUDIT_SCHEMA)
    with _LOCK, locks.shared(audit_path):  # shared by every run's tables, in this process and others
        uri = LakePath.of(audit_path).uri
        delta = latest_table(audit_path, opened.get(uri)) if opened is not None else None
        # schema_mode merge: an audit table written before a column was added takes it on.
        if opened is None or delta is None:
            write_table(audit_path, table, mode="append", schema_mode="merge")
            return
        write_deltalake(delta, table, mode="append", schema_mode="merge")
        pack_small_files(delta)
        opened[uri] = delta


def read(audit_path: Location, *, table: str | None = None) -> pa.Table:
    delta = open_table(audit_path)
    if delta is None:
        return empty(AUDIT_SCHEMA)
    where = f'"table" = {sql_string(table)}' if table else None
    return read_all(delta, where=where)


def reconcile(audit_path: Location, table: str, table_path: Location) -> int:
    """Append audit rows that exist in the table's commit info but not in the audit table.

    Returns:
        How many rows were restored.
    """
    delta = open_table(table_path)
    if delta is None:
        return 0
    existing = read(audit_path, table=table)
    have = set(existing["delta_version"].to_pylist()) if existing.num_rows else set()
    missing = []
    for commit in cdc_commits(delta):
        if commit["version"] in have:
            continue
        record = AuditRecord.from_metadata(commit[BATCH_KEY])
        record.delta_version = commit["version"]
        missing.append(record)
    append(audit_path, missing)
    return len(missing)


def now() -> datetime:
    return datetime.now(UTC)
