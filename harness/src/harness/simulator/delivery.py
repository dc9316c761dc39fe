"""How one topic's records reach the embedded topic log: partitioning, redelivery and skew.

A :class:`TopicWriter` receives records in source order (Debezium's commit order) and delivers
them the way a Kafka Connect producer would, plus the faults a consumer must survive:

* **Partitioning.** Keyed records go to ``partition_for_key(key, N)`` (Kafka's default
  partitioner); keyless records (truncate) go to partition 0. All changes of one key therefore
  stay in one partition, in source order.
* **At-least-once redelivery.** Each record is, with probability ``duplicate_fraction``,
  delivered a second time, byte for byte, into the same partition at a later offset: usually a
  few records later, sometimes thousands later (as after a connector restart that replays from
  an old committed offset), and at the very end if the stream runs out first.
* **Cross-partition skew** (``reorder_fraction``). Records are appended in windows of
  ``window`` records (one :meth:`TopicLog.append` per window, never one per record). Within a
  window every partition normally advances together. With probability ``reorder_fraction`` a
  partition is instead *held back* for one to three further windows and then released in one
  go, so a reader that consumes what is visible sees that partition lag far behind the others
  (and the others run ahead of it). Per-partition order is never changed: the same key cannot be
  reordered under key partitioning, so skew between partitions is the only reordering Kafka can
  really show, and this makes it large and uneven on purpose.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from ingest.source.topiclog import ProducerRecord, partition_for_key

#: Records per append; several thousand keeps segment files large and appends cheap.
DEFAULT_WINDOW = 4096
_NEAR_GAP = (1, 200)  # typical redelivery distance (records) ...
_FAR_GAP = (200, 20_000)  # ... and the restart-from-old-offset kind
_FAR_SHARE = 0.3
_MAX_HOLD_WINDOWS = 3


class RecordSink(Protocol):
    """Where records go: :class:`ingest.source.topiclog.TopicLog` or anything with its ``append``."""

    def append(self, topic: str, records: Sequence[ProducerRecord]) -> dict[int, tuple[int, int]]: ...


class TopicWriter:
    """Partitions, duplicates and appends the records of one topic.

    Args:
        log: the embedded topic log (the topic must exist).
        topic: topic name.
        partitions: the topic's partition count.
        rng: randomness for duplicates and skew (the writer's own, so delivery choices never
            change what the workload generates).
        duplicate_fraction: share of records delivered twice.
        reorder_fraction: per window and partition, the chance to hold that partition back.
        window: records per append.
    """

    def __init__(
        self,
        log: RecordSink,
        topic: str,
        partitions: int,
        rng: random.Random,
        *,
        duplicate_fraction: float,
        reorder_fraction: float,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self._log = log
        self.topic = topic
        self._partitions = partitions
        self._rng = rng
        self._dup = duplicate_fraction
        self._reorder = reorder_fraction
        self._window_size = window
        self._window: list[ProducerRecord] = []
        self._pending: dict[int, list[ProducerRecord]] = defaultdict(list)
        self._held: list[list[ProducerRecord]] = [[] for _ in range(partitions)]
        self._hold: list[int] = [0] * partitions
        self._partition_of: dict[bytes, int] = {}
        self._sent = 0
        self.records = 0
        self.duplicates = 0
        self.appends = 0

    def partition(self, key: bytes | None) -> int:
        """The partition a record with this key lands in."""
        if key is None:
            return 0
        p = self._partition_of.get(key)
        if p is None:
            p = self._partition_of[key] = partition_for_key(key, self._partitions)
        return p

    def send(
        self, key: bytes | None, value: bytes | None, timestamp_ms: int, *, may_duplicate: bool = True
    ) -> int:
        """Deliver one record (in source order); returns its partition."""
        record = ProducerRecord(self.partition(key), key, value, timestamp_ms)
        self._add(record)
        if may_duplicate and self._dup and self._rng.random() < self._dup:
            lo, hi = _FAR_GAP if self._rng.random() < _FAR_SHARE else _NEAR_GAP
            self._pending[self._sent + self._rng.randint(lo, hi)].append(record)
            self.duplicates += 1
        due = self._pending.pop(self._sent, None)
        if due:
            for dup in due:
                self._add(dup)
        return record.partition

    def _add(self, record: ProducerRecord) -> None:
        self._window.append(record)
        self._sent += 1
        self.records += 1
        if len(self._window) >= self._window_size:
            self._flush_window()

    def _flush_window(self, *, final: bool = False) -> None:
        by_partition: list[list[ProducerRecord]] = [[] for _ in range(self._partitions)]
        for rec in self._window:
            by_partition[rec.partition].append(rec)
        self._window = []
        out: list[ProducerRecord] = []
        for p, recs in enumerate(by_partition):
            if not final:
                if self._hold[p] > 0:
                    self._hold[p] -= 1
                    self._held[p].extend(recs)
                    continue
                if recs and self._reorder and self._rng.random() < self._reorder:
                    self._hold[p] = self._rng.randint(0, _MAX_HOLD_WINDOWS - 1)
                    self._held[p].extend(recs)
                    continue
            out.extend(self._held[p])
            out.extend(recs)
            self._held[p] = []
            self._hold[p] = 0
        if out:
            self._log.append(self.topic, out)
            self.appends += 1

    def close(self) -> None:
        """Deliver redeliveries still due, release held partitions and append the rest."""
        for target in sorted(self._pending):
            for dup in self._pending[target]:
                self._window.append(dup)
                self.records += 1
        self._pending.clear()
        self._flush_window(final=True)
