"""The pipeline as a Dagster component: a ``dg`` project adds it with a ``defs.yaml``, without Python.

.. code-block:: yaml

    # <project>/defs/erp/defs.yaml
    type: assets.component.CdcIngestPipeline
    attributes:
      config_path: ../../../configs/erp.yaml   # relative to this file
      automation_running: true                 # sensors and schedule start when loaded

Everything else comes from the ingestion configuration: the tables, the names (``dagster.prefix``,
so two such folders with different prefixes live in one project), the mode (``run`` or
``observe``) and the checks' thresholds (:func:`assets.definitions.build_definitions`).
"""

from __future__ import annotations

import dagster as dg

from assets.definitions import build_definitions
from assets.resources import SparkIngestPipeline
from ingest.config import load_config
from ingest.source.discovery import with_discovered


class CdcIngestPipeline(dg.Component, dg.Model, dg.Resolvable):
    """CDC tables kept from Debezium topics by the ingestion engine: one asset per table, its checks,
    its sensor, its maintenance job and schedule, all from one ingestion configuration."""

    config_path: str
    workdir: str | None = None
    automation_running: bool = False

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        path = (context.path / self.config_path).resolve()
        workdir = str((context.path / self.workdir).resolve()) if self.workdir else None
        # tables found by discover.topic_pattern get their assets too; a reload of the location looks again
        config = with_discovered(load_config(path, workdir=workdir), strict=False)
        running = self.automation_running
        return build_definitions(
            config, SparkIngestPipeline(config_path=str(path), workdir=workdir),
            sensor_status=dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED,
            schedule_status=dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED)

