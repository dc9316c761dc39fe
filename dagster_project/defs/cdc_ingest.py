"""The CDC tables, their checks, sensors and maintenance, built from the ingestion configuration."""

from __future__ import annotations

import dagster as dg

from assets.definitions import build_definitions
from assets.resources import SparkIngestEngine
from dagster_project.settings import LocationSettings
from ingest.config import load_config


@dg.definitions
def cdc_ingest() -> dg.Definitions:
    settings = LocationSettings.from_env()
    config = load_config(settings.config_path, workdir=settings.workdir)
    engine = SparkIngestEngine(config_path=str(settings.config_path),
                               workdir=str(settings.workdir) if settings.workdir else None)
    return build_definitions(
        config, engine,
        sensor_status=dg.DefaultSensorStatus.RUNNING if settings.automation_running else dg.DefaultSensorStatus.STOPPED,
        schedule_status=(dg.DefaultScheduleStatus.RUNNING if settings.automation_running
                         else dg.DefaultScheduleStatus.STOPPED),
    )
