"""``source.kafka.commit_group``: the pipeline's lag where platform teams look (issue 46, point 3).

On the real broker: after a run, Kafka's own ``kafka-consumer-groups --describe`` shows the group
at the offsets the Delta log records, with no lag; changes the run has not read show as lag; the
next run clears it. The run's Prometheus metrics (issue 46, point 1) say the same lag as Kafka's tool.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.commit.state import load_state
from ingest.config import IngestConfig
from ingest.metrics import LAG_REFRESH_SECONDS, RunMetrics
from ingest.source.catalog import catalog_for
from ingest.stream.runner import Runner
from ingest.verify.capture import delete_topics, wait_for_capture
from tests.cli.test_metrics import scrape, value
from tests.stack.helpers import PREFIX, stack_config

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "cgroup"
TOPIC = f"{PREFIX['json']}.{SCHEMA}.notes"


def _describe(stack: Any, group: str) -> dict[int, tuple[int, int, int]]:
    """``kafka-consumer-groups --describe`` (Kafka's own tool, from the stack's jars): partition ->
    (current offset, log end offset, lag) of ``TOPIC``."""
    from harness.stack.tools import kafka_java

    java = kafka_java(lambda _line: None)
    done = subprocess.run(
        [str(java), "-cp", f"{stack.settings.jars_dir / 'kafka'}/*", "org.apache.kafka.tools.consumer.group."
         "ConsumerGroupCommand", "--bootstrap-server", stack.bootstrap_servers(), "--describe", "--group", group],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = {}
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 6 and words[1] == TOPIC:
            found[int(words[2])] = (int(words[3]), int(words[4]), int(words[5]))
    return found


def _insert(dsn: str, first: int, count: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(first, first + count):
            conn.execute(f"INSERT INTO {SCHEMA}.notes VALUES (%s, %s)", (i, f"note {i}"))


def _run(config: IngestConfig, spark: Any, metrics: RunMetrics) -> None:
    report = Runner(config, spark=spark, metrics=metrics).run()
    assert not report.failed, {n: t.error for n, t in report.tables.items()}


def test_the_consumer_group_shows_the_pipelines_lag(stack: Any, pg_dsn: str, spark: Any, tmp_path: Path) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        delete_topics(stack.bootstrap_servers(), [TOPIC])
        conn.execute(f"CREATE SCHEMA {SCHEMA}; CREATE TABLE {SCHEMA}.notes (id integer PRIMARY KEY, body text)")
    _insert(pg_dsn, 0, 30)
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok
    group = f"cdc-test-{uuid.uuid4().hex[:8]}"
    base = stack_config("json", tmp_path, schema=SCHEMA, tables=["notes"])
    kafka = base.source.kafka.model_copy(update={"commit_group": group})
    config = base.model_copy(update={"source": base.source.model_copy(update={"kafka": kafka})})

    metrics = RunMetrics(catalog_for(config))  # its lag in records is Kafka's view of the group's
    port = metrics.serve(0)
    _run(config, spark, metrics)
    applied = load_state(config.table_path("notes")).offsets
    described = _describe(stack, group)
    assert described and all(lag == 0 for _, _, lag in described.values()), described
    assert {p: current for p, (current, _, _) in described.items()} == {
        int(k.rsplit(":", 1)[1]): v + 1 for k, v in applied.items()}

    _insert(pg_dsn, 100, 12)  # captured, not yet read: the group shows it as lag
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok
    deadline = time.monotonic() + 30
    while sum(lag for _, _, lag in _describe(stack, group).values()) < 12 and time.monotonic() < deadline:
        time.sleep(1)
    assert sum(lag for _, _, lag in _describe(stack, group).values()) == 12
    time.sleep(LAG_REFRESH_SECONDS)
    assert value(scrape(port), "cdc_ingest_lag_records", table="notes") == 12

    _run(config, spark, metrics)
    assert all(lag == 0 for _, _, lag in _describe(stack, group).values())
    time.sleep(LAG_REFRESH_SECONDS)
    samples = scrape(port)
    metrics.close()
    assert value(samples, "cdc_ingest_lag_records", table="notes") == 0
    assert value(samples, "cdc_ingest_source_up") == 1
    assert value(samples, "cdc_ingest_records_received_total", table="notes") == 42
