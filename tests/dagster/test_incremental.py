"""The change-feed asset: consumes only new commits of ``orders`` and stays equal to a full recomputation.

The reference is DuckDB over the table's live rows (``ingest query``), not the asset's own fold.
"""

from __future__ import annotations

import dagster as dg
import pytest

from assets.constants import ANALYTICS_KEY_PREFIX, table_key
from assets.definitions import build_definitions
from assets.incremental import ORDERS_BY_STATUS
from assets.resources import SparkIngestPipeline
from ingest.lake.delta import open_table, read_all
from ingest.read.query import run_sql
from tests.dagster.conftest import produce, write_config

pytestmark = pytest.mark.spark

KEY = dg.AssetKey([ANALYTICS_KEY_PREFIX, ORDERS_BY_STATUS])


def _materialize(config, path) -> dict:
    engine = SparkIngestPipeline(config_path=str(path))
    defs = build_definitions(config, engine)
    assets = [a for a in defs.assets if a.key in (table_key("orders"), KEY)]  # type: ignore[union-attr]
    result = dg.materialize(assets, instance=dg.DagsterInstance.ephemeral(),  # type: ignore[arg-type]
                            resources={"ingest_pipeline": engine})
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == KEY]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def _stored(config) -> dict:
    table = open_table(config.tables_root / ANALYTICS_KEY_PREFIX / ORDERS_BY_STATUS)
    return {r["status"]: (r["orders"], r["amount"]) for r in read_all(table).to_pylist()}


def _recomputed(config) -> dict:
    rows = run_sql(config, "SELECT status, count(*) AS n, sum(amount) AS amount FROM orders GROUP BY status")
    return {r["status"]: (r["n"], r["amount"]) for r in rows.to_pylist()}


@pytest.mark.parametrize(("engine", "delete_mode"), [("delta-rs", "hard"), ("delta-rs", "soft"),
                                                     ("delta-spark", "hard")])
def test_the_aggregate_follows_the_change_feed_and_equals_a_recomputation(tmp_path, spark, engine, delete_mode):
    path, config = write_config(tmp_path / "work", batch=6, value_format="json", engine=engine,
                                tables=[{"name": "orders", "topic": "app.orders", "delete_mode": delete_mode}])
    statuses = ("new", "paid", "shipped")
    produce(config, "app.orders", [("c", {"id": i, "status": statuses[i % 3], "amount": 100 * i}, 100 + i)
                                   for i in range(1, 13)])
    first = _materialize(config, path)
    assert first["mode"] == "recomputed" and _stored(config) == _recomputed(config)
    assert first["orders"] == 12

    # Status moves, amount changes, deletes, a deleted key created again, and a status emptied.
    produce(config, "app.orders", [
        ("u", {"id": 1, "status": "paid", "amount": 100}, 200),
        ("u", {"id": 2, "status": "paid", "amount": 999}, 201),
        ("d", {"id": 3}, 202),
        ("u", {"id": 4, "status": "returned", "amount": 400}, 203),
        ("d", {"id": 6}, 204),
        ("c", {"id": 6, "status": "new", "amount": 66}, 205),
        ("c", {"id": 20, "status": "new", "amount": 5}, 206),
        ("d", {"id": 9}, 207),
    ] + [("u", {"id": i, "status": "paid", "amount": 100 * i}, 300 + i) for i in (5, 8, 11)])
    second = _materialize(config, path)
    assert second["mode"] == "incremental" and second["from_version"] == first["to_version"]
    assert second["to_version"] > first["to_version"] and second["changes_consumed"] >= 11
    assert _stored(config) == _recomputed(config)
    assert "shipped" not in _stored(config)  # every shipped order moved on or was deleted: the row went

    # Nothing new: nothing consumed, nothing rewritten.
    aggregate = open_table(config.tables_root / ANALYTICS_KEY_PREFIX / ORDERS_BY_STATUS)
    third = _materialize(config, path)
    assert third["mode"] == "incremental" and third["changes_consumed"] == 0
    assert open_table(config.tables_root / ANALYTICS_KEY_PREFIX / ORDERS_BY_STATUS).version() == aggregate.version()
    assert _stored(config) == _recomputed(config)
