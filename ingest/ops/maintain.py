"""Table maintenance over delta-rs: compaction, log checkpoint, vacuum, log clean-up, tombstones.

The Dagster maintenance job (:mod:`assets.jobs`) calls it, and so will a command. Maintenance commits carry
``cdc.maintenance`` in their commit info and never ``cdc.state``/``cdc.batch``, so the engine,
which reads its progress and key from the newest commit that has them, looks straight past them;
Delta app transactions (the applied offsets) live in the table's snapshot and survive any commit.

Maintenance holds the same writer lock as an ingestion run (``ingest.lake.locks``), so it never
rewrites files under a run, whether the run came from Dagster or from ``ingest run``.

A table with deletion vectors (written by the delta-spark engine) is maintained with Spark SQL
instead -- ``OPTIMIZE`` (``ZORDER BY`` the key), ``VACUUM`` -- since delta-rs cannot write it; Delta
checkpoints and cleans its log itself after those commits. Every other table, whichever engine
wrote it, is maintained by delta-rs.

Log clean-up removes commit files older than ``delta.logRetentionDuration`` before the newest
checkpoint. The engine's newest commit info must survive it (it holds the primary key and the
truncate mark), so clean-up runs only while that commit is younger than the retention.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from deltalake import CommitProperties, DeltaTable

from ingest.commit.remembered import purge as purge_tombstones
from ingest.commit.state import latest_cdc_commit, load_state
from ingest.config import IngestConfig, TableSpec
from ingest.lake import locks
from ingest.lake.delta import has_deletion_vectors, open_table
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath, Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAINTENANCE_KEY = "cdc.maintenance"
_DEFAULT_LOG_RETENTION = timedelta(days=30)
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(second|minute|hour|day|week)s?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class MaintenanceOptions:
    """What maintenance does to a table.

    Args:
        layout: ``compact`` bin-packs small files; ``zorder`` rewrites the table clustered by its
            primary key (MERGE then touches fewer files, but every run rewrites the whole table);
            ``none`` leaves the files alone.
        target_file_size_mb: size of the files compaction writes.
        vacuum_retention_hours: files no longer referenced are deleted once older than this;
            ``None`` skips vacuum.
        checkpoint: write a Delta log checkpoint at the current version.
        cleanup_log: remove expired log files (guarded, see the module docstring).
    """

    layout: Literal["compact", "zorder", "none"] = "compact"
    target_file_size_mb: int = 8
    vacuum_retention_hours: int | None = 168
    checkpoint: bool = True
    cleanup_log: bool = True


@dataclass(slots=True)
class TableMaintenance:
    """What maintenance did to one Delta table."""

    path: str
    exists: bool = True
    version_before: int | None = None
    version_after: int | None = None
    files_removed: int = 0
    files_added: int = 0
    vacuumed_files: int = 0
    checkpoint_version: int | None = None
    log_cleanup: str = "skipped"
    tombstones_purged: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


def maintain(path: Location, options: MaintenanceOptions, *, key_columns: tuple[str, ...] | None = None,
             now: datetime | None = None, spark: Callable[[], SparkSession] | None = None) -> TableMaintenance:
    """Compact, vacuum, checkpoint and clean up one Delta table (any table, CDC or not).

    ``spark`` gives the session for a table with deletion vectors (default: a local one).
    """
    report = TableMaintenance(str(path))
    table = open_table(path)
    if table is None:
        report.exists = False
        return report
    now = now or datetime.now(UTC)
    report.version_before = table.version()
    if has_deletion_vectors(table):
        from ingest.spark.session import delta_session  # pyspark only for tables that need it

        where = LakePath.of(path)
        session = spark or partial(delta_session, s3=not where.is_local)
        return _maintain_with_spark(table, where, options, key_columns, report, session)
    commit = CommitProperties(custom_metadata={MAINTENANCE_KEY: options.layout})
    target = options.target_file_size_mb * 1024 * 1024
    metrics: dict[str, Any] = {}
    if options.layout == "zorder" and key_columns:
        metrics = table.optimize.z_order(list(key_columns), target_size=target, commit_properties=commit)
    elif options.layout in ("compact", "zorder"):
        metrics = table.optimize.compact(target_size=target, commit_properties=commit)
    report.files_removed = int(metrics.get("numFilesRemoved", 0))
    report.files_added = int(metrics.get("numFilesAdded", 0))
    if options.vacuum_retention_hours is not None:
        removed = table.vacuum(retention_hours=options.vacuum_retention_hours, dry_run=False,
                               enforce_retention_duration=False,
                               commit_properties=CommitProperties(custom_metadata={MAINTENANCE_KEY: "vacuum"}))
        report.vacuumed_files = len(removed)
    table = open_table(path) or table  # the new snapshot after optimize and vacuum
    if options.checkpoint:
        table.create_checkpoint()
        report.checkpoint_version = table.version()
    if options.cleanup_log:
        report.log_cleanup = _cleanup_log(table, now)
    table.update_incremental()
    report.version_after = table.version()
    return report


def _maintain_with_spark(table: DeltaTable, where: LakePath, options: MaintenanceOptions,
                         key_columns: tuple[str, ...] | None, report: TableMaintenance,
                         session: Callable[[], SparkSession]) -> TableMaintenance:
    """:func:`maintain` for a table delta-rs cannot write: delta-spark's OPTIMIZE and VACUUM."""
    import json

    from ingest.spark.session import spark_location
    from ingest.spark.sql import ident

    spark = session().newSession()  # its settings stay its own
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(options.target_file_size_mb * 1024 * 1024))
    # As delta-rs's vacuum here: the retention asked for is the user's choice, even below 7 days.
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # VACUUM lists the table's directories in this many tasks (Spark's default, 10,000, is for big
    # clusters: 68 s against 16 s for a small table on 2 cores).
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism",
                   str(spark.sparkContext.defaultParallelism))
    name = f"delta.{ident(spark_location(spark, where))}"
    if options.layout != "none":
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({MAINTENANCE_KEY: options.layout}))
        zorder = (f" ZORDER BY ({', '.join(ident(k) for k in key_columns)})"
                  if options.layout == "zorder" and key_columns else "")
        metrics = spark.sql(f"OPTIMIZE {name}{zorder}").collect()[0]["metrics"]
        report.files_removed, report.files_added = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
    if options.vacuum_retention_hours is not None:
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({MAINTENANCE_KEY: "vacuum"}))
        before = _data_files(where)
        spark.sql(f"VACUUM {name} RETAIN {options.vacuum_retention_hours} HOURS")
        report.vacuumed_files = len(before - _data_files(where))
    report.log_cleanup = "done by Delta (delta-spark checkpoints and expires the log itself)"
    table.update_incremental()
    report.version_after = table.version()
    return report


