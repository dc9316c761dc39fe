"""The maintenance job (one op per table, in the table's pool) and its schedule.

Each table's op runs in that table's concurrency pool, so maintenance never rewrites files under
a running ingestion of the same table. What it did is recorded as an observation of the table's
asset, so it shows in the asset's history in the UI.
"""

from collections.abc import Sequence
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from assets.constants import DEFAULT_NAMES, MAINTENANCE_TAG, Names
from assets.resources import IngestPipeline
from ingest.config import TableSpec
from ingest.ops.maintain import MaintenanceOptions, TableMaintenance, maintain_cdc_table, maintain_shared_table

MAINTENANCE_JOB = DEFAULT_NAMES.maintenance_job
MAINTENANCE_SCHEDULE = DEFAULT_NAMES.maintenance_schedule
#: Every day at 03:00 UTC.
MAINTENANCE_CRON = "0 3 * * *"


class MaintenanceConfig(dg.Config):
    """Run configuration of a maintenance op (the defaults suit a daily run)."""

    layout: Literal["compact", "zorder", "none"] = Field(
        default="compact",
        description="compact: bin-pack small files; zorder: rewrite clustered by primary key (whole table); "
        "none: leave files alone.",
    )
    vacuum_retention_hours: int = Field(
        default=168, ge=0, description="Delete unreferenced files older than this many hours (time travel limit)."
    )
    vacuum: bool = Field(default=True, description="Run vacuum at all.")
    checkpoint: bool = Field(default=True, description="Write a Delta log checkpoint at the current version.")
    cleanup_log: bool = Field(
        default=True,
        description="Remove expired log files; skipped while the engine's newest commit could expire with them.",
    )

    def options(self, target_file_size_mb: int) -> MaintenanceOptions:
        return MaintenanceOptions(layout=self.layout, target_file_size_mb=target_file_size_mb,
                                  vacuum_retention_hours=self.vacuum_retention_hours if self.vacuum else None,
                                  checkpoint=self.checkpoint, cleanup_log=self.cleanup_log)


def build_maintenance_op(spec: TableSpec, names: Names = DEFAULT_NAMES) -> dg.OpDefinition:
    """The op that maintains one CDC table and its tombstones."""

    @dg.op(name=names.op(f"maintain_{spec.name}"), pool=names.pool(spec.name), tags={MAINTENANCE_TAG: spec.name},
           required_resource_keys={names.resource},
           description=f"Compact, vacuum, checkpoint and clean up `{spec.name}`; forget tombstones older than "
           f"{spec.tombstone_retention}.")
    def _maintain(context: dg.OpExecutionContext, config: MaintenanceConfig) -> None:
        ingest_pipeline: IngestPipeline = getattr(context.resources, names.resource)
        settings = ingest_pipeline.config()
        report = maintain_cdc_table(settings, spec, config.options(settings.target.target_file_size_mb))
        context.log.info(f"{spec.name}: {report.as_dict()}")
        context.log_event(dg.AssetObservation(asset_key=names.table_key(spec.name), metadata=_metadata(report),
                                              description="table maintenance"))

    return _maintain


def build_shared_tables_op(names: Names = DEFAULT_NAMES) -> dg.OpDefinition:
    """The op that maintains the shared audit and quarantine tables."""

    @dg.op(name=names.op("maintain_audit_and_quarantine"), pool=names.shared_pool,
           required_resource_keys={names.resource},
           description="Compact, vacuum, checkpoint and clean up the shared audit and quarantine tables.")
    def _maintain(context: dg.OpExecutionContext, config: MaintenanceConfig) -> None:
        settings = getattr(context.resources, names.resource).config()
        for name in (settings.target.audit_table, settings.target.quarantine_table):
            options = config.options(settings.target.target_file_size_mb)
            report = maintain_shared_table(settings.tables_root / name, options)
            context.log.info(f"{name}: {report.as_dict()}")

    return _maintain


def build_maintenance_job(specs: Sequence[TableSpec], names: Names = DEFAULT_NAMES) -> dg.JobDefinition:
    """One job maintaining every configured table (independent ops) and the shared tables."""

    @dg.job(name=names.maintenance_job, tags={MAINTENANCE_TAG: "all"},
            description="Delta maintenance of every CDC table: compaction, vacuum, log checkpoint and clean-up, "
            "tombstone purge.")
    def _job() -> None:
        for spec in specs:
            build_maintenance_op(spec, names)()
        build_shared_tables_op(names)()

    return _job


def build_maintenance_schedule(job: dg.JobDefinition, *, cron: str = MAINTENANCE_CRON,
                               default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
                               names: Names = DEFAULT_NAMES) -> dg.ScheduleDefinition:
    """The daily schedule of the maintenance job."""
    return dg.ScheduleDefinition(name=names.maintenance_schedule, job=job, cron_schedule=cron, execution_timezone="UTC",
                                 default_status=default_status,
                                 description="Daily Delta maintenance of the CDC tables.")


def _metadata(report: TableMaintenance) -> dict[str, Any]:
    out: dict[str, Any] = {
        "version_before": report.version_before if report.version_before is not None else -1,
        "version_after": report.version_after if report.version_after is not None else -1,
        "files_removed": report.files_removed,
        "files_added": report.files_added,
        "vacuumed_files": report.vacuumed_files,
        "checkpoint_version": report.checkpoint_version if report.checkpoint_version is not None else -1,
        "log_cleanup": report.log_cleanup,
        "tombstones_purged": report.tombstones_purged,
    }
    if report.notes:
        out["notes"] = "; ".join(report.notes)
    return out
