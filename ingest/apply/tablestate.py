"""What a target table's Delta log says: user columns, primary key, applied offsets, truncate mark.

Progress lives in the table (DESIGN 3.5): every CDC commit carries one Delta app transaction per
topic-partition (``cdc:<topic>:<partition>`` -> last applied offset) and, in its commit info,
``cdc.state`` (primary key and latest truncate position, carried forward) and ``cdc.batch`` (the audit record).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from ingest.deltaio import FRAMEWORK_NAMES, delta_type_name, open_table, table_schema
from ingest.events import ColumnSpec

STATE_KEY = "cdc.state"
BATCH_KEY = "cdc.batch"
#: How ``_cdc_position`` is encoded (:meth:`ingest.events.SourcePosition.encode`). 1: fixed-width
#: hex of three 64-bit components; 2: variable-width components with Kafka fallback positions apart.
POSITION_FORMAT = 2
_HISTORY_PAGE = 50


def app_id(topic: str, partition: int) -> str:
    """Delta app-transaction id that records progress for one topic-partition."""
    return f"cdc:{topic}:{partition}"


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

    @property
    def version(self) -> int | None:
        return self.table.version() if self.table is not None else None

    def applied_offset(self, topic: str, partition: int) -> int | None:
        """Last offset of ``topic``/``partition`` applied to this table, from its app transactions."""
        if self.table is None:
            return None
        return self.table.transaction_version(app_id(topic, partition))


def load_state(path: str | Path) -> TableState:
    table = open_table(path)
    if table is None:
        return TableState(None, None, None, None)
    schema = table_schema(table)
    columns = [
        ColumnSpec(f.name, delta_type_name(f.type), True) for f in schema if f.name not in FRAMEWORK_NAMES
    ]
    latest = latest_cdc_commit(table)
    state = latest.get(STATE_KEY, {}) if latest else {}
    key = tuple(state["primary_key"]) if state.get("primary_key") else None
    return TableState(table, columns, key, state.get("truncate_position"), state.get("position_format"),
                      state.get("flattened"))


def latest_cdc_commit(table: DeltaTable) -> dict[str, Any] | None:
    """Commit info of the newest commit written by the engine (maintenance commits are skipped)."""
    limit = _HISTORY_PAGE
    while True:
        history = table.history(limit)
        for commit in history:
            if STATE_KEY in commit:
                return _decoded(commit)
        if len(history) < limit:
            return None
        limit *= 4


def cdc_commits(table: DeltaTable, *, since_version: int = -1) -> list[dict[str, Any]]:
    """Engine commits newer than ``since_version``, oldest first."""
    out = [_decoded(c) for c in table.history() if BATCH_KEY in c and c.get("version", -1) > since_version]
    return sorted(out, key=lambda c: c["version"])


def _decoded(commit: dict[str, Any]) -> dict[str, Any]:
    out = dict(commit)
    for key in (STATE_KEY, BATCH_KEY):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out
