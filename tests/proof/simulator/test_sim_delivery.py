"""TopicWriter: partitioning, redelivery and cross-partition skew, on a recording fake log."""

from __future__ import annotations

import random
from collections.abc import Sequence

from harness.simulator.delivery import TopicWriter

from ingest.source.topiclog import ProducerRecord, partition_for_key


class RecordingLog:
    def __init__(self) -> None:
        self.appends: list[list[ProducerRecord]] = []

    def append(self, topic: str, records: Sequence[ProducerRecord]) -> dict[int, tuple[int, int]]:
        self.appends.append(list(records))
        return {}


def _run(
    n: int, *, dup: float, reorder: float, window: int = 100, seed: int = 1
) -> tuple[RecordingLog, TopicWriter]:
    log = RecordingLog()
    writer = TopicWriter(
        log,
        "t",
        3,
        random.Random(seed),
        duplicate_fraction=dup,
        reorder_fraction=reorder,
        window=window,
    )
    for i in range(n):
        writer.send(f"k{i % 50}".encode(), f"v{i}".encode(), i)
    writer.close()
    return log, writer


def _per_partition(log: RecordingLog) -> dict[int, list[bytes | None]]:
    out: dict[int, list[bytes | None]] = {}
    for batch in log.appends:
        for rec in batch:
            out.setdefault(rec.partition, []).append(rec.value)
    return out


def test_every_record_once_in_source_order_without_faults() -> None:
    log, writer = _run(1000, dup=0.0, reorder=0.0)
    assert writer.records == 1000 and writer.duplicates == 0
    assert all(len(batch) == 100 for batch in log.appends)  # one append per window, never per record
    for p, values in _per_partition(log).items():
        expected = [f"v{i}".encode() for i in range(1000) if partition_for_key(f"k{i % 50}".encode(), 3) == p]
        assert values == expected


def test_duplicates_are_later_copies_in_the_same_partition() -> None:
    log, writer = _run(3000, dup=0.1, reorder=0.0)
    assert writer.duplicates > 200 and writer.records == 3000 + writer.duplicates
    copies, far = 0, 0
    for values in _per_partition(log).values():
        first_at: dict[bytes | None, int] = {}
        for i, v in enumerate(values):
            if v in first_at:
                copies += 1
                far += i - first_at[v] > 200
            else:
                first_at[v] = i
        firsts = list(first_at)
        assert firsts == sorted(firsts, key=lambda v: int((v or b"v0")[1:]))  # originals keep their order
    assert copies == writer.duplicates and far > 0


def test_reorder_holds_partitions_back_but_keeps_their_order() -> None:
    calm, _ = _run(3000, dup=0.0, reorder=0.0)
    skewed, _ = _run(3000, dup=0.0, reorder=0.5)
    assert _per_partition(calm) == _per_partition(skewed)  # same per-partition sequences
    missing = sum(len({r.partition for r in batch}) < 3 for batch in skewed.appends)
    assert missing > 0
    assert all(len({r.partition for r in batch}) == 3 for batch in calm.appends)
    assert max(len(b) for b in skewed.appends) > 150  # a released partition arrives as a burst


def test_keyless_records_go_to_partition_zero() -> None:
    log = RecordingLog()
    writer = TopicWriter(log, "t", 3, random.Random(0), duplicate_fraction=0, reorder_fraction=0)
    assert writer.send(None, b"truncate", 1) == 0
    writer.close()
    assert log.appends == [[ProducerRecord(0, None, b"truncate", 1)]]
