"""bench_kafka_read reads every batch in every mode, taking turns, and refuses a read that is not whole."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_kafka_read

from ingest.config import KafkaSpec


class _Log:
    """A log holding every offset except ``missing``; it notes which consumer read what."""

    made: ClassVar[list[_Log]] = []
    order: ClassVar[list[_Log]] = []  # the log of every read, in turn
    missing: int | None = None

    def __init__(self, spec: KafkaSpec, secrets_file: str | None = None, *, keep_open: bool = False) -> None:
        self.keep_open, self.reads, self.closed = keep_open, [], False
        _Log.made.append(self)

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        self.reads.append((topic, start, end))
        _Log.order.append(self)
        return pa.table({"offset": [o for o in range(start, end) if o != _Log.missing]})

    def close(self) -> None:
        self.closed = True


def test_each_batch_is_read_in_every_mode_taking_turns_and_each_kept_log_is_one(monkeypatch: Any) -> None:
    monkeypatch.setattr(bench_kafka_read, "KafkaLog", _Log)
    _Log.made, _Log.missing, _Log.order = [], None, []
    written: list[Any] = []
    with Progress(transient=True, disable=True) as progress:
        reads = bench_kafka_read.measure(KafkaSpec(bootstrap_servers="b:1"), ["a", "b"],
                                         lambda topics, records: written.append((topics, records)), 3, 5, 0, progress)
    assert list(reads) == list(bench_kafka_read.MODES)
    for ranges, batches in reads.values():
        assert len(ranges) == 6 and len(batches) == 3 and all(t >= 0 for t in ranges)
    kept = [log for log in _Log.made if log.keep_open]
    assert len(kept) == 2 and all(log.closed for log in kept)
    assert [getattr(log, "kept_settings", None) for log in kept] == [None, {}]  # the second without its own
    for log in kept:
        assert log.reads == [(t, b * 5, b * 5 + 5) for b in range(3) for t in ("a", "b")]
    assert len([log for log in _Log.made if not log.keep_open]) == 3  # one per batch, none kept
    # Which mode reads first rotates: opened, kept, plain; then kept, plain, opened; then plain, ...
    kinds = [_kind(log) for log in _Log.order]
    assert kinds == ["opened"] * 2 + ["kept"] * 2 + ["plain"] * 2 + ["kept"] * 2 + ["plain"] * 2 + ["opened"] * 2 \
        + ["plain"] * 2 + ["opened"] * 2 + ["kept"] * 2
    assert written == [(["a", "b"], 5)] * 3  # each batch's records written before they are read


def test_behind_writes_the_records_past_every_range_first_and_reads_the_same_ranges(monkeypatch: Any) -> None:
    monkeypatch.setattr(bench_kafka_read, "KafkaLog", _Log)
    _Log.made, _Log.missing, _Log.order = [], None, []
    events: list[Any] = []
    monkeypatch.setattr(_Log, "read", _noting(_Log.read, events))
    with Progress(transient=True, disable=True) as progress:
        bench_kafka_read.measure(KafkaSpec(bootstrap_servers="b:1"), ["a"],
                                 lambda topics, records: events.append(("write", records)), 2, 5, 0, progress,
                                 behind=40)
    writes = [e for e in events if e[0] == "write"]
    assert writes == [("write", 40), ("write", 5), ("write", 5)]
    # every read ends 40 records before what was written by then: the log runs ahead of each range
    written = 0
    for event in events:
        if event[0] == "write":
            written += event[1]
        else:
            assert event[1] + 40 <= written, event
    assert [e[1] for e in events if e[0] == "read"] == [5] * 3 + [10] * 3


def _noting(read: Any, events: list[Any]) -> Any:
    def noted(self: _Log, topic: str, partition: int, start: int, end: int) -> pa.Table:
        events.append(("read", end))
        return read(self, topic, partition, start, end)
    return noted


def _kind(log: _Log) -> str:
    return "opened" if not log.keep_open else "plain" if hasattr(log, "kept_settings") else "kept"


def test_a_read_that_is_not_whole_stops_the_benchmark(monkeypatch: Any) -> None:
    monkeypatch.setattr(bench_kafka_read, "KafkaLog", _Log)
    _Log.made, _Log.missing = [], 7
    with Progress(transient=True, disable=True) as progress, pytest.raises(SystemExit, match="not whole"):
        bench_kafka_read.measure(KafkaSpec(bootstrap_servers="b:1"), ["a"], lambda *_: None, 3, 5, 0, progress)
    assert all(log.closed for log in _Log.made if log.keep_open)
