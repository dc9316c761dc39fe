"""A connector that stopped sends nothing, so no lag shows it; its heartbeats stopping do
(docs/operations.md#a-connector-that-stopped).

On the stack: while ``pgjson`` runs, Debezium writes a heartbeat a second to
``__debezium-heartbeat.pgjson`` (``heartbeat.interval.ms``), and the run's metric and ``ingest status``
show how old the newest one is. Paused, the connector writes none, and the time the metric serves
stays where it was; resumed, it moves again.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.commit.state import TableState
from ingest.metrics import RunMetrics
from ingest.source.catalog import catalog_for, heartbeat_of, heartbeat_topics
from tests.harness import ingest_cli
from tests.stack.helpers import PREFIX, stack_config, wait_until, write_config

pytestmark = [pytest.mark.stack]

TOPIC = f"__debezium-heartbeat.{PREFIX['json']}"


def _newest(metrics: RunMetrics) -> float:
    newest = metrics.heartbeats().get(TOPIC)
    assert newest is not None, f"no heartbeat in {TOPIC}"
    return newest


def test_a_paused_connector_stops_its_heartbeats_and_the_metric_shows_it(
        stack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ingest.metrics.LAG_REFRESH_SECONDS", 0.0)
    config = stack_config("json", tmp_path)
    assert config.source.kafka is not None and heartbeat_topics(config) == [TOPIC]
    metrics = RunMetrics(catalog_for(config), heartbeat_of=heartbeat_of(config))
    for spec in config.tables:
        metrics.track(spec.name, spec.topic, TableState(None, None, None, None))
    assert time.time() - _newest(metrics) < 15

    shown = ingest_cli("status", "-c", str(write_config(config, tmp_path / "config.yaml")))
    assert re.search(rf"heartbeats: {re.escape(TOPIC)}, the newest \d+ s ago", shown.stdout), shown.stdout

    connect = stack._connect()
    connect.pause("pgjson")
    try:
        wait_until("pgjson did not pause", lambda: stack.connector_status("pgjson")["connector"]["state"] == "PAUSED")
        time.sleep(3)  # a heartbeat already on its way lands
        stopped = _newest(metrics)
        time.sleep(5)
        assert _newest(metrics) == stopped
        assert time.time() - stopped >= 5
    finally:
        connect.resume("pgjson")  # for the tests after this one, whatever happened
    wait_until("no heartbeat after the resume", lambda: _newest(metrics) > stopped)


def test_status_names_a_connector_whose_heartbeats_it_cannot_find(stack: Any, tmp_path: Path) -> None:
    config = stack_config("json", tmp_path)
    assert config.source.kafka is not None
    kafka = config.source.kafka.model_copy(update={"heartbeat_topic": "no-heartbeats.{prefix}"})
    config = config.model_copy(update={"source": config.source.model_copy(update={"kafka": kafka})})
    shown = ingest_cli("status", "-c", str(write_config(config, tmp_path / "config.yaml")))
    assert shown.returncode == 0, shown.stderr
    assert f"no heartbeats in no-heartbeats.{PREFIX['json']}: set the connector's heartbeat.interval.ms" in \
        " ".join(shown.stdout.split())
