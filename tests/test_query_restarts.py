"""A continuous run whose query failed because the source, registry or lake did not answer (a broker
restarting) starts it again until they answer: before its first batch without its checkpoint, after
batches from it. Other start failures are tried a few times, as before. Seen under ``ingest torture
--stack``: runs ended with code 4 ("table failed") during broker restarts, at a query's
initialOffset and at its latestOffset."""

from __future__ import annotations

import os
import signal
import threading
import time
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
    settled = 0
    passed = False

    def take_no_more(self) -> None:
        pass

    def settle(self) -> None:
        self.settled += 1

    def close(self) -> None:
        pass


#: the checkpoints a restart discarded
discarded: list[Any] = []


def _run(monkeypatch: pytest.MonkeyPatch, starts: list[FakeQuery]) -> tuple[StreamingRun, _Query, list[FakeQuery]]:
    """A streaming run whose first query failed, and whose later starts return ``starts`` in turn."""
    discarded.clear()
    monkeypatch.setattr(queries, "_UNAVAILABLE_WAIT", 0.01)
    monkeypatch.setattr(queries.checkpoints, "discard", lambda _directory: discarded.append(_directory))
    # The pauses (between restarts, between the loop's looks) end at a stop request: none is made.
    run = StreamingRun(SimpleNamespace(pause=lambda _s: False, stopping=False, stop=lambda: None,  # type: ignore[arg-type]
                                       metrics=None))
    started: list[FakeQuery] = []

    def start(_q: Any, _mode: Any, _run_id: Any) -> FakeQuery:
        query = starts[len(started)]
        started.append(query)
        return query

    monkeypatch.setattr(run, "_start_query", start)
    q = _Query("q", [], "checkpoint", FakeHandler(), None, FakeQuery(UNAVAILABLE))  # type: ignore[arg-type]
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
    assert len(discarded) == 7  # nothing committed: from the Delta logs' offsets


def test_after_batches_it_resumes_from_its_checkpoint_once_the_last_batch_is_done(
        monkeypatch: pytest.MonkeyPatch) -> None:
    run, q, started = _run(monkeypatch, [FakeQuery(UNAVAILABLE) for _ in range(4)] + [FakeQuery(isActive=True)])
    q.handler.batches = 12
    assert all(run._restart_failed(q, "continuous", "r") for _ in range(5))
    assert len(started) == 5 and discarded == [] and q.handler.settled == 5  # type: ignore[attr-defined]
    q.handler.batches, q.query = 13, FakeQuery(UNAVAILABLE)  # it ran again, then a new outage
    monkeypatch.setattr(run, "_start_query", lambda *_a: FakeQuery(isActive=True))
    assert run._restart_failed(q, "continuous", "r") and q.restarts == 1


@pytest.mark.parametrize("mode", ["continuous", "available_now"])
def test_after_batches_a_failure_of_its_own_is_not_retried(monkeypatch: pytest.MonkeyPatch, mode: Any) -> None:
    run, q, started = _run(monkeypatch, [FakeQuery(isActive=True)])
    q.handler.batches = 3
    q.query = FakeQuery(BROKEN if mode == "continuous" else UNAVAILABLE)
    assert not run._restart_failed(q, mode, "r") and started == []


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


def test_a_query_whose_batch_failed_is_not_started_again_and_the_log_says_why(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    run, q, started = _run(monkeypatch, [FakeQuery(isActive=True)])
    q.handler.error = RuntimeError("the audit append failed")  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger="ingest.stream.queries"):
        assert not run._restart_failed(q, "continuous", "r") and started == []
    assert [m for m in caplog.messages if "not started again" in m and "the audit append failed" in m
            and "PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR" in m], caplog.messages


