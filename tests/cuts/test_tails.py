"""The tail a batch leaves out is read again with the next one; if it cannot be, its table stops.

Driven through the callback's alignment step directly (no Spark: the embedded log decodes as it
reads), with the bank's records read from the log in ranges, as micro-batches would bring them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.cuts.publish import Publisher
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.errors import SourceUnavailableError
from ingest.source.topiclog import TopicLog
from ingest.stream.callback import ForEachBatch
from ingest.stream.report import RunReport, TableRun
from tests.cuts import bank


def _batch(config: Any, ranges: dict[str, tuple[int, int]]) -> list[Any]:
    log = TopicLog(config.log_dir)
    decoder = BatchDecoder(DecoderSpec("json"))
    return [p for topic, (lo, hi) in ranges.items() for p in decoder.decode(log.read(topic, 0, lo, hi))]


def _offsets(parts: list[Any], topic: str) -> list[int]:
    return sorted(o for p in parts if p.num_rows and p["_cdc_topic"][0].as_py() == topic
                  for o in p["_cdc_offset"].to_pylist())


@pytest.fixture
def handler(tmp_path: Path) -> Iterator[ForEachBatch]:
    """The callback a run builds, closed as a run closes it: the audit rows still waiting for their
    interval are appended then, not by a timer during whichever test runs next."""
    config = bank.config(tmp_path / "bank", per_table=None)
    source = bank.Bank()
    for _ in range(3):
        source.transfer()
    source.produce(TopicLog(config.log_dir))
    specs = list(config.tables)
    report = RunReport("test", {s.name: TableRun(s.name) for s in specs})
    handler = ForEachBatch(config, specs, report, "test", None, {}, cuts=Publisher(config, "test"))
    yield handler
    handler.close()


def test_a_tail_is_left_out_and_read_again_with_the_next_batch(handler: ForEachBatch):
    specs = list(handler.config.tables)
    # ledger has all three transfers (6 changes); accounts only the first one and a half (3 of 6)
    first = handler._aligned(specs, None, _batch(handler.config, {bank.ACCOUNTS: (0, 3), bank.LEDGER: (0, 6)}))
    assert _offsets(first, bank.ACCOUNTS) == [0, 1] and _offsets(first, bank.LEDGER) == [0, 1]
    handler._apply_all(specs, None, first, 0, 0)
    assert handler.report.cuts is not None and handler.report.cuts.published == 1
    # the next batch brings the rest of accounts only: both tails (accounts 2, ledger 2..5) are read again
    second = handler._aligned(specs, None, _batch(handler.config, {bank.ACCOUNTS: (3, 6)}))
    assert _offsets(second, bank.ACCOUNTS) == [2, 3, 4, 5] and _offsets(second, bank.LEDGER) == [2, 3, 4, 5]
    handler._apply_all(specs, None, second, 1, 0)
    assert handler.report.cuts is not None and handler.report.cuts.latest is not None
    assert handler.report.cuts.latest.txn.startswith("602:")  # the third transfer: everything, at one cut


def test_a_tail_that_cannot_be_read_again_stops_its_table_only(handler: ForEachBatch, monkeypatch: Any):
    specs = list(handler.config.tables)
    first = handler._aligned(specs, None, _batch(handler.config, {bank.ACCOUNTS: (0, 2), bank.LEDGER: (0, 6)}))
    handler._apply_all(specs, None, first, 0, 0)
    assert handler.read.source is not None

    def away(*_args: Any) -> Any:
        raise SourceUnavailableError("Kafka at b:9092 did not answer")

    monkeypatch.setattr(handler.read.source, "read_arrow", away)
    parts = handler._aligned(specs, None, _batch(handler.config, {bank.ACCOUNTS: (2, 6)}))
    # ledger cannot have its tail back: it stops rather than skip it, and accounts goes on
    assert "ledger" in handler.stops and "did not answer" in (handler.report.tables["ledger"].error or "")
    assert _offsets(parts, bank.LEDGER) == [] and _offsets(parts, bank.ACCOUNTS) == [2, 3, 4, 5]
