"""The ``audit_balance`` and ``lag`` checks on hand-made audit rows and topics (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg

from assets.checks import LagThresholds, balance_check_result, lag_check_result
from assets.resources import StubIngestPipeline
from ingest.records import audit
from ingest.records.audit import AuditRecord
from tests.dagster.conftest import produce


def test_balance_fails_on_a_batch_that_does_not_add_up(notes_config):
    path, config = notes_config
    engine = StubIngestPipeline(config_path=str(path))
    spec = config.table("notes")
    audit_path = engine.paths("notes").audit
    audit.append(audit_path, [AuditRecord("notes", "r1", 0, received=5, inserted=3, superseded=1, quarantined=1)])
    assert balance_check_result(spec, engine).passed
    audit.append(audit_path, [AuditRecord("notes", "r2", 1, received=5, inserted=3)])  # two messages unaccounted
    result = balance_check_result(spec, engine)
    assert not result.passed and result.severity == dg.AssetCheckSeverity.ERROR
    assert result.metadata["unbalanced_batches"].value == [{"run_id": "r2", "batch_id": 1, "delta_version": None}]


def test_lag_is_stale_only_with_a_backlog_and_no_recent_commit(notes_config):
    path, config = notes_config
    engine = StubIngestPipeline(config_path=str(path))
    spec = config.table("notes")
    assert lag_check_result(spec, engine, LagThresholds()).passed  # nothing in the topic
    produce(config, "app.notes", [("c", {"id": i, "body": "x"}, 10 + i) for i in range(4)])
    stale = lag_check_result(spec, engine, LagThresholds())
    assert not stale.passed and stale.severity == dg.AssetCheckSeverity.WARN
    assert stale.metadata["lag"].value == 4 and "nothing committed yet" in stale.description
    assert lag_check_result(spec, engine, LagThresholds(max_lag_records=4)).passed
    # A recent commit means the table is catching up, not stale.
    audit.append(engine.paths("notes").audit, [AuditRecord("notes", "r", 0, finished_at=datetime.now(UTC))])
    assert lag_check_result(spec, engine, LagThresholds(max_staleness=timedelta(minutes=5))).passed
    later = datetime.now(UTC) + timedelta(hours=2)
    assert not lag_check_result(spec, engine, LagThresholds(), now=later).passed