def _data_files(where: LakePath) -> set[str]:
    """The table's files outside its log: what a vacuum may delete."""
    if where.is_local:
        return {str(p) for p in where.local.rglob("*") if p.is_file() and "_delta_log" not in p.parts}
    from ingest.lake.location import s3_client

    pages = s3_client(where).get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key + "/")
    return {o["Key"] for page in pages for o in page.get("Contents", []) if "/_delta_log/" not in o["Key"]}


def maintain_cdc_table(config: IngestConfig, spec: TableSpec, options: MaintenanceOptions, *,
                       now: datetime | None = None) -> TableMaintenance:
    """Maintain a CDC target table and its tombstones, holding the table's writer lock.

    Deletes older than the table's ``tombstone_retention`` are forgotten.

    Raises:
        TableLockedError: a run is writing the table (maintenance waits for the next time).
    """
    now = now or datetime.now(UTC)
    paths = TablePaths.of(config, spec.name)
    held = locks.acquire_all(config.tables_root, [spec.name], lease_seconds=config.target.storage.lease_seconds)
    try:
        state = load_state(paths.table)
        from ingest.spark.session import session_for

        report = maintain(paths.table, options, key_columns=state.key_columns, now=now,
                          spark=lambda: session_for(config))  # the configuration's master and settings
        report.tombstones_purged = purge_tombstones(paths.tombstones, now - spec.tombstone_retention)
        stones = maintain(paths.tombstones, options, key_columns=state.key_columns, now=now)
    finally:
        locks.release_all(held)
    if stones.exists:
        report.notes.append(f"tombstones: {stones.files_removed} files compacted, {stones.vacuumed_files} vacuumed")
    return report


def maintain_shared_table(path: Location, options: MaintenanceOptions) -> TableMaintenance:
    """Maintain a table every run appends to (audit, quarantine), under its shared writer lock."""
    with locks.shared(path):
        return maintain(path, options)


def log_retention(table: DeltaTable) -> timedelta:
    """The table's ``delta.logRetentionDuration`` (Delta's default: 30 days)."""
    raw = table.metadata().configuration.get("delta.logRetentionDuration")
    match = _INTERVAL.match(raw or "")
    if not match:
        return _DEFAULT_LOG_RETENTION
    return timedelta(**{match.group(2).lower() + "s": int(match.group(1))})


def _cleanup_log(table: DeltaTable, now: datetime) -> str:
    latest = latest_cdc_commit(table)
    retention = log_retention(table)
    if latest is not None:
        stamp = latest.get("timestamp")
        committed = datetime.fromtimestamp(stamp / 1000, UTC) if isinstance(stamp, int | float) else None
        # A margin of a day keeps the engine's newest commit well clear of the expiry.
        if committed is None or now - committed > retention - timedelta(days=1):
            return "skipped: the engine's newest commit would expire with it"
    table.cleanup_metadata()
    return "done"
