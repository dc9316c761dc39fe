"""A consumer group the broker cannot take offsets for never holds a table (issue 46, point 3).

The real broker's side is tests/stack/test_consumer_group.py."""

from __future__ import annotations

import logging
import time
from typing import Any

from ingest.config import KafkaSpec
from ingest.source.consumer_group import GroupCommitter


def test_a_broker_that_does_not_answer_costs_a_batch_nothing(caplog: Any) -> None:
    committer = GroupCommitter(KafkaSpec(bootstrap_servers="127.0.0.1:1"), "cdc-lakehouse")
    started = time.monotonic()
    committer.commit("notes", "app.notes", {0: 41, 1: 7})
    committer.commit("notes", "app.notes", {0: 42})
    assert time.monotonic() - started < 2  # a synchronous consumer commit waits 45 s for a coordinator
    with caplog.at_level(logging.WARNING, logger="ingest.source.consumer_group"):
        committer.close(wait=0.5)
    assert time.monotonic() - started < 5
    assert any("2 commit(s) to consumer group 'cdc-lakehouse' unanswered" in r.getMessage() for r in caplog.records)
