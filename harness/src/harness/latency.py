"""Source-commit -> visible-in-Delta latency, read exactly from the rows and the Delta log.

For a row of a target table:

* the **source commit time** is ``_cdc_source_ts``: Debezium's ``source.ts_ms``, PostgreSQL's commit
  timestamp of the transaction that made the row's latest change (millisecond resolution);
* the **visible time** is the commit timestamp of the first Delta version that contained that
  change. Every engine commit records, in its commit info (``cdc.batch``, the audit record), the
  offsets it covers per topic-partition (``{"<topic>:<partition>": [first, last]}``); the row keeps
  the Kafka coordinates of its change (``_cdc_topic``, ``_cdc_partition``, ``_cdc_offset``), so the
  version is the one whose span holds that offset.

Both clocks are the same machine's here. For an insert-only or append-like table (``order_items``
under :mod:`harness.postgres.load`: rows are inserted, never updated) each live row measures its insert.

:func:`stages_of` splits each row's latency into where the time went, from the times its change
carries along the way (:data:`STAGES`):

* **capture**: Debezium's envelope ``ts_ms`` (when the connector processed the change) minus the
  source commit;
* **broker**: the Kafka record's timestamp minus the envelope's (Connect's queue and producer, and the
  broker's append when the topic keeps ``LogAppendTime``);
* **waiting**: the start of the micro-batch that read it minus the record's timestamp (the trigger's
  interval, or a batch still running);
* **decode**: the micro-batch's read and decode of its records (the audit's ``decode_ms``);
* **plan**: the table's journey before its MERGE (assemble, guards, reduce, gate, plan), from the
  audit's ``total_ms`` less ``decode_ms`` and ``apply_ms``;
* **apply + commit**: the rest, up to the Delta commit's timestamp: the MERGE, whose commit is part of
  the same call in both writers.

The stages add up to the row's latency exactly.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from ingest.commit.state import BATCH_KEY, cdc_commits
from ingest.lake.delta import open_table, read_all

_COLUMNS = ["_cdc_source_ts", "_cdc_topic", "_cdc_partition", "_cdc_offset"]


@dataclass
class CommitIndex:
    """For each topic-partition, the engine commits' offset spans in offset order, with their versions and times."""

    firsts: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    spans: dict[tuple[str, int], list[tuple[int, int, int, int]]] = field(default_factory=dict)
    #: each engine commit's time in ms, by version
    times: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_commits(cls, commits: Iterable[dict]) -> CommitIndex:
        """Build from commit-info dicts carrying ``version``, ``timestamp`` (ms) and ``cdc.batch``."""
        index = cls()
        raw: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
        for commit in commits:
            index.times[int(commit["version"])] = int(commit["timestamp"])
            batch = commit[BATCH_KEY]
            offsets = batch.get("offsets") or "{}"
            for name, (first, last) in (json.loads(offsets) if isinstance(offsets, str) else offsets).items():
                topic, _, partition = name.rpartition(":")
                raw.setdefault((topic, int(partition)), []).append(
                    (int(first), int(last), int(commit["version"]), int(commit["timestamp"])))
        for key, spans in raw.items():
            spans.sort(key=lambda s: (s[0], s[2]))
            index.spans[key] = spans
            index.firsts[key] = [s[0] for s in spans]
        return index

    @classmethod
    def of_table(cls, path: str | Path) -> CommitIndex:
        """The index of a Delta table's engine commits."""
        table = open_table(path)
        return cls.from_commits(cdc_commits(table) if table is not None else [])

    def visible(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """``(version, commit time in ms)`` of the first commit whose span holds the offset, else ``None``."""
        firsts = self.firsts.get((topic, partition))
        if not firsts:
            return None
        spans = self.spans[(topic, partition)]
        best: tuple[int, int] | None = None
        # Spans of one partition do not overlap (progress never moves backwards); the few spans that
        # start at or below the offset are checked in case a replay recorded an earlier one.
        start = bisect.bisect_right(firsts, offset) - 1
        for i in range(start, max(-1, start - 8), -1):
            first, last, version, ts = spans[i]
            if first <= offset <= last and (best is None or version < best[0]):
                best = (version, ts)
        return best


@dataclass
class Latencies:
    """Latencies in milliseconds of the rows whose source commit fell in the window."""

    values: list[float]
    unmatched: int = 0

    def percentile(self, p: float) -> float | None:
        """Nearest-rank percentile ``p`` (0-100] (``None`` without values)."""
        return nearest_rank(self.values, p / 100) if self.values else None


def nearest_rank(values: Sequence[float], share: float) -> float:
    """The nearest-rank quantile: the smallest value that at least ``share`` (0-1] of ``values`` do not
    exceed. The one percentile rule of the benchmarks and the latency report."""
    if not values:
        raise ValueError("no values to take a quantile of")
    ordered = sorted(values)
    rank = math.ceil(round(share * len(ordered), 9))  # 0.07 * 100 is 7.000000000000001 in floating point
    return ordered[min(len(ordered), max(1, rank)) - 1]


def checkpoint_versions(table: Path) -> set[int]:
    """The versions of a local Delta table that have a checkpoint (one file or several parts)."""
    return {int(part.name[:20]) for part in (table / "_delta_log").glob("*.checkpoint*.parquet")}


def compaction_times(path: str | Path) -> list[datetime]:
    """When each compaction of a Delta table was committed (delta-rs's and Spark's ``OPTIMIZE``; none:
    no table there)."""
    table = open_table(path)
    if table is None:
        return []
    return sorted(datetime.fromtimestamp(commit["timestamp"] / 1000, UTC) for commit in table.history()
                  if commit.get("operation") == "OPTIMIZE" and commit.get("timestamp") is not None)


def measured_rows(path: str | Path) -> pa.Table | None:
    """The columns of a table's rows that latencies are measured from (``None``: no table there)."""
    table = open_table(path)
    return read_all(table, columns=_COLUMNS) if table is not None else None


def latencies_of(rows: pa.Table, index: CommitIndex, *, since: datetime | None = None,
                 until: datetime | None = None) -> Latencies:
    """Latency of every row (columns ``_cdc_source_ts``, ``_cdc_topic``, ..., as :func:`measured_rows`
    reads them) whose ``_cdc_source_ts`` lies in ``[since, until)``, against ``index``."""
    out = Latencies([])
    for ts, topic, partition, offset in zip(*(rows[c].to_pylist() for c in _COLUMNS), strict=True):
        if ts is None or (since is not None and ts < since) or (until is not None and ts >= until):
            continue
        seen = index.visible(topic, partition, offset)
        if seen is None:
            out.unmatched += 1
            continue
        out.values.append(seen[1] - ts.timestamp() * 1000)
    return out


def summarize(values: Sequence[float], points: Sequence[float] = (50, 95, 99)) -> dict[float, float | None]:
    """Nearest-rank percentiles of ``values``."""
    lat = Latencies(list(values))
    return {p: lat.percentile(p) for p in points}


#: Where a row's latency goes, in the order its change passes (see the module docstring).
STAGES = ("capture", "broker", "waiting", "decode", "plan", "apply + commit")


def _ms(value: datetime | str | None) -> float | None:
    if value is None:
        return None
    return (datetime.fromisoformat(value) if isinstance(value, str) else value).timestamp() * 1000


def stages_of(rows: pa.Table, index: CommitIndex, arrivals: Mapping[tuple[str, int, int], tuple[int, int]],
              batches: Mapping[int, Mapping], *, since: datetime | None = None,
              until: datetime | None = None) -> dict[str, list[float]]:
    """Each row's latency split into :data:`STAGES` (ms), for the rows :func:`latencies_of` measures.

    Args:
        rows: the rows (columns ``_cdc_source_ts``, ``_cdc_topic``, ``_cdc_partition``, ``_cdc_offset``).
        index: the table's commits.
        arrivals: ``(topic, partition, offset) -> (envelope ts_ms, Kafka record timestamp ms)`` of the
            rows' records, read from the topic.
        batches: the table's audit rows by Delta version (the audit table's: the copy in a commit's
            info is written before the batch's times are known). A row without an arrival, or whose
            commit has no audit row with a start time, is left out.
        since, until: the window of source commit times, as :func:`latencies_of`.
    """
    out: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for ts, topic, partition, offset in zip(*(rows[c].to_pylist() for c in _COLUMNS), strict=True):
        if ts is None or (since is not None and ts < since) or (until is not None and ts >= until):
            continue
        seen, arrived = index.visible(topic, partition, offset), arrivals.get((topic, partition, offset))
        batch = batches.get(seen[0]) if seen is not None else None
        started = _ms(batch.get("started_at")) if batch else None
        if seen is None or arrived is None or batch is None or started is None:
            continue
        envelope, appended = arrived
        decode = float(batch.get("decode_ms") or 0)
        plan = float((batch.get("total_ms") or 0) - decode - (batch.get("apply_ms") or 0))
        source = ts.timestamp() * 1000
        for stage, value in zip(STAGES, (envelope - source, appended - envelope, started - decode - appended,
                                         decode, plan, seen[1] - started - plan), strict=True):
            out[stage].append(value)
    return out
