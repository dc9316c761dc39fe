"""A run asks the Kafka cluster one question before Spark starts (``Runner._ask_kafka``).

A refused login or TLS handshake ends any run at once with the cluster's reason, and so does a
cluster that does not answer a run that drains: a scheduler starts the next. A continuous run waits
for a cluster that does not answer, asking again after 1, 2, 4 ... seconds (30 at most) and warning,
as it rides out an outage once running; ``stop_after`` bounds the wait. The real cluster's refusal
is checked in ``tests/stack/test_security.py``, a port nothing listens on here.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness.stack.process import wait_until

from ingest.config import IngestConfig
from ingest.config.source import KafkaSpec
from ingest.errors import SourceUnavailableError
from ingest.source.kafka_admin import KafkaAdmin
from ingest.stream import runner as runner_module
from ingest.stream.runner import Runner


class FlakyCatalog:
    """A cluster that does not answer the first ``failures`` questions (or refuses them)."""

    def __init__(self, failures: int, *, refused: bool = False, topics: list[str] | None = None) -> None:
        self.failures, self.refused, self.asked = failures, refused, 0
        self.names = topics or ["app.notes"]

    def topics(self) -> list[str]:
        self.asked += 1
        if self.asked <= self.failures:
            raise SourceUnavailableError("Kafka at 127.0.0.1:1 did not list its topics: no answer",
                                         refused=self.refused)
        return self.names


@pytest.fixture
def runner(tmp_path: Path, refused_port: int) -> Runner:
    return Runner(IngestConfig.model_validate({
        "workdir": str(tmp_path), "tables": [{"name": "notes", "topic": "app.notes"}],
        "source": {"kind": "kafka", "kafka": {"bootstrap_servers": f"127.0.0.1:{refused_port}"}}}))


@pytest.fixture
def sleeps(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The runner's pauses, which wait on its stop request (only this test's: not the process's ``time.sleep``)."""
    pauses: list[float] = []
    monkeypatch.setattr(runner, "pause", pauses.append)
    return pauses


def _use(monkeypatch: pytest.MonkeyPatch, catalog: FlakyCatalog) -> FlakyCatalog:
    monkeypatch.setattr(runner_module, "catalog_for", lambda config: catalog)
    return catalog


def test_a_continuous_run_waits_for_a_cluster_that_does_not_answer(runner: Runner, sleeps: list[float],
                                                                   monkeypatch: Any, caplog: Any) -> None:
    catalog = _use(monkeypatch, FlakyCatalog(7))
    with caplog.at_level(logging.WARNING, logger=runner_module.__name__):
        runner._ask_kafka("continuous")
    assert catalog.asked == 8 and sleeps == [1, 2, 4, 8, 16, 30, 30]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("did not list its topics" in w and "waits for the cluster" in w for w in warned)


def test_a_draining_run_and_a_refused_login_end_at_once(runner: Runner, sleeps: list[float],
                                                        monkeypatch: Any) -> None:
    for mode, refused in (("available_now", False), ("continuous", True)):
        catalog = _use(monkeypatch, FlakyCatalog(1, refused=refused))
        with pytest.raises(SourceUnavailableError, match="did not list its topics"):
            runner._ask_kafka(mode)  # type: ignore[arg-type]
        assert catalog.asked == 1
    assert not sleeps


def test_a_continuous_run_that_discovers_its_tables_waits_for_the_cluster_then_discovers(
        tmp_path: Path, monkeypatch: Any, refused_port: int) -> None:
    runner = Runner(IngestConfig.model_validate({
        "workdir": str(tmp_path), "discover": {"topic_pattern": r"shop\.[^.]+\.[^.]+"},
        "source": {"kind": "kafka", "kafka": {"bootstrap_servers": f"127.0.0.1:{refused_port}"}}}))
    pauses: list[float] = []
    monkeypatch.setattr(runner, "pause", pauses.append)
    catalog = _use(monkeypatch, FlakyCatalog(3, topics=["shop.public.notes"]))
    monkeypatch.setattr("ingest.source.discovery.catalog_for", lambda config: catalog)

    class Discovered(Exception):
        pass

    def stop_here(root: Any, names: list[str], **kwargs: Any) -> Any:  # the step after discovery
        raise Discovered(names)

    monkeypatch.setattr(runner_module.locks, "acquire_all", stop_here)
    with pytest.raises(Discovered) as stopped:
        runner.run(mode="continuous")
    assert pauses == [1, 2, 4] and catalog.asked == 5  # three unanswered, the answer, discovery's listing
    assert stopped.value.args[0] == ["public_notes"]


def test_a_continuous_run_waits_no_longer_than_it_runs(runner: Runner, sleeps: list[float], monkeypatch: Any) -> None:
    catalog = _use(monkeypatch, FlakyCatalog(100))
    with pytest.raises(SourceUnavailableError):
        runner._ask_kafka("continuous", stop_after=5)
    assert sleeps == [1, 2, 4] and catalog.asked == 4  # 7 s waited: past 5


def test_a_stop_request_ends_the_wait_with_the_clusters_reason(runner: Runner, monkeypatch: Any) -> None:
    catalog = _use(monkeypatch, FlakyCatalog(10**6))
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            runner._ask_kafka("continuous")
        except SourceUnavailableError as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=wait)
    waiting.start()
    try:  # in its second pause (2 s) or about to be
        wait_until(lambda: catalog.asked >= 2, what="the second question", timeout=10, interval=0.05)
    finally:
        stopped = time.monotonic()
        runner.stop()
        waiting.join(timeout=5)
    # The pause ends at once (not 2 s later); the run asks once more, then ends with the cluster's reason.
    assert not waiting.is_alive() and time.monotonic() - stopped < 1.0 and catalog.asked == 3
    assert len(outcome) == 1 and "did not list its topics" in str(outcome[0])


def test_a_cluster_that_does_not_answer_has_not_refused(refused_port: int) -> None:
    admin = KafkaAdmin(KafkaSpec(bootstrap_servers=f"127.0.0.1:{refused_port}"), timeout=2)
    with pytest.raises(SourceUnavailableError) as caught:
        admin.topics()
    assert not caught.value.refused, caught.value