def test_a_query_left_ended_is_not_looked_at_again_while_the_others_run(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Its warning came every half second while another query ran, or discovery kept the run going."""
    run, failed, started = _run(monkeypatch, [])
    failed.handler.error = RuntimeError("the audit append failed")  # type: ignore[attr-defined]
    running = _Query("r", [], "other", FakeHandler(), None, FakeQuery(isActive=True))  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="ingest.stream.queries"):
        run._await([failed, running], RunReport("r", {}), "continuous", stop_after=0.2, run_id="r")
    assert len([m for m in caplog.messages if "not started again" in m]) == 1 and started == []
    assert running.query.stopped


@pytest.mark.parametrize("refused", [False, True])
def test_a_checkpoint_claiming_a_micro_batch_that_passed_untouched_is_discarded(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refused: bool) -> None:
    """A micro-batch that came after the stop's ``take_no_more`` passed untouched: Spark's checkpoint
    claims it, the tables do not. A store that refuses the delete leaves it to the next run."""
    run, q, _ = _run(monkeypatch, [])
    if refused:
        monkeypatch.setattr(queries.checkpoints, "discard", lambda _d: (_ for _ in ()).throw(PermissionError("403")))
    q.query, q.handler.passed = FakeQuery(isActive=True), True  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger="ingest.stream.checkpoint"):
        run._await([q], RunReport("r", {}), "continuous", stop_after=0.01, run_id="r")
    assert q.query.stopped and discarded == ([] if refused else ["checkpoint"])
    refusal = "query q: could not discard the Spark checkpoint checkpoint (PermissionError: 403)"
    assert (refusal in caplog.text) == refused


class _SlowQuery:
    """A query whose ``isActive`` takes 0.2 s, as a py4j call to a busy JVM may; it notes an
    interruption raised inside it."""

    def __init__(self) -> None:
        self.status = {"message": "Waiting for next trigger"}
        self.stopped = False
        self.interrupted_inside: list[BaseException] = []

    @property
    def isActive(self) -> bool:
        try:
            time.sleep(0.2)
        except BaseException as exc:
            self.interrupted_inside.append(exc)
            raise
        return not self.stopped

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True

    def awaitTermination(self) -> None:  # as Spark's: returns once the query stopped (here, within 2 s)
        deadline = time.monotonic() + 2
        try:
            while not self.stopped and time.monotonic() < deadline:
                time.sleep(0.05)
        except KeyboardInterrupt as exc:  # noted, and kept from pytest, which would end the session
            self.interrupted_inside.append(exc)


class _Runner:
    def __init__(self) -> None:
        self.metrics = None
        self._stop = threading.Event()
        self.stop = self._stop.set
        self.pause = self._stop.wait

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


@pytest.mark.parametrize("mode", ["continuous", "available_now"])
def test_ctrl_c_only_asks_the_runs_loop_to_end(caplog: pytest.LogCaptureFixture, mode: Any) -> None:
    """Ctrl-C (and SIGTERM) was raised wherever the driver was, at times inside a py4j call, whose
    connection it broke: "error: internal error: Py4JNetworkError: Answer from Java side is empty",
    exit 5. A draining run waited in ``awaitTermination``, and got it there. The first one now only
    asks the loop to end, which then stops the queries."""
    before = signal.getsignal(signal.SIGINT)  # PySpark's, if a test before started Spark
    run = StreamingRun(_Runner())  # type: ignore[arg-type]
    query = _SlowQuery()
    q = _Query("q", [], "checkpoint", FakeHandler(), None, query)  # type: ignore[arg-type]
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()  # while isActive is asked
    with caplog.at_level("WARNING"):
        run._await([q], RunReport("r", {}), mode, stop_after=None, run_id="r")
    assert query.interrupted_inside == [] and query.stopped
    assert "interrupted: the micro-batch under way finishes, then the queries stop" in caplog.text
    assert signal.getsignal(signal.SIGINT) is before  # put back


class _InitializingQuery:
    """A query that initializes its sources for its first ``polls`` looks at its status; it notes the
    status it was stopped in."""

    def __init__(self, polls: int) -> None:
        self.polls, self.isActive, self.stopped_in = polls, True, ""

    @property
    def status(self) -> dict[str, str]:
        self.polls -= 1
        return {"message": "Initializing sources" if self.polls >= 0 else "Waiting for next trigger"}

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.stopped_in = "Initializing sources" if self.polls >= 0 else "after"
        self.isActive = False

    def awaitTermination(self) -> None:
        pass


def test_a_query_stopped_while_its_source_initializes_is_stopped_once_it_has(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the run starts stopped a query amid its source's start: Spark interrupted it while
    it talked to the Python source runner, which then read a closed connection and printed an
    EOFError traceback and a BrokenPipeError one (``benchmarks/bench_ctrl_c.py``: 2 presses of 16 at
    10-11.5 s, none after). The stop now waits for the source's start; a query that never finishes it
    is stopped after ``_SOURCE_INIT_WAIT`` all the same."""
    monkeypatch.setattr(queries, "_SOURCE_INIT_WAIT", 5.0)
    runner = _Runner()
    runner.stop()  # pressed while the run starts
    run = StreamingRun(runner)  # type: ignore[arg-type]
    query = _InitializingQuery(polls=3)
    run._await([_Query("q", [], "checkpoint", FakeHandler(), None, query)],  # type: ignore[arg-type]
               RunReport("r", {}), "available_now", stop_after=None, run_id="r")
    assert query.stopped_in == "after"

    monkeypatch.setattr(queries, "_SOURCE_INIT_WAIT", 0.2)
    stuck = _InitializingQuery(polls=10**6)
    started = time.monotonic()
    run._await([_Query("q", [], "checkpoint", FakeHandler(), None, stuck)],  # type: ignore[arg-type]
               RunReport("r", {}), "available_now", stop_after=None, run_id="r")
    assert stuck.stopped_in == "Initializing sources" and time.monotonic() - started < 5
