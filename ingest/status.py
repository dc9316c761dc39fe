"""Per-table status: applied offsets, lag, Delta version, last batch."""

from __future__ import annotations

from dataclasses import dataclass

from ingest import audit
from ingest.batch import TablePaths
from ingest.config import IngestConfig
from ingest.merge import live_row_count
from ingest.tablestate import load_state
from ingest.topiclog import TopicLog


@dataclass(slots=True)
class TableStatus:
    table: str
    topic: str
    applied: dict[int, int | None]
    end: dict[int, int]
    delta_version: int | None
    rows: int
    last_batch: dict | None

    @property
    def lag(self) -> int:
        return sum(end - ((self.applied.get(p) or -1) + 1) for p, end in self.end.items())


def table_status(config: IngestConfig) -> list[TableStatus]:
    log = TopicLog(config.log_dir)
    out = []
    for spec in config.tables:
        paths = TablePaths.of(config, spec.name)
        state = load_state(paths.table)
        end = log.end_offsets(spec.topic) if log.exists(spec.topic) else {}
        applied = {p: state.applied_offset(spec.topic, p) for p in end}
        batches = audit.read(paths.audit, table=spec.name)
        last = None
        if batches.num_rows:
            last = max(batches.to_pylist(), key=lambda r: (r["delta_version"] or -1, r["finished_at"]))
        out.append(TableStatus(spec.name, spec.topic, applied, end, state.version, live_row_count(paths.table), last))
    return out
