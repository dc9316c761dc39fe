"""The published cuts: a Delta table beside the audit, one row per cut, newest in the latest commit.

Each append's commit info also carries its cut (``cdc.cut``), so the latest cut is one commit's
info, however many cuts the table holds. A cut is appended only if its transaction comes after
the latest one's in the transaction topic: publishing again after a crash or a replay adds nothing.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties

from ingest.lake.delta import empty, open_table, read_all, write_table
from ingest.lake.location import LakePath
from ingest.model import SourceMark

CUT_KEY = "cdc.cut"
_TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([
    ("cut", pa.int64()),  # 1, 2, ... in publication order
    ("txn", pa.string()),  # the source transaction at whose end the cut is
    ("txn_partition", pa.int32()),  # its END record in the transaction topic
    ("txn_offset", pa.int64()),
    ("commit_ts", _TS),  # the END record's time
    ("position", pa.string()),  # source position of the newest change the cut holds
    ("versions", pa.string()),  # JSON {table: Delta version, or null: no commit yet}
    ("marks", pa.string()),  # JSON {table: its mark at that version}
    ("quarantined", pa.string()),  # JSON {table: changes quarantined since the previous cut}
    ("published_at", _TS),
    ("run_id", pa.string()),
])
_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class Cut:
    """One published cut (a row of the cuts table)."""

    cut: int
    txn: str
    txn_partition: int
    txn_offset: int
    commit_ts: datetime | None
    position: str | None
    versions: dict[str, int | None]
    marks: dict[str, SourceMark] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    published_at: datetime | None = None
    run_id: str = ""

    def row(self) -> dict[str, Any]:
        return {"cut": self.cut, "txn": self.txn, "txn_partition": self.txn_partition, "txn_offset": self.txn_offset,
                "commit_ts": self.commit_ts, "position": self.position, "versions": json.dumps(self.versions),
                "marks": json.dumps({t: m.to_json() for t, m in self.marks.items()}),
                "quarantined": json.dumps(self.quarantined), "published_at": self.published_at,
                "run_id": self.run_id}

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> Cut:
        return cls(int(row["cut"]), row["txn"], int(row["txn_partition"]), int(row["txn_offset"]),
                   _utc(row.get("commit_ts")), row.get("position"), json.loads(row["versions"]),
                   {t: SourceMark.from_json(m) for t, m in json.loads(row.get("marks") or "{}").items()},
                   json.loads(row.get("quarantined") or "{}"), _utc(row.get("published_at")), row.get("run_id") or "")


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def latest(path: LakePath) -> Cut | None:
    """The newest published cut (from the cuts table's latest commit), ``None`` if none yet."""
    table = open_table(path)
    if table is None:
        return None
    for commit in table.history(8):  # newest first; maintenance commits carry no cut
        raw = commit.get(CUT_KEY)
        if isinstance(raw, str):
            return Cut.of_row(json.loads(raw))
    cuts = every(path)
    return cuts[-1] if cuts else None


def every(path: LakePath) -> list[Cut]:
    """Every published cut, oldest first."""
    table = open_table(path)
    rows = read_all(table) if table is not None else empty(SCHEMA)
    return sorted((Cut.of_row(r) for r in rows.to_pylist()), key=lambda c: c.cut)


def append(path: LakePath, cut: Cut) -> bool:
    """Publish ``cut`` unless the latest cut is at or after its transaction; whether it was appended."""
    with _LOCK:
        newest = latest(path)
        if newest is not None and (newest.txn_partition, newest.txn_offset) >= (cut.txn_partition, cut.txn_offset):
            return False
        row = cut.row()
        info = {**row, "commit_ts": _iso(cut.commit_ts), "published_at": _iso(cut.published_at)}
        write_table(path, pa.Table.from_pylist([row], schema=SCHEMA), mode="append",
                    commit_properties=CommitProperties(custom_metadata={CUT_KEY: json.dumps(info)}))
        return True


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
