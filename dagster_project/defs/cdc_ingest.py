"""The CDC tables, their checks, sensors and maintenance, built from the ingestion configuration."""

from __future__ import annotations

import dagster as dg

from assets.definitions import build_definitions
from assets.resources import SparkIngestPipeline
from dagster_project.settings import LocationSettings
from ingest.config import load_config
from ingest.source.discovery import with_discovered


@dg.definitions
def cdc_ingest() -> dg.Definitions:
    settings = LocationSettings.from_env()
    # Tables found by discover.topic_pattern get their assets too; a reload of the location looks again.
    config = with_discovered(load_config(settings.config_path, workdir=settings.workdir), strict=False)
    engine = SparkIngestPipeline(config_path=str(settings.config_path),
                               workdir=str(settings.workdir) if settings.workdir else None)
    return build_definitions(
        config, engine,
        sensor_status=dg.DefaultSensorStatus.RUNNING if settings.automation_running else dg.DefaultSensorStatus.STOPPED,
        schedule_status=(dg.DefaultScheduleStatus.RUNNING if settings.automation_running
                         else dg.DefaultScheduleStatus.STOPPED),
    )
