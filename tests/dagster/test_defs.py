"""The code location loads, and its definitions follow the ingestion configuration."""

from __future__ import annotations

import dagster as dg
import pytest
import yaml

from assets.constants import (
    ANALYTICS_GROUP,
    BALANCE_CHECK,
    CDC_TABLES_GROUP,
    LAG_CHECK,
    QUALITY_CHECK,
    table_key,
    table_pool,
)
from assets.jobs import MAINTENANCE_JOB, MAINTENANCE_SCHEDULE
from assets.resources import SparkIngestPipeline
from dagster_project.settings import CONFIG_ENV, WORKDIR_ENV
from ingest.config import load_config
from tests.dagster.conftest import DEMO_CONFIG, write_config


def _load() -> dg.Definitions:
    from dagster_project.definitions import defs

    loaded = defs()
    loaded.validate_loadable(loaded)
    return loaded


def test_definitions_load_with_every_configured_table(monkeypatch, tmp_path):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv(WORKDIR_ENV, str(tmp_path))
    defs = _load()
    graph = defs.get_repository_def().asset_graph
    tables = [t.name for t in load_config(DEMO_CONFIG).tables]
    for name in tables:
        node = graph.get(table_key(name))
        assert node.group_name == CDC_TABLES_GROUP and defs.get_assets_def(table_key(name)).op.pool == table_pool(name)
        assert {k.name for k in graph.asset_check_keys if k.asset_key == table_key(name)} == {
            QUALITY_CHECK, BALANCE_CHECK, LAG_CHECK}
    analytics = {k.path[-1]: graph.get(k) for k in graph.get_all_asset_keys()
                 if graph.get(k).group_name == ANALYTICS_GROUP}
    assert sorted(analytics) == ["daily_revenue_by_segment", "orders_by_status"]
    assert analytics["daily_revenue_by_segment"].parent_keys == {table_key("orders"), table_key("customers")}
    assert analytics["orders_by_status"].parent_keys == {table_key("orders")}
    assert [s.name for s in defs.sensors] == ["cdc_offsets_sensor"]  # type: ignore[union-attr]
    [schedule] = defs.schedules  # type: ignore[misc]
    assert schedule.name == MAINTENANCE_SCHEDULE and schedule.job_name == MAINTENANCE_JOB
    engine = defs.resources["ingest_pipeline"]  # type: ignore[index]
    assert isinstance(engine, SparkIngestPipeline) and engine.workdir == str(tmp_path.resolve())


def test_a_table_added_to_the_config_becomes_an_asset(monkeypatch, tmp_path):
    path, _ = write_config(tmp_path, tables=[{"name": "invoices", "topic": "erp.public.invoices",
                                              "quality_policy": "fail"}])
    monkeypatch.setenv(CONFIG_ENV, str(path))
    defs = _load()
    graph = defs.get_repository_def().asset_graph
    assert {k for k in graph.get_all_asset_keys()} == {table_key("invoices")}  # no orders: no analytics
    [quality] = [s for s in defs.get_assets_def(table_key("invoices")).check_specs if s.name == QUALITY_CHECK]
    assert quality.blocking  # policy fail: the quality check blocks


def test_discovered_tables_become_assets_and_a_reload_finds_new_topics(monkeypatch, tmp_path):
    import yaml

    from ingest.source.topiclog import TopicLog

    path, config = write_config(tmp_path, tables=[{"name": "invoices", "topic": "erp.public.invoices"}])
    raw = yaml.safe_load(path.read_text())
    raw["discover"] = {"topic_pattern": r"erp\.public\.[^.]+"}
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(CONFIG_ENV, str(path))
    log = TopicLog(config.log_dir)
    for topic in ("erp.public.invoices", "erp.public.payments"):
        log.create_topic(topic, 1)
    graph = _load().get_repository_def().asset_graph
    assert set(graph.get_all_asset_keys()) == {table_key("invoices"), table_key("public_payments")}

    log.create_topic("erp.public.refunds", 1)  # a new topic: the next load of the location has it
    defs = _load()
    assert table_key("public_refunds") in set(defs.get_repository_def().asset_graph.get_all_asset_keys())
    [sensor] = defs.sensors  # type: ignore[misc]
    [target] = sensor.targets  # type: ignore[union-attr]
    assert set(target.resolvable_to_job.selection.resolve(defs.get_repository_def().asset_graph)) == {
        table_key("invoices"), table_key("public_payments"), table_key("public_refunds")}


