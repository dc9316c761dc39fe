"""The quarantine table's insert-once MERGE: one row per message and stage, whatever is written again."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from ingest.records import quarantine
from ingest.records.quarantine import QuarantineRecord

AT = datetime(2026, 1, 1, tzinfo=UTC)


def held(topic: str, offset: int, *, partition: int = 0, stage: str = "decode") -> QuarantineRecord:
    return QuarantineRecord("orders", topic, partition, offset, None, b"k", b"v", stage, "bad", 0, "r", AT)


def test_the_same_message_is_held_once_and_its_neighbours_are_not_confused(tmp_path: Path) -> None:
    path = tmp_path / "_cdc_quarantine"
    assert quarantine.write(path, [held("a", 5), held("a", 900)]) == 2
    # Written again with others: only the new ones count, across a wide offset range and topics,
    # including a quote-laden topic name and the same offset in another topic, partition or stage.
    again = [held("a", 5), held("a", 900), held("b", 5), held("a", 5, partition=1), held("a", 5, stage="quality"),
             held("o'x", 5), held("a", 10_000)]
    assert quarantine.write(path, again) == 5
    assert quarantine.write(path, again) == 0
    rows = quarantine.read(path).to_pylist()
    ids = sorted((r["topic"], r["partition"], r["offset"], r["stage"]) for r in rows)
    assert ids == sorted({(r.topic, r.partition, r.offset, r.stage) for r in again})
