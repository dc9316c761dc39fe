"""The one place the Dagster definitions are assembled, from the ingestion configuration.

Every configured table becomes an asset (with its checks and its sensor), so adding a table to
the configuration adds an asset. ``dagster_project`` calls :func:`build_definitions` with the real
engine; tests call it with a stub or the real engine on a small workload.
"""

from __future__ import annotations

import dagster as dg

from assets.analytics import build_analytics_assets
from assets.checks import LagThresholds, build_table_checks
from assets.constants import DEFAULT_NAMES, Names
from assets.incremental import build_incremental_assets
from assets.jobs import build_maintenance_job, build_maintenance_schedule
from assets.observe import build_audit_sensor, build_observed_table
from assets.resources import IngestPipeline
from assets.sensors import DEFAULT_INTERVAL_SECONDS, build_offsets_sensor
from assets.tables import build_table_asset
from ingest.config import IngestConfig

INGEST_JOB = DEFAULT_NAMES.ingest_job


def build_definitions(config: IngestConfig, engine: IngestPipeline, *,
                      thresholds: LagThresholds | None = None,
                      sensor_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
                      sensor_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
                      schedule_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
                      ) -> dg.Definitions:
    """Assets, checks, sensors, jobs and schedule for ``config``, bound to ``engine``.

    Args:
        config: the ingestion configuration the assets are generated from.
        engine: the resource that drains tables (bound as ``ingest_pipeline``, or
            ``<prefix>_ingest_pipeline`` with another ``dagster.prefix``).
        thresholds: when the ``lag`` check calls a table stale (default: the configuration's
            ``dagster.max_lag_records`` and ``dagster.max_staleness``).
        sensor_interval_seconds: minimum seconds between two ticks of a table's sensor.
        sensor_status: whether the sensors start running when first loaded.
        schedule_status: whether the maintenance schedule starts running when first loaded.
    """
    thresholds = thresholds or LagThresholds(config.dagster.max_lag_records, config.dagster.max_staleness)
    names = Names(config.dagster.prefix, config.dagster.group or f"{config.dagster.prefix}_tables")
    checks = [build_table_checks(spec, thresholds, names) for spec in config.tables]
    if config.dagster.mode == "observe":  # a service applies the changes: Dagster records them
        maintenance = build_maintenance_job(config.tables, names)
        return dg.Definitions(
            assets=[build_observed_table(spec, names) for spec in config.tables], asset_checks=checks,
            sensors=[build_audit_sensor(list(config.tables), names=names, default_status=sensor_status)],
            jobs=[maintenance],
            schedules=[build_maintenance_schedule(maintenance, default_status=schedule_status, names=names)],
            resources={names.resource: engine})
    tables = [build_table_asset(spec, names) for spec in config.tables]
    maintenance = build_maintenance_job(config.tables, names)
    # the demo's analytic assets only when asked for: they expect the demo schema's columns
    analytics = ([*build_analytics_assets(config, names), *build_incremental_assets(config, names)]
                 if config.dagster.analytics else [])
    return dg.Definitions(
        assets=[*tables, *analytics],
        asset_checks=checks,
        sensors=[build_offsets_sensor(list(config.tables), minimum_interval_seconds=sensor_interval_seconds,
                                      default_status=sensor_status, names=names)],
        jobs=[maintenance,
              dg.define_asset_job(names.ingest_job, selection=dg.AssetSelection.groups(names.group),
                                  description="Drain every CDC table (each in its own step and pool).")],
        schedules=[build_maintenance_schedule(maintenance, default_status=schedule_status, names=names)],
        resources={names.resource: engine},
    )