def test_the_demo_analytics_attach_only_when_the_configuration_asks_and_thresholds_come_from_it(tmp_path):
    """A user's own tables named like the demo's get no analytic assets built for the demo's columns."""
    from assets.definitions import build_definitions

    own = [{"name": "orders", "topic": "erp.public.orders"}, {"name": "customers", "topic": "erp.public.customers"},
           {"name": "order_items", "topic": "erp.public.order_items"}]
    path, config = write_config(tmp_path, tables=own)
    raw = yaml.safe_load(path.read_text())
    raw.pop("dagster", None)
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    engine = SparkIngestPipeline(config_path=str(path))
    keys = build_definitions(config, engine).get_repository_def().asset_graph.get_all_asset_keys()
    assert keys == {table_key(t["name"]) for t in own}

    raw["dagster"] = {"analytics": True, "max_lag_records": 250, "max_staleness": "15m"}
    path.write_text(yaml.safe_dump(raw))
    defs = build_definitions(load_config(path), engine)
    graph = defs.get_repository_def().asset_graph
    assert {k for k in graph.get_all_asset_keys() if graph.get(k).group_name == ANALYTICS_GROUP}
    [lag] = [s for c in defs.asset_checks or [] for s in c.check_specs  # type: ignore[union-attr]
             if s.name == LAG_CHECK and s.asset_key == table_key("orders")]
    assert "250 records" in (lag.description or "") and "0:15:00" in (lag.description or "")


@pytest.mark.spark
def test_two_pipelines_live_in_one_definitions_and_each_drains_its_own_tables(tmp_path, spark):
    """Two configurations with one table name each, the second with ``dagster.prefix: crm``: every
    name differs, the merged definitions load, and each asset runs on its own pipeline's engine."""
    from assets.constants import Names
    from assets.definitions import build_definitions
    from tests.dagster.conftest import produce

    built, configs = [], {}
    for prefix in ("cdc", "crm"):
        path, _ = write_config(tmp_path / prefix, value_format="json",
                               tables=[{"name": "notes", "topic": f"{prefix}.public.notes"}])
        raw = yaml.safe_load(path.read_text())
        raw["dagster"] = {"prefix": prefix}
        path.write_text(yaml.safe_dump(raw))
        configs[prefix] = load_config(path)
        produce(configs[prefix], f"{prefix}.public.notes",
                [("c", {"id": i, "body": prefix}, 10 + i) for i in range(3 if prefix == "cdc" else 5)])
        built.append(build_definitions(configs[prefix], SparkIngestPipeline(config_path=str(path))))
    defs = dg.Definitions.merge(*built)
    dg.Definitions.validate_loadable(defs)
    crm = Names("crm", "crm_tables")
    graph = defs.get_repository_def().asset_graph
    assert graph.get_all_asset_keys() == {table_key("notes"), crm.table_key("notes")}
    assert graph.get(crm.table_key("notes")).group_name == "crm_tables"
    for name in ("cdc_ingest_all_tables", "crm_ingest_all_tables", "cdc_table_maintenance", "crm_table_maintenance"):
        assert defs.resolve_job_def(name) is not None
    assert {s.name for s in defs.sensors or []} == {"cdc_offsets_sensor", "crm_offsets_sensor"}  # type: ignore[union-attr]
    assert {s.name for s in defs.schedules or []} == {  # type: ignore[union-attr]
        "cdc_table_maintenance_daily", "crm_table_maintenance_daily"}

    job = defs.resolve_job_def("crm_ingest_all_tables")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert result.success
    [event] = result.get_asset_materialization_events()
    assert event.asset_key == crm.table_key("notes") and event.materialization.metadata["inserted"].value == 5
    assert not (configs["cdc"].tables_root / "notes").exists()  # the other pipeline's table was not touched
