"""End to end on the shared SparkSession: violations quarantined and explained; `fail` stops one table only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from harness.demo import prepare_workload, verify_all

from ingest.commit.state import load_state
from ingest.config import IngestConfig, load_config
from ingest.quality.gate import SPARK_DATASOURCE
from ingest.quality.results import ResultStore
from ingest.records import audit, quarantine
from ingest.source.topiclog import TopicLog
from ingest.stream.runner import Runner

pytestmark = pytest.mark.spark


def config_in(workdir: Path, orders_policy: str, validate_on: str = "auto") -> IngestConfig:
    raw = yaml.safe_load(Path("configs/demo.yaml").read_text())
    raw["workdir"] = str(workdir)
    raw["source"]["max_records_per_batch"] = 500
    raw["quality"]["expectations_dir"] = str(Path("expectations").resolve())
    raw["quality"]["validate_on"] = validate_on
    for table in raw["tables"]:
        if table["name"] == "orders":
            table["quality_policy"] = orders_policy
    path = workdir / f"config-{orders_policy}.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, spark):
    """orders under `fail`, the other tables under `quarantine`, a workload with violations in every table."""
    workdir = tmp_path_factory.mktemp("quality-e2e")
    config = config_in(workdir, "fail")
    prepare_workload(config, events=2500, seed=3, malformed_fraction=0.01, violation_fraction=0.01)
    return config, Runner(config, spark=spark).run()


def test_fail_stops_only_its_table_with_the_expectation_named(stopped):
    config, report = stopped
    assert report.failed == ["orders"]
    error = report.tables["orders"].error
    assert error.startswith("QualityGateError") and "nothing was committed" in error
    assert "quantity" in error or "status" in error
    # The failing batch moved no offset: the table is behind the topic's end.
    state = load_state(config.table_path("orders"))
    ends = TopicLog(config.log_dir).end_offsets("demo.public.orders")
    behind = [p for p, end in ends.items() if (state.applied_offset("demo.public.orders", p) or -1) < end - 1]
    assert behind


def test_other_tables_quarantine_their_violations_and_verify_with_explained_keys(stopped):
    config, _ = stopped
    results = {v.table: v for v in verify_all(config)}
    for name in ("customers", "products"):
        assert results[name].ok, results[name].examples
        assert results[name].explained > 0
    rows = quarantine.read(config.tables_root / "_cdc_quarantine", stage="quality").to_pylist()
    assert {r["table"] for r in rows} == {"customers", "products"}
    assert all(r["expectations"] and r["raw_value"] and r["row_key"] for r in rows)
    audit_rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    assert all(r["balanced"] for r in audit_rows)
    assert {r["quality_status"] for r in audit_rows if r["table"] == "customers"} <= {"passed", "quarantined", "warned"}


def test_after_switching_to_quarantine_the_stopped_table_catches_up(stopped, spark):
    """The catch-up validates on Spark (``validate_on: spark``): the whole run with the other gate."""
    config, _ = stopped
    fixed = config_in(config.workdir, "quarantine", validate_on="spark")
    report = Runner(fixed, spark=spark).run()
    assert not report.failed
    result = {v.table: v for v in verify_all(fixed)}["orders"]
    assert result.ok and result.explained > 0, result.examples
    # Every batch of this run was validated in the Spark datasource, not the driver's pandas one.
    results = [r for r in ResultStore(fixed.quality_results_dir / "orders").list() if r.run_id == report.run_id]
    assert len(results) == len(report.tables["orders"].batches) > 0
    for stored in results:
        batches = {c["expectation_config"]["kwargs"]["batch_id"] for c in stored.load()["validation_result"]["results"]}
        assert batches == {f"{SPARK_DATASOURCE}-orders"}
