"""Builders for change events and decoded batches used across the engine's tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from ingest.decode import MessageDecoder
from ingest.decode.parts import PartsBuilder
from ingest.model import ChangeEvent, ColumnSpec, ControlRecord, SourcePosition

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


def source_bytes(coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[bytes, bytes, None]]:
    """The ``fetch_raw`` of the source these rows came from: every message was key ``k``, value ``v``."""
    return {c: (b"k", b"v", None) for c in coords}


def decoded_rows(items: list[ChangeEvent | ControlRecord | str], *, topic: str = "t", partition: int = 0,
                 first_offset: int = 0) -> list[pa.RecordBatch]:
    """The decode step's parts for these results; a ``str`` item is an undecodable message with that reason."""
    n = len(items)
    source = pa.table({
        "topic": pa.array([topic] * n, pa.string()), "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
        "timestamp": pa.array([datetime(2026, 1, 1, tzinfo=UTC)] * n, pa.timestamp("us", tz="UTC")),
    })
    out, decoder = PartsBuilder(source), MessageDecoder(value_format="json", registry=None)
    for row, item in enumerate(items):
        if isinstance(item, str):
            out.error(decoder, (None, row, b"k", b"garbage"), item)  # type: ignore[arg-type]
        elif isinstance(item, ControlRecord):
            out.control(item, row, b"k")
        else:
            out.change(item, row)
    return out.parts()


def hold_lock_in_another_process(root: Path, table: str) -> subprocess.Popen[bytes]:
    """A process of its own that holds ``table``'s writer lock under ``root`` until it is killed."""
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from ingest.lake.locks import TableLock
        lock = TableLock(Path({str(root)!r}), {table!r}).acquire()  # kept: the lock lives with the object
        print("locked", flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"locked"
    return child
