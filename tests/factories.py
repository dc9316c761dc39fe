"""Builders for change events and decoded batches used across the engine's tests."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingest.batch import DECODED_SCHEMA
from ingest.events import ChangeEvent, ColumnSpec, ControlRecord, KafkaCoordinates, SourcePosition
from ingest.reduce import PositionedChange

COLUMNS = (
    ColumnSpec("id", "integer", False),
    ColumnSpec("name", "string"),
    ColumnSpec("balance", "decimal(12,2)"),
    ColumnSpec("notes", "string"),
)


def pos(n: int, phase: int = 1) -> SourcePosition:
    """A PostgreSQL-like position: committed LSN n, change LSN n."""
    return SourcePosition(n, n, 0, phase)


def change(op: str, key: int, at: int, *, name: str | None = "x", balance: str = "1.00",
           notes: str | None = None, columns: tuple[ColumnSpec, ...] = COLUMNS,
           unavailable: frozenset[str] = frozenset(), extra: dict[str, Any] | None = None) -> ChangeEvent:
    row = {"id": key, "name": name, "balance": Decimal(balance), "notes": notes, **(extra or {})}
    row = {c.name: row.get(c.name) for c in columns}
    if op == "t":
        return ChangeEvent("t", {}, None, None, pos(at), (), (), source_ts_ms=1_700_000_000_000 + at)
    after = None if op == "d" else row
    before = row if op in ("u", "d") else None
    return ChangeEvent(op, {"id": key}, after, before, pos(at, 0 if op == "r" else 1), columns, ("id",),  # type: ignore[arg-type]
                       source_ts_ms=1_700_000_000_000 + at, unavailable=unavailable, schema_ref="avro:1")


def positioned(event: ChangeEvent, offset: int, partition: int = 0, topic: str = "t") -> PositionedChange:
    return PositionedChange(event, KafkaCoordinates(topic, partition, offset))


def decoded_rows(items: list[ChangeEvent | ControlRecord | str], *, topic: str = "t", partition: int = 0,
                 first_offset: int = 0) -> pa.Table:
    """Rows as the decode step emits them; a ``str`` item is an undecodable message with that reason."""
    rows = []
    for i, item in enumerate(items):
        is_error = isinstance(item, str)
        rows.append({
            "topic": topic, "partition": partition, "offset": first_offset + i,
            "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
            "kind": "error" if is_error else ("control" if isinstance(item, ControlRecord) else "change"),
            "payload": None if is_error else pickle.dumps(item),
            "reason": item if is_error else None,
            "raw_key": b"k", "raw_value": b"garbage" if is_error else b"v",
        })
    return pa.Table.from_pylist(rows, schema=DECODED_SCHEMA)
