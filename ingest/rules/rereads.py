"""Incremental snapshot reads that contradict the change streamed just before them: suspect reads.

See docs/operations.md#re-reading-one-table-from-the-source.

Debezium's incremental snapshot reads a table in chunks and drops a chunk's read of a row that
changed while the chunk was open; a change streamed before the chunk opened it takes as visible to
the chunk's query. PostgreSQL streams a commit from its WAL a moment before other sessions see it,
so a chunk that reads in that moment reads the row as it was before the change, and the read comes
after the change in source order: applied by position, it puts the older row back (or brings back
a deleted one).

A read contradicts the streamed change before it only so, or when the table lost that change (rows
changed behind the engine's back, a topic that lost messages); either way reading the row again is
right. So the rule names the keys whose incremental read differs from the key's previous event --
a streamed image, on the columns both know, or a delete -- and the engine asks the connector to read
those rows again (:func:`condition`). A read after a read is never suspect, so the re-reads end.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingest.rules.moved import Event

#: A column name both PostgreSQL and MySQL/MariaDB read unquoted as itself.
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True, slots=True)
class SuspectReads:
    """The keys (values of ``key_columns``) whose incremental read contradicts what was streamed before it."""

    key_columns: tuple[str, ...]
    keys: tuple[tuple[Any, ...], ...]

    def __len__(self) -> int:
        return len(self.keys)


def suspect_reads(reads: pa.Table, history: Mapping[tuple[Any, ...], Sequence[Event]], key_columns: tuple[str, ...],
                  columns: Sequence[str]) -> SuspectReads:
    """The keys of ``reads`` whose previous event in ``history`` is a streamed change they contradict.

    Args:
        reads: incremental snapshot reads: the key columns, ``_cdc_position`` and ``columns``.
        history: each key's known events (the batch's changes, the stored row, a remembered delete),
            in any order; a read's own event may be among them.
        columns: the value columns to compare (an image compares only those it knows).
    """
    found: set[tuple[Any, ...]] = set()
    for row in reads.to_pylist():
        key = tuple(row[k] for k in key_columns)
        before = [e for e in history.get(key, ()) if e.position < row["_cdc_position"]]
        if not before:
            continue
        last = max(before, key=lambda e: (e.position, e.order))
        if last.read:
            continue
        if last.delete or any(not _same(row[c], last.values[c]) for c in columns
                              if c in last.values and c not in last.unknown):
            found.add(key)
    try:
        ordered = sorted(found)
    except TypeError:  # keys of mixed types: any fixed order
        ordered = sorted(found, key=repr)
    return SuspectReads(key_columns, tuple(ordered))


def condition(suspects: SuspectReads) -> str | None:
    """An SQL condition that selects the suspect rows, read alike by PostgreSQL and MySQL/MariaDB
    (Debezium's ``additional-conditions``); ``None`` when a key column's name or value has no
    spelling both read the same way (quoted names, text with a backslash, other types)."""
    names = suspects.key_columns
    if not suspects.keys or not all(_PLAIN_NAME.fullmatch(n) for n in names):
        return None
    rows = [[_literal(v) for v in key] for key in suspects.keys]
    if any(v is None for row in rows for v in row):
        return None
    if len(names) == 1:
        return f"{names[0]} IN ({', '.join(str(row[0]) for row in rows)})"
    tuples = ", ".join(f"({', '.join(str(v) for v in row)})" for row in rows)
    return f"({', '.join(names)}) IN ({tuples})"


def _literal(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, datetime):
        return None  # time zones: the two databases read a timestamp literal differently
    if isinstance(value, date):
        return f"'{value.isoformat()}'"
    if isinstance(value, str) and "\\" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)
