"""The table asset's metadata and ``quality`` check, driven by the stub engine (no Spark)."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from assets.constants import QUALITY_CHECK, table_key
from assets.definitions import build_definitions
from assets.resources import StubIngestPipeline
from tests.dagster.conftest import write_config

_BATCH = {"received": 10, "inserted": 6, "updated": 2, "deleted": 1, "quarantined": 1, "delta_version": 0,
          "total_ms": 40}


def _materialize(tmp_path, policy: str, runs: dict) -> tuple[dg.ExecuteInProcessResult, dg.AssetCheckEvaluation]:
    path, config = write_config(tmp_path / "work", value_format="json", tables=[
        {"name": "notes", "topic": "app.notes", "quality_policy": policy}])
    engine = StubIngestPipeline(config_path=str(path), runs_json=json.dumps(runs))
    defs = build_definitions(config, engine)
    result = dg.materialize(defs.assets, instance=dg.DagsterInstance.ephemeral(),  # type: ignore[arg-type]
                            resources={"ingest_pipeline": engine}, raise_on_error=False)
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == QUALITY_CHECK]
    return result, evaluation


def test_counts_become_metadata(tmp_path):
    result, quality = _materialize(tmp_path, "warn", {"notes": {"batches": [_BATCH, {**_BATCH, "batch_id": 1}]}})
    assert result.success and quality.passed
    [event] = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (meta["inserted"], meta["updated"], meta["deleted"], meta["quarantined"]) == (12, 4, 2, 2)
    assert meta["batches"] == 2 and meta["max_batch_ms"] == 40 and meta["lag"] == 0


@pytest.mark.parametrize("policy", ["warn", "quarantine"])
def test_failed_expectations_warn_without_blocking(tmp_path, policy):
    batch = {**_BATCH, "expectations_evaluated": 8, "expectations_failed": 2, "quality_status": "warned",
             "quality_failures": json.dumps({"email_not_null": 3})}
    result, quality = _materialize(tmp_path, policy, {"notes": {"batches": [batch]}})
    assert result.success
    assert not quality.passed and quality.severity == dg.AssetCheckSeverity.WARN and not quality.blocking
    assert quality.metadata["unexpected_by_expectation"].value == {"email_not_null": 3}


def test_quality_gate_fails_the_blocking_check_and_the_step(tmp_path):
    runs = {"notes": {"batches": [_BATCH], "error": "QualityGateError: table notes: expectation amount_positive "
                                                    "failed (policy fail)"}}
    result, quality = _materialize(tmp_path, "fail", runs)
    assert not result.success
    assert not quality.passed and quality.severity == dg.AssetCheckSeverity.ERROR and quality.blocking
    assert "amount_positive" in quality.description
    # What was committed before the gate is still recorded.
    [event] = result.get_asset_materialization_events()
    assert event.asset_key == table_key("notes") and event.materialization.metadata["inserted"].value == 6


def test_other_table_errors_fail_the_step(tmp_path):
    result, quality = _materialize(tmp_path, "warn", {"notes": {"error": "TableError: column 'body' changed type"}})
    assert not result.success and quality.passed
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "column 'body' changed type" in str(failure.step_failure_data.error)
