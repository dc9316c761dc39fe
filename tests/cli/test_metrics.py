"""``ingest run --metrics-port`` (issue 46, point 1): Prometheus metrics that agree with the audit table.

A real ``ingest run --continuous`` in a subprocess is scraped while it runs, before and after more
changes arrive; every table's counters, its last commit and its lag are checked against the
``_cdc_audit`` rows and the topic's end offsets. The rest checks what a run rarely shows: a stopped
table's state, a source that does not answer, a port already taken.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from harness.stack.tools import apt_install
from prometheus_client.parser import text_string_to_metric_families

from ingest.behind import maintenance_failed
from ingest.commit.state import TableState
from ingest.config import IngestConfig, KafkaSpec, load_config
from ingest.errors import EnvironmentProblem, QualityGateError, SourceUnavailableError
from ingest.metrics import OUTCOMES, RunMetrics
from ingest.ops.status import describe_heartbeat, heartbeat_status
from ingest.records import audit
from ingest.records.audit import AuditRecord
from ingest.source.catalog import heartbeat_of
from tests.dagster.conftest import produce

TABLES = {"notes": "app.public.notes", "tags": "app.public.tags"}
#: an audit row's figure behind each ``records_total`` outcome
OUTCOME_COLUMNS = dict(zip(OUTCOMES, ("inserted", "updated", "deleted", "truncates", "superseded", "stale",
                                      "quarantined", "skipped"), strict=True))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` as ``(sample name, sorted labels) -> value``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def _config(tmp_path: Path) -> Path:
    raw = {"workdir": str(tmp_path / "work"), "source": {"value_format": "json", "max_records_per_batch": 9},
           "tables": [{"name": name, "topic": topic} for name, topic in TABLES.items()]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _agrees(samples: dict[Any, float], rows: list[dict[str, Any]], table: str) -> None:
    """The table's counters, last commit and trailing time are its audit rows'."""
    mine = [r for r in rows if r["table"] == table]
    assert value(samples, "cdc_ingest_records_received_total", table=table) == sum(r["received"] for r in mine)
    for outcome, column in OUTCOME_COLUMNS.items():
        assert value(samples, "cdc_ingest_records_total", table=table, outcome=outcome) == \
            sum(r[column] for r in mine), (table, outcome)
    committed = [r for r in mine if r["status"] == "committed"]
    assert value(samples, "cdc_ingest_batches_total", table=table, status="committed") == len(committed)
    assert value(samples, "cdc_ingest_batch_duration_seconds_count", table=table) == len(mine)
    assert value(samples, "cdc_ingest_commit_duration_seconds_count", table=table) == len(committed)
    last = max(committed, key=lambda r: r["delta_version"])
    assert value(samples, "cdc_ingest_last_commit_timestamp_seconds", table=table) == \
        pytest.approx(last["finished_at"].timestamp(), abs=1e-3)
    trailed = (last["finished_at"] - last["source_committed_at"]).total_seconds()
    assert value(samples, "cdc_ingest_lag_seconds", table=table) == pytest.approx(trailed, abs=1e-3)
    assert value(samples, "cdc_ingest_table_state", table=table, cdc_ingest_table_state="running") == 1


def _wait(condition: Any, run: subprocess.Popen[str], what: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        assert run.poll() is None, f"the run ended ({run.returncode}) before {what}"
        try:
            found = condition()
        except OSError:  # not serving yet
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.5)


@pytest.mark.spark
def test_a_continuous_run_serves_metrics_that_agree_with_its_audit_rows(tmp_path: Path) -> None:
    path = _config(tmp_path)
    config = load_config(path)
    produce(config, TABLES["notes"], [("c", {"id": i, "body": f"n{i}"}, 100 + i) for i in range(30)])
    produce(config, TABLES["tags"], [("c", {"id": i, "body": "t"}, 100 + i) for i in range(4)])
    port = _free_port()
    run = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "-c", str(path), "--continuous",
                            "--metrics-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def received(total: int) -> Any:
            """The samples once the counters and the audit rows both count ``total`` records: a
            table's counters move when its batch is applied, the audit rows when the micro-batch
            commits them, after every table of it."""
            samples = scrape(port)
            got = sum(value(samples, "cdc_ingest_records_received_total", table=t) or 0 for t in TABLES)
            audited = (sum(r["received"] for r in audit.read(config.tables_root / config.target.audit_table)
                           .to_pylist()) if got == total else None)
            return samples if audited == total else None

        _wait(lambda: scrape(port), run, "metrics served", timeout=60)  # before Spark has started
        samples = _wait(lambda: received(34), run, "34 records received")
        rows = audit.read(config.tables_root / config.target.audit_table).to_pylist()
        for table in TABLES:
            _agrees(samples, rows, table)
        assert value(samples, "cdc_ingest_lag_records", table="notes") == 0
        assert value(samples, "cdc_ingest_source_up") == 1

        # more changes while it runs: updates, deletes, a stale replay of an old change
        produce(config, TABLES["notes"], [*[("u", {"id": i, "body": f"n{i}'"}, 200 + i) for i in range(10)],
                                          *[("d", {"id": i, "body": f"n{i}"}, 300 + i) for i in range(10, 15)],
                                          ("c", {"id": 20, "body": "old"}, 99)])
        samples = _wait(lambda: received(50), run, "50 records received")
        time.sleep(5.5)  # the end offsets are asked again after a few seconds
        samples = scrape(port)
        rows = audit.read(config.tables_root / config.target.audit_table).to_pylist()
        for table in TABLES:
            _agrees(samples, rows, table)
        assert value(samples, "cdc_ingest_records_total", table="notes", outcome="updated") == 10
        assert value(samples, "cdc_ingest_records_total", table="notes", outcome="deleted") == 5
        assert value(samples, "cdc_ingest_records_total", table="notes", outcome="stale") == 1
        assert value(samples, "cdc_ingest_lag_records", table="notes") == 0
        # Spark's micro-batches, each counted once: those that ran are those the audit rows name
        ran = len({r["batch_id"] for r in rows})
        steps = {step: value(samples, "cdc_ingest_micro_batch_step_seconds_count", step=step)
                 for step in ("triggerExecution", "addBatch", "walCommit", "commitOffsets")}
        assert steps == dict.fromkeys(steps, ran) and ran >= 2, (steps, ran)
        whole, work = (value(samples, "cdc_ingest_micro_batch_step_seconds_sum", step=s) or 0
                       for s in ("triggerExecution", "addBatch"))
        assert 0 < work <= whole
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()


def _record(table: str, **figures: Any) -> AuditRecord:
    now = datetime.now(UTC)
    return AuditRecord(table=table, run_id="r", batch_id=0, finished_at=now, source_committed_at=now -
                       timedelta(seconds=2.5), **figures)


class _Catalog:
    """A source whose end offsets the test sets, or that does not answer."""

    def __init__(self) -> None:
        self.ends: dict[int, int] | None = {0: 10, 1: 4}
        self.beats: dict[str, float] = {}
        self.asked: set[str] = set()
        self.refused: set[str] = set()  # topics the engine may not read

    def end_offsets(self, topic: str) -> dict[int, int]:
        if self.ends is None:
            raise SourceUnavailableError("broker localhost:1 did not answer")
        return self.ends

    def newest_timestamp(self, topic: str) -> float | None:
        self.asked.add(topic)
        if self.ends is None or topic in self.refused:
            raise SourceUnavailableError(f"broker localhost:1 did not answer for topic {topic!r}")
        return self.beats.get(topic)


def test_lag_states_and_outcomes_as_a_scrape_shows_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("ingest.metrics.LAG_REFRESH_SECONDS", 0.0)
    catalog = _Catalog()
    metrics = RunMetrics(catalog)  # type: ignore[arg-type]
    port = metrics.serve(0)
    write_deltalake(tmp_path / "tags", pa.table({"id": [1]}))
    tags = DeltaTable(tmp_path / "tags")
    try:
        metrics.track("notes", "app.notes", TableState(None, None, None, None))
        metrics.track("tags", "app.tags", TableState(tags, None, None, None, offsets={"app.tags:0": 9}))
        samples = scrape(port)
        assert value(samples, "cdc_ingest_lag_records", table="notes") == 14  # nothing applied yet
        assert value(samples, "cdc_ingest_lag_records", table="tags") == 4  # partition 0 was applied before
        # before a run commits, the last commit is the table's latest, and a table without one has none
        assert value(samples, "cdc_ingest_last_commit_timestamp_seconds", table="tags") == \
            pytest.approx(tags.history(1)[0]["timestamp"] / 1000)
        assert value(samples, "cdc_ingest_last_commit_timestamp_seconds", table="notes") is None
        assert value(samples, "cdc_ingest_records_total", table="notes", outcome="stale") == 0

        metrics.batch(_record("notes", received=9, inserted=6, superseded=2, stale=1, total_ms=1500, apply_ms=400,
                              offsets='{"app.notes:0": [0, 6], "app.notes:1": [0, 1]}'))
        samples = scrape(port)
        assert value(samples, "cdc_ingest_lag_records", table="notes") == 3 + 2
        assert value(samples, "cdc_ingest_lag_seconds", table="notes") == pytest.approx(2.5)
        assert sum(value(samples, "cdc_ingest_records_total", table="notes", outcome=o) or 0 for o in OUTCOMES) == \
            value(samples, "cdc_ingest_records_received_total", table="notes") == 9
        assert value(samples, "cdc_ingest_batch_duration_seconds_bucket", table="notes", le="1.0") == 0
        assert value(samples, "cdc_ingest_batch_duration_seconds_bucket", table="notes", le="2.5") == 1

        metrics.stopped("notes", QualityGateError("notes", "expectation failed", ["x"]))
        samples = scrape(port)
        states = {s: value(samples, "cdc_ingest_table_state", table="notes", cdc_ingest_table_state=s)
                  for s in ("running", "quality", "unavailable")}
        assert states == {"running": 0, "quality": 1, "unavailable": 0}
        assert value(samples, "cdc_ingest_batches_total", table="notes", status="failed") == 1
        metrics.running("notes")
        assert value(scrape(port), "cdc_ingest_table_state", table="notes", cdc_ingest_table_state="running") == 1

        failed = {w: value(samples, "cdc_ingest_maintenance_failures_total", work=w) for w in ("checkpoint", "pack")}
        assert None not in failed.values()  # every kind from 0 (this process may have failed some already)
        maintenance_failed(logging.getLogger("test"), "pack", "a pack failed")
        assert value(scrape(port), "cdc_ingest_maintenance_failures_total", work="pack") == failed["pack"] + 1

        catalog.ends = {0: 8, 1: 4}  # tags' topic ends before offset 9, which it applied: recreated, no lag known
        samples = scrape(port)
        assert value(samples, "cdc_ingest_lag_records", table="tags") is None
        assert value(samples, "cdc_ingest_lag_records", table="notes") == 1 + 2
        catalog.ends = None  # the lag is then not known: no sample, and the source is down
        samples = scrape(port)
        assert value(samples, "cdc_ingest_lag_records", table="notes") is None
        assert value(samples, "cdc_ingest_source_up") == 0
    finally:
        metrics.close()


def test_each_connectors_newest_heartbeat_as_a_scrape_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """One heartbeat topic per topic prefix of the tracked tables; a topic without a record, or a source
    that does not answer, gives no sample rather than an old one."""
    monkeypatch.setattr("ingest.metrics.LAG_REFRESH_SECONDS", 0.0)
    catalog = _Catalog()
    catalog.beats = {"beats.shop": 1_796_000_000.5}
    watched = KafkaSpec(bootstrap_servers="k:9092", heartbeat_topic="beats.{prefix}")
    metrics = RunMetrics(catalog, heartbeat_of=watched.heartbeat_topic_of)  # type: ignore[arg-type]
    port = metrics.serve(0)
    try:
        nothing = TableState(None, None, None, None)
        for table, topic in (("orders", "shop.public.orders"), ("items", "shop.public.items"),
                             ("people", "crm.public.people"), ("notes", "app.notes")):
            metrics.track(table, topic, nothing)
        samples = scrape(port)
        assert value(samples, "cdc_ingest_source_heartbeat_timestamp_seconds", topic="beats.shop") == 1_796_000_000.5
        assert value(samples, "cdc_ingest_source_heartbeat_timestamp_seconds", topic="beats.crm") is None
        assert catalog.asked == {"beats.shop", "beats.crm"}  # app.notes names no schema: no connector prefix
        catalog.refused = {"beats.crm"}  # a heartbeat topic the engine may not read costs only its own sample
        samples = scrape(port)
        assert value(samples, "cdc_ingest_source_heartbeat_timestamp_seconds", topic="beats.shop") == 1_796_000_000.5
        assert value(samples, "cdc_ingest_source_up") == 1
        assert value(samples, "cdc_ingest_lag_records", table="orders") == 14
        catalog.ends = None
        assert value(scrape(port), "cdc_ingest_source_heartbeat_timestamp_seconds", topic="beats.shop") is None
    finally:
        metrics.close()
    quiet = _Catalog()
    none = KafkaSpec(bootstrap_servers="k:9092", heartbeat_topic="")  # source.kafka.heartbeat_topic empty
    unwatched = RunMetrics(quiet, heartbeat_of=none.heartbeat_topic_of)  # type: ignore[arg-type]
    unwatched.track("orders", "shop.public.orders", TableState(None, None, None, None))
    assert unwatched.heartbeats() == {} and quiet.asked == set()


def test_status_tells_each_connectors_heartbeat_and_one_it_may_not_read() -> None:
    config = IngestConfig.model_validate({
        "source": {"kind": "kafka", "kafka": {"bootstrap_servers": "k:9092"}, "value_format": "json"},
        "tables": [{"name": "orders", "topic": "shop.public.orders"}, {"name": "items", "topic": "shop.public.items"},
                   {"name": "people", "topic": "crm.public.people"}, {"name": "notes", "topic": "notes"}]})
    catalog = _Catalog()
    catalog.beats, catalog.refused = {"__debezium-heartbeat.shop": 100.0}, {"__debezium-heartbeat.crm"}
    told = [describe_heartbeat(b, 160.0) for b in heartbeat_status(config, source=catalog)]  # type: ignore[arg-type]
    assert told == ["heartbeats: __debezium-heartbeat.crm not read: broker localhost:1 did not answer for topic "
                    "'__debezium-heartbeat.crm'", "heartbeats: __debezium-heartbeat.shop, the newest 60 s ago"]
    catalog.refused = set()
    assert describe_heartbeat(heartbeat_status(config, source=catalog)[0], 160.0).startswith(  # type: ignore[arg-type]
        "no heartbeats in __debezium-heartbeat.crm: set the connector's heartbeat.interval.ms")
    of = heartbeat_of(config)  # what a run's metrics watch: the same topics status asks
    assert of is not None and of("shop.public.orders") == "__debezium-heartbeat.shop" and of("notes") is None
    embedded = IngestConfig.model_validate({"tables": [{"name": "orders", "topic": "shop.public.orders"}]})
    assert heartbeat_of(embedded) is None and heartbeat_status(embedded, source=catalog) == []  # type: ignore[arg-type]


def test_a_port_already_taken_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EnvironmentProblem, match=rf"^metrics: cannot listen on 127.0.0.1:{port} \(.+\)$"):
            RunMetrics().serve(port)


MONITORING = Path(__file__).resolve().parents[2] / "infra" / "monitoring"


def _promtool() -> str:
    """Prometheus' own checker, from Debian's package (installed here when missing, as the stack does)."""
    found = shutil.which("promtool")
    if found is None:
        apt_install(["prometheus"], "the alerting rules' test", print)
        found = shutil.which("promtool")
    assert found is not None
    return found


def test_the_alerting_rules_are_valid_and_fire_as_their_tests_say() -> None:
    promtool = _promtool()
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"],
                 ["check", "config", "prometheus.yml"]):
        done = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    tested = {a["alertname"] for t in yaml.safe_load((MONITORING / "alerts_test.yml").read_text())["tests"]
              for a in t["alert_rule_test"]}
    rules = {r["alert"] for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]}
    assert rules == tested  # every alert has a case


def test_the_dashboard_and_the_rules_ask_only_for_what_a_run_serves() -> None:
    catalog = _Catalog()
    catalog.beats = {"__debezium-heartbeat.shop": 1_796_000_000.0}
    metrics = RunMetrics(catalog, heartbeat_of=KafkaSpec(bootstrap_servers="k:9092").heartbeat_topic_of)  # type: ignore[arg-type]
    port = metrics.serve(0)
    try:
        metrics.track("notes", "app.notes", TableState(None, None, None, None))
        metrics.track("orders", "shop.public.orders", TableState(None, None, None, None))
        metrics.batch(_record("notes", received=1, inserted=1, offsets='{"app.notes:0": [0, 0]}'))
        metrics.micro_batch({"triggerExecution": 250, "addBatch": 120})
        served = {name for name, _ in scrape(port)}
    finally:
        metrics.close()
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    shown = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    watched = [r["expr"] for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    asked = [*shown, *watched, dashboard["templating"]["list"][1]["query"]["query"]]
    names = {n for expr in asked for n in re.findall(r"\bcdc_ingest_[a-z_]+", expr)} - {"cdc_ingest_table_state"}
    assert names and names <= served, names - served
    assert len(dashboard["panels"]) >= 8
    # whoever an alert wakes finds what fired it on the dashboard, with its history
    on_panels = {n for expr in shown for n in re.findall(r"\bcdc_ingest_[a-z_]+", expr)}
    assert {n for expr in watched for n in re.findall(r"\bcdc_ingest_[a-z_]+", expr)} <= on_panels
