"""A continuous run whose query could not start because the source, registry or lake did not answer
starts it again until they answer (a broker restarting while the run starts); other start failures
are tried a few times, as before. Seen under ``ingest torture --stack``: a run started during a
broker restart exited with code 4 ("table failed") instead of riding the restart out."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from ingest.errors import unavailability_in
from ingest.stream import queries
from ingest.stream.queries import StreamingRun, _Query
from ingest.stream.report import RunReport, TableRun

#: What Spark's exception says when the Python source runner raised (shortened from a real one).
UNAVAILABLE = "\n".join((
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR]"
    " Failed when Python streaming data source perform initialOffset: Traceback (most recent call last):",
    '  File "/x/ingest/source/kafka_admin.py", line 203, in _offsets',
    "    raise SourceUnavailableError(secrets.redact(",
    "ingest.errors.SourceUnavailableError: Kafka at 127.0.0.1:9092 did not answer for topic 'shop.public.orders': "
    "Connection refused", ""))
BROKEN = UNAVAILABLE.replace("ingest.errors.SourceUnavailableError", "KeyError")


@dataclass
class FakeQuery:
    failure: str | None = None
    isActive: bool = False
    stopped: bool = False
    status: dict[str, str] = field(default_factory=lambda: {"message": "Waiting for data"})

    def exception(self) -> str | None:
        return self.failure

    def stop(self) -> None:
        self.isActive, self.stopped = False, True

    def awaitTermination(self) -> None:
        if self.failure and not self.stopped:
            raise RuntimeError(self.failure)


class FakeHandler:
    error = None
    batches = 0

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run(monkeypatch: pytest.MonkeyPatch, starts: list[FakeQuery]) -> tuple[StreamingRun, _Query, list[FakeQuery]]:
    """A streaming run whose first query failed, and whose later starts return ``starts`` in turn."""
    monkeypatch.setattr(queries, "_UNAVAILABLE_WAIT", 0.01)
    monkeypatch.setattr(queries.checkpoints, "discard", lambda _directory: None)
    run = StreamingRun(SimpleNamespace(_stop=threading.Event()))  # type: ignore[arg-type]
    started: list[FakeQuery] = []

    def start(_q: Any, _mode: Any, _run_id: Any) -> FakeQuery:
        query = starts[len(started)]
        started.append(query)
        return query

    monkeypatch.setattr(run, "_start_query", start)
    monkeypatch.setattr(queries.time, "sleep", lambda _s: None)  # the loop's pause between looks
    q = _Query("q", [], None, FakeHandler(), None, FakeQuery(UNAVAILABLE))  # type: ignore[arg-type]
    return run, q, started


def test_the_line_that_says_what_did_not_answer_is_found_in_sparks_text() -> None:
    assert unavailability_in(UNAVAILABLE) == ("SourceUnavailableError: Kafka at 127.0.0.1:9092 did not answer for "
                                              "topic 'shop.public.orders': Connection refused")
    assert unavailability_in(BROKEN) is None


def test_a_continuous_query_is_started_again_until_the_source_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    failing = [FakeQuery(UNAVAILABLE) for _ in range(6)]  # more than the three tries of other failures
    run, q, started = _run(monkeypatch, [*failing, FakeQuery(isActive=True)])
    for _ in range(7):
        run._restart_failed(q, "continuous", "r")
    assert len(started) == 7 and q.query is started[-1]


@pytest.mark.parametrize(("mode", "failure"), [("continuous", BROKEN), ("available_now", UNAVAILABLE)])
def test_other_failures_and_runs_that_end_get_three_tries(monkeypatch: pytest.MonkeyPatch, mode: Any,
                                                         failure: str) -> None:
    run, q, started = _run(monkeypatch, [FakeQuery(failure) for _ in range(5)])
    q.query = FakeQuery(failure)
    assert [run._restart_failed(q, mode, "r") for _ in range(5)] == [True, True, True, False, False]
    assert len(started) == 3


def test_a_run_of_one_query_waits_for_it_instead_of_ending(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's only query failed: the run must try it again, not end because no query is active."""
    healthy = FakeQuery(isActive=True)
    run, q, started = _run(monkeypatch, [FakeQuery(UNAVAILABLE), healthy])
    report = RunReport("r", {})
    run._await([q], report, "continuous", stop_after=0.3, run_id="r")
    assert len(started) == 2 and started[1] is healthy and healthy.stopped
    assert not report.failed


def test_a_query_that_never_starts_is_reported_unavailable_with_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    run, q, _ = _run(monkeypatch, [])
    q.restarts = 99  # no more tries
    q.specs = [SimpleNamespace(name="orders")]  # type: ignore[list-item]
    report = RunReport("r", {"orders": TableRun("orders")})
    run._await([q], report, "available_now", stop_after=None, run_id="r")
    table = report.tables["orders"]
    assert table.unavailable and (table.error or "").startswith("SourceUnavailableError: Kafka at 127.0.0.1:9092")
