"""The quarantine: messages that could not be applied, with their raw bytes and the reason.

Nothing is dropped silently (docs/architecture.md#nothing-is-lost-silently). A quarantined message
keeps its Kafka coordinates, raw key and value, the batch it came in and why it was held back
(``stage``: decode, key, quality; for quality, the failed expectations by name and the observed
values). Writes are idempotent on
``(table, topic, partition, offset, stage)`` so a replayed batch does not quarantine twice.
``ingest quarantine replay`` re-applies held messages after a fix and stamps them
(``replayed_at``, ``replay_version``) so a second replay skips them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from ingest.lake import locks
from ingest.lake.delta import empty, open_table, read_all, sql_string, write_table
from ingest.lake.location import Location
from ingest.secrets import redact

#: Where a message was held back: it did not decode; its key is not the table's; or its after-image
#: failed an expectation under policy ``quarantine``.
Stage = Literal["decode", "key", "quality"]

_LOCK = threading.Lock()

QUARANTINE_SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),
        ("stage", pa.string()),
        ("reason", pa.string()),
        ("batch_id", pa.int64()),
        ("run_id", pa.string()),
        ("quarantined_at", pa.timestamp("us", tz="UTC")),
        ("expectations", pa.string()),
        ("row_key", pa.string()),
        ("replayed_at", pa.timestamp("us", tz="UTC")),
        ("replay_version", pa.int64()),
    ]
)
_KEY = ("table", "topic", "partition", "offset", "stage")


@dataclass(slots=True)
class QuarantineRecord:
    """One held-back message."""

    table: str
    topic: str
    partition: int
    offset: int
    kafka_timestamp: datetime | None
    raw_key: bytes | None
    raw_value: bytes | None
    stage: Stage
    reason: str
    batch_id: int
    run_id: str
    quarantined_at: datetime
    expectations: str = ""  # quality: the failed expectations' names, a JSON list
    row_key: str | None = None  # the row's primary key as JSON: the change's, or its Kafka key's at stage decode
    replayed_at: datetime | None = None
    replay_version: int | None = None


def _match(source: pa.Table) -> str:
    """The MERGE condition: same message and stage, and literal bounds delta-rs prunes files with.

    The quarantine table gains a small file per batch; without the bounds every MERGE would scan
    all of them, and time and memory would grow with the table. The bounds hold for any row that
    matches, so they change nothing else.
    """
    on = [f't."{k}" = s."{k}"' for k in _KEY]
    offsets = pc.min_max(source["offset"])
    on.append(f't."offset" BETWEEN {offsets["min"].as_py()} AND {offsets["max"].as_py()}')
    topics = ", ".join(sql_string(t) for t in sorted(set(source["topic"].to_pylist())))
    on.append(f't."topic" IN ({topics})')
    return " AND ".join(on)


def write(path: Location, records: list[QuarantineRecord]) -> int:
    """Insert records not already quarantined; returns how many were new."""
    if not records:
        return 0
    # Reasons may quote library errors: no credential may reach the table.
    rows = [{**asdict(r), "reason": redact(r.reason)} for r in records]
    source = pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)
    with _LOCK, locks.shared(path):  # shared by every run's tables, in this process and others
        table = open_table(path)
        if table is None:
            write_table(path, source, mode="append")
            return source.num_rows
        on = _match(source)
        # merge_schema: a quarantine table written before a column was added takes it on.
        metrics = (table.merge(source, on, source_alias="s", target_alias="t", merge_schema=True)
                   .when_not_matched_insert_all().execute())
        return int(metrics.get("num_target_rows_inserted", 0))


def read(path: Location, *, table: str | None = None, stage: str | None = None, pending: bool = False) -> pa.Table:
    """Quarantined rows, optionally of one table and stage; ``pending``: not replayed yet."""
    delta = open_table(path)
    if delta is None:
        return empty(QUARANTINE_SCHEMA)
    names = {f.name for f in delta.schema().fields}
    where = [f'"table" = {sql_string(table)}'] if table else []
    if stage:
        where.append(f'"stage" = {sql_string(stage)}')
    if pending and "replayed_at" in names:
        where.append('"replayed_at" IS NULL')
    rows = read_all(delta, where=" AND ".join(where) or None)
    # Rows of an older layout read with the current columns (absent ones null).
    for f in QUARANTINE_SCHEMA:
        if f.name not in rows.column_names:
            rows = rows.append_column(f, pa.nulls(rows.num_rows, f.type))
    return rows.select(QUARANTINE_SCHEMA.names)


def mark_replayed(path: Location, table: str, ids: Iterable[tuple[str, int, int, str]], *, at: datetime,
                  version: int | None) -> int:
    """Stamp quarantined rows ``(topic, partition, offset, stage)`` of ``table`` as replayed."""
    ids = list(ids)
    if not ids:
        return 0
    source = pa.table({
        "table": pa.array([table] * len(ids), pa.string()),
        "topic": pa.array([i[0] for i in ids], pa.string()),
        "partition": pa.array([i[1] for i in ids], pa.int32()),
        "offset": pa.array([i[2] for i in ids], pa.int64()),
        "stage": pa.array([i[3] for i in ids], pa.string()),
        "replayed_at": pa.array([at] * len(ids), pa.timestamp("us", tz="UTC")),
        "replay_version": pa.array([version] * len(ids), pa.int64()),
    })
    with _LOCK:
        delta = open_table(path)
        if delta is None:
            return 0
        metrics = (delta.merge(source, _match(source), source_alias="s", target_alias="t", merge_schema=True)
                   .when_matched_update({"replayed_at": "s.replayed_at", "replay_version": "s.replay_version"})
                   .execute())
        return int(metrics.get("num_target_rows_updated", 0))


def pending_row_keys(path: Location, table: str, *, stage: str | None = None) -> list[tuple[dict, dict]]:
    """The table's held messages not replayed yet that name the row they would change: each as the row's
    key (its values by key column, as JSON gave them) and the message's record (``topic``,
    ``partition``, ``offset``, ``stage``, ``reason``)."""
    rows = read(path, table=table, stage=stage, pending=True)
    return [(json.loads(r["row_key"]), r)
            for r in rows.select(["topic", "partition", "offset", "stage", "reason", "row_key"]).to_pylist()
            if r["row_key"]]
