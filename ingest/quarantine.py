"""The quarantine: messages that could not be applied, with their raw bytes and the reason.

Nothing is dropped silently (DESIGN 3.7). A quarantined message keeps its Kafka coordinates, raw
key and value, the batch it came in and why it was held back. Writes are idempotent on
``(table, topic, partition, offset, stage)`` so a replayed batch does not quarantine twice.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from ingest.deltaio import open_table, read_all, sql_string

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
    stage: str  # decode | key | quality | schema
    reason: str
    batch_id: int
    run_id: str
    quarantined_at: datetime


def write(path: Path, records: list[QuarantineRecord]) -> int:
    """Insert records not already quarantined; returns how many were new."""
    if not records:
        return 0
    source = pa.Table.from_pylist([asdict(r) for r in records], schema=QUARANTINE_SCHEMA)
    with _LOCK:
        table = open_table(path)
        if table is None:
            write_deltalake(str(path), source, mode="append")
            return source.num_rows
        on = " AND ".join(f't."{k}" = s."{k}"' for k in _KEY)
        metrics = (table.merge(source, on, source_alias="s", target_alias="t")
                   .when_not_matched_insert_all().execute())
        return int(metrics.get("num_target_rows_inserted", 0))


def read(path: Path, *, table: str | None = None) -> pa.Table:
    delta = open_table(path)
    if delta is None:
        return QUARANTINE_SCHEMA.empty_table()
    return read_all(delta, where=f'"table" = {sql_string(table)}' if table else None)
