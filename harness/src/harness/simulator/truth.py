"""The true final state of the simulated source, saved beside the topics it produced.

On disk (``Truth.save``)::

    <dir>/truth.json          key columns, topic and event counts per table, workload metadata
    <dir>/<table>.parquet     the live rows after every change, in primary-key order
    <dir>/<table>.history.parquet   every change in source order: ``_op``, ``_source_ts_ms`` and the
                              row it left (or removed), TOAST placeholders resolved

Parquet keeps the exact Arrow types the target tables must have (``int16``/``int32``/``int64``,
``decimal128(p,s)``, ``date32``, ``timestamp('us')`` for ``MicroTimestamp``,
``timestamp('us', tz='UTC')`` for ``ZonedTimestamp``, ``string``, ``bool``), so a verifier
compares like with like.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TRUTH_FILE = "truth.json"


@dataclass
class Truth:
    """What every target table must equal once the whole stream is applied.

    Args:
        tables: live rows per table name (``customers``, ``products``, ``orders``).
        key_columns: primary-key columns per table.
        topics: the topic each table's changes went to.
        counts: per table: ``reads`` (snapshot), ``creates``, ``updates``, ``deletes``,
            ``truncates``, ``tombstones``, ``toast_placeholders``, ``duplicates`` (records
            delivered twice), ``malformed`` (extra bad messages, also split as
            ``malformed_<kind>``) and ``records`` (everything appended to the topic).
        meta: how the workload was made (spec, value format, ...), for reports.
        history: every change per table in source order (``_op``, ``_source_ts_ms``, the row's
            columns in the target's types; a truncate's are null), for tables that keep every version.
    """

    tables: dict[str, pa.Table]
    key_columns: dict[str, tuple[str, ...]]
    topics: dict[str, str]
    counts: dict[str, dict[str, int]]
    meta: dict[str, Any] = field(default_factory=dict)
    history: dict[str, pa.Table] = field(default_factory=dict)

    def changes(self, table: str) -> int:
        """Row-change events (snapshot reads included) that a table's topic carries."""
        c = self.counts[table]
        return sum(c.get(k, 0) for k in ("reads", "creates", "updates", "deletes", "truncates"))

    def table_for_topic(self, topic: str) -> str:
        for table, name in self.topics.items():
            if name == topic:
                return table
        raise KeyError(f"no table is fed by topic {topic!r}")

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the Parquet files and ``truth.json`` into ``directory`` (created if needed)."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        for name, table in self.tables.items():
            pq.write_table(table, folder / f"{name}.parquet")
        for name, table in self.history.items():
            pq.write_table(table, folder / f"{name}.history.parquet")
        doc = {
            "tables": sorted(self.tables),
            "key_columns": {t: list(k) for t, k in self.key_columns.items()},
            "topics": self.topics,
            "counts": self.counts,
            "meta": self.meta,
        }
        tmp = folder / f".{TRUTH_FILE}.tmp"
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
        # Written last and renamed into place: a truth.json always has its Parquet files beside it.
        os.replace(tmp, folder / TRUTH_FILE)
        return folder

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Truth:
        """Read a truth written by :meth:`save`.

        Raises:
            FileNotFoundError: ``directory`` holds no ``truth.json`` or a table's Parquet file.
        """
        folder = Path(directory)
        doc = json.loads((folder / TRUTH_FILE).read_text())
        return cls(
            tables={name: pq.read_table(folder / f"{name}.parquet") for name in doc["tables"]},
            key_columns={t: tuple(k) for t, k in doc["key_columns"].items()},
            topics=dict(doc["topics"]),
            counts={t: dict(c) for t, c in doc["counts"].items()},
            meta=dict(doc.get("meta", {})),
            history={name: pq.read_table(folder / f"{name}.history.parquet") for name in doc["tables"]
                     if (folder / f"{name}.history.parquet").exists()},
        )
