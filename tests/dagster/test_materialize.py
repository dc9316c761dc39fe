"""Materializing the assets on a small simulator workload: metadata, check results, analytics."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

import dagster as dg
import pytest
from harness.demo import prepare_workload, truth_dir, verify_all

from assets.analytics import DAILY_REVENUE
from assets.constants import ANALYTICS_KEY_PREFIX, BALANCE_CHECK, LAG_CHECK, QUALITY_CHECK, table_key
from assets.definitions import build_definitions
from assets.resources import SparkIngestPipeline
from ingest.lake.delta import open_table, read_all
from ingest.records import audit
from tests.dagster.conftest import write_config

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", params=["delta-rs", "delta-spark", "delta-rs on s3"])
def materialized(request, tmp_path_factory, spark):
    """Every asset and check of the demo configuration, materialized once on 800 simulated events,
    once per apply engine, and once with the lake on an S3 API server."""
    engine_name, _, lake = request.param.partition(" on ")
    target = None
    if lake:
        s3 = request.getfixturevalue("s3")
        s3.create_bucket("dagster")
        target = {"root": "s3://dagster/lake", "storage": s3.storage()}
    path, config = write_config(tmp_path_factory.mktemp("dagster") / "work", batch=300, engine=engine_name,
                                target=target)
    prepare_workload(config, events=800, seed=1, malformed_fraction=0.01)
    engine = SparkIngestPipeline(config_path=str(path))
    defs = build_definitions(config, engine)
    graph = defs.get_repository_def().asset_graph
    result = dg.materialize(
        [*defs.assets, *defs.asset_checks],  # type: ignore[list-item]
        instance=dg.DagsterInstance.ephemeral(),
        resources={"ingest_pipeline": engine},
    )
    return config, result, graph


def _metadata(result: dg.ExecuteInProcessResult, key: dg.AssetKey) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_tables_equal_the_source(materialized):
    config, result, _ = materialized
    assert result.success
    engines = {r["engine"] for r in audit.read(config.tables_root / "_cdc_audit").to_pylist()}
    assert engines == {config.target.writer}
    assert config.lake_is_local or not (config.workdir / "tables").exists()
    assert all(v.ok for v in verify_all(config)), [v.table for v in verify_all(config) if not v.ok]


def test_metadata_reports_counts_offsets_lag_version_rows_schema(materialized):
    config, result, _ = materialized
    rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    for spec in config.tables:
        meta = _metadata(result, table_key(spec.name))
        mine = [r for r in rows if r["table"] == spec.name]
        for count in ("received", "inserted", "updated", "deleted", "quarantined"):
            assert meta[count] == sum(r[count] for r in mine), (spec.name, count)
        assert meta["inserted"] > 0 and meta["batches"] == len(mine) >= 1
        table = open_table(config.table_path(spec.name))
        assert meta["delta_version"] == table.version()
        assert meta["dagster/row_count"] == read_all(table, where="NOT coalesce(_cdc_deleted, false)").num_rows
        assert meta["lag"] == 0
        before, after = meta["offsets_before"]["partitions"], meta["offsets_after"]["partitions"]
        assert all(p["applied"] is None for p in before.values())
        assert all(p["applied"] == p["end"] - 1 for p in after.values() if p["end"] > 0)
        columns = {c.name for c in meta["dagster/column_schema"].columns}
        assert {"id", "_cdc_position", "_cdc_offset"} <= columns
        assert len(meta["batch_durations"]) == meta["batches"]
        assert meta["table_path"] == str(config.table_path(spec.name))
    # The simulator injected malformed messages; they are counted, not lost.
    assert sum(_metadata(result, table_key(s.name))["quarantined"] for s in config.tables) > 0


def test_checks_report_balance_lag_and_the_audited_quality(materialized):
    config, result, _ = materialized
    evaluations = {(e.asset_key, e.check_name): e for e in result.get_asset_check_evaluations()}
    rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    for spec in config.tables:
        key = table_key(spec.name)
        for check in (BALANCE_CHECK, LAG_CHECK):
            assert evaluations[(key, check)].passed, (spec.name, check, evaluations[(key, check)].description)
        balance = evaluations[(key, BALANCE_CHECK)].metadata
        assert balance["batches"].value >= 1 and balance["received"].value > 0
        # The quality check says what the audit trail says about the table's expectations.
        mine = [r for r in rows if r["table"] == spec.name]
        failed = sum(r.get("expectations_failed") or 0 for r in mine)
        quality = evaluations[(key, QUALITY_CHECK)]
        assert quality.metadata["expectations_failed"].value == failed
        assert quality.metadata["expectations_evaluated"].value == sum(r.get("expectations_evaluated") or 0
                                                                        for r in mine)
        assert quality.passed == (failed == 0)
        if not quality.passed:
            assert quality.severity == dg.AssetCheckSeverity.WARN  # quarantine policy: not blocking


def test_daily_revenue_equals_the_source(materialized):
    config, result, graph = materialized
    key = dg.AssetKey([ANALYTICS_KEY_PREFIX, DAILY_REVENUE])
    assert graph.get(key).parent_keys == {table_key("orders"), table_key("customers")}
    from harness.simulator import Truth

    truth = Truth.load(truth_dir(config))
    segment = {r["id"]: r["segment"] for r in truth.tables["customers"].to_pylist()}
    expected: dict[tuple, Decimal] = defaultdict(Decimal)
    for order in truth.tables["orders"].to_pylist():
        if order["status"] != "cancelled":
            expected[(order["ordered_at"].date(), segment.get(order["customer_id"], "unknown"))] += order["amount"]
    written = read_all(open_table(config.tables_root / ANALYTICS_KEY_PREFIX / DAILY_REVENUE)).to_pylist()
    assert {(r["order_date"], r["segment"]): r["revenue"] for r in written} == dict(expected)
    assert _metadata(result, key)["dagster/row_count"] == len(expected) > 0
