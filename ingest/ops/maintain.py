"""Table maintenance: compaction, log checkpoint, vacuum, log clean-up, the tombstone purge.

The Dagster maintenance job (:mod:`assets.jobs`) and ``ingest maintain`` (:mod:`ingest.cli.maintain`)
run this same code. Maintenance commits carry ``cdc.maintenance`` in their commit info and never
``cdc.state``/``cdc.batch``, so the engine, which reads its progress and key from the newest commit
that has them, looks straight past them; Delta app transactions (the applied offsets) live in the
table's snapshot and survive any commit.

**Beside a live run: the writer lock, waited for a bounded time.** Maintenance writes a table only
while it holds the table's writer lock (:mod:`ingest.lake.locks`: ``flock`` on a local lake, the
lease on S3), the lock an ``ingest run`` or a Dagster run holds while it writes. ``ingest maintain``
waits for it up to ``wait`` seconds; a run that keeps it longer -- a continuous run keeps it for as
long as it runs -- leaves the table untouched, reported as skipped with the holder named. Delta's
optimistic concurrency was not chosen as the guard, for these reasons:

* delta-spark commits to S3 through Delta's single-driver log store, which does not make two JVMs'
  commits of one version exclusive: a maintenance process committing beside a run's Spark could
  overwrite its log entry. Only the lease keeps them apart.
* A continuous run keeps its tables and their remembered deletes open between batches on the
  understanding that nobody else writes them, and every commit that races one of its batches costs
  that batch a retry, three of them a stop and a catch-up.
* Vacuum with a short retention would delete the files of a MERGE that is written but not yet
  committed.
* Compaction against a MERGE that adds deletion vectors relies on conflict detection that Delta
  releases have got wrong before; the lock does not depend on it.

So a deployment whose runs never stop maintains its tables in a pause of the run (see
docs/operations.md), or with runs that drain and exit (``ingest run`` without ``--continuous``),
between which maintenance finds the lock free. Delta's conflict check stays the second line of
defence, as for two runs. The tables every run appends to (audit, quarantine) are maintained under
their shared lock, which a run takes only for each append: they are maintained beside a live run,
whose appends wait for the compaction.

**Dry run** and **many tables**: :mod:`ingest.ops.maintain_plan` says what this would do to a table
without writing anything; :mod:`ingest.ops.maintain_tables` maintains (or plans) a configuration's
tables one after the other, as ``ingest maintain`` does.

A table with deletion vectors (written by the delta-spark engine) is maintained with Spark SQL
instead -- ``OPTIMIZE`` (``ZORDER BY`` the key), ``VACUUM`` -- since delta-rs cannot write it; Delta
checkpoints and cleans its log itself after those commits. Every other table, whichever engine
wrote it, is maintained by delta-rs.

Log clean-up removes commit files older than ``delta.logRetentionDuration`` before the newest
checkpoint. The engine's newest commit info must survive it (it holds the primary key and the
truncate mark), so clean-up runs only while that commit is younger than the retention.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

from deltalake import CommitProperties, DeltaTable

from ingest.apply.moves import purge_moves
from ingest.commit.remembered import purge as purge_tombstones
from ingest.commit.state import latest_cdc_commit, load_state
from ingest.config import IngestConfig, TableSpec
from ingest.errors import TableLockedError
from ingest.lake import locks
from ingest.lake.delta import MAINTENANCE_KEY, has_deletion_vectors, open_table
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath, Location, s3_client

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: How often a maintenance waiting for a table's writer lock asks again.
LOCK_POLL_SECONDS = 0.5
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
             now: datetime | None = None, spark: Callable[[], SparkSession] | None = None,
             guard: Callable[[], None] | None = None) -> TableMaintenance:
    """Compact, vacuum, checkpoint and clean up one Delta table (any table, CDC or not).

    ``spark`` gives the session for a table with deletion vectors (default: a local one).
    ``guard`` is called before each step that commits or deletes (to raise if the writer lease is lost).
    """
    check = guard or (lambda: None)
    report = TableMaintenance(str(path))
    table = open_table(path)
    if table is None:
        report.exists = False
        return report
    now = now or datetime.now(UTC)
    report.version_before = table.version()
    if has_deletion_vectors(table):
        return _maintain_with_spark(table, LakePath.of(path), options, key_columns, report,
                                    session_factory(path, spark), check)
    commit = CommitProperties(custom_metadata={MAINTENANCE_KEY: options.layout})
    target = options.target_file_size_mb * 1024 * 1024
    metrics: dict[str, Any] = {}
    check()
    if options.layout == "zorder" and key_columns:
        metrics = table.optimize.z_order(list(key_columns), target_size=target, commit_properties=commit)
    elif options.layout in ("compact", "zorder"):
        metrics = table.optimize.compact(target_size=target, commit_properties=commit)
    report.files_removed = int(metrics.get("numFilesRemoved", 0))
    report.files_added = int(metrics.get("numFilesAdded", 0))
    if options.vacuum_retention_hours is not None:
        present = data_files(LakePath.of(path))
        check()
        removed = table.vacuum(retention_hours=options.vacuum_retention_hours, dry_run=False,
                               enforce_retention_duration=False,
                               commit_properties=CommitProperties(custom_metadata={MAINTENANCE_KEY: "vacuum"}))
        # delta-rs also names the files of removes still in the log that an earlier vacuum deleted
        report.vacuumed_files = len(present & {unquote(f) for f in removed})
    table = open_table(path) or table  # the new snapshot after optimize and vacuum
    if options.checkpoint:
        check()
        table.create_checkpoint()
        report.checkpoint_version = table.version()
    if options.cleanup_log:
        check()
        report.log_cleanup = _cleanup_log(table, now)
    table.update_incremental()
    report.version_after = table.version()
    return report


def session_factory(path: Location, spark: Callable[[], SparkSession] | None) -> Callable[[], SparkSession]:
    if spark is not None:
        return spark
    # pyspark only for tables that need it
    from ingest.spark.session import delta_session

    return partial(delta_session, s3=not LakePath.of(path).is_local)


def spark_sql(where: LakePath, options: MaintenanceOptions,
               session: Callable[[], SparkSession]) -> tuple[SparkSession, str]:
    """A session of its own for maintaining ``where`` with Spark SQL, and the table's name in it."""
    # pyspark only for tables that need it
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
    return spark, f"delta.{ident(spark_location(spark, where))}"


def _maintain_with_spark(table: DeltaTable, where: LakePath, options: MaintenanceOptions,
                         key_columns: tuple[str, ...] | None, report: TableMaintenance,
                         session: Callable[[], SparkSession], check: Callable[[], None]) -> TableMaintenance:
    """:func:`maintain` for a table delta-rs cannot write: delta-spark's OPTIMIZE and VACUUM."""
    # pyspark only for tables that need it
    from ingest.spark.sql import ident

    spark, name = spark_sql(where, options, session)
    if options.layout != "none":
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({MAINTENANCE_KEY: options.layout}))
        zorder = (f" ZORDER BY ({', '.join(ident(k) for k in key_columns)})"
                  if options.layout == "zorder" and key_columns else "")
        check()
        metrics = spark.sql(f"OPTIMIZE {name}{zorder}").collect()[0]["metrics"]
        report.files_removed, report.files_added = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
    if options.vacuum_retention_hours is not None:
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({MAINTENANCE_KEY: "vacuum"}))
        before = data_files(where)
        check()
        spark.sql(f"VACUUM {name} RETAIN {options.vacuum_retention_hours} HOURS")
        report.vacuumed_files = len(before - data_files(where))
    report.log_cleanup = "done by Delta (delta-spark checkpoints and expires the log itself)"
    table.update_incremental()
    report.version_after = table.version()
    return report


def data_files(where: LakePath) -> set[str]:
    """The table's files outside its log, relative to the table's root: what a vacuum may delete."""
    if where.is_local:
        return {p.relative_to(where.local).as_posix() for p in where.local.rglob("*")
                if p.is_file() and "_delta_log" not in p.parts}
    prefix = where.key + "/"
    pages = s3_client(where).get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=prefix)
    return {o["Key"].removeprefix(prefix) for page in pages for o in page.get("Contents", [])
            if not o["Key"].startswith(prefix + "_delta_log/")}


def acquire_writer_lock(config: IngestConfig, table: str, *, wait: float = 0.0) -> list[locks.WriterLock]:
    """The table's writer lock, asked for every :data:`LOCK_POLL_SECONDS` for up to ``wait`` seconds.

    Raises:
        TableLockedError: another writer still held it when the time was up.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            return locks.acquire_all(config.tables_root, [table], lease_seconds=config.target.storage.lease_seconds)
        except TableLockedError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(LOCK_POLL_SECONDS, left))


def maintain_cdc_table(config: IngestConfig, spec: TableSpec, options: MaintenanceOptions, *,
                       now: datetime | None = None, wait: float = 0.0) -> TableMaintenance:
    """Maintain a CDC target table and its tombstones, holding the table's writer lock.

    Deletes older than the table's ``tombstone_retention`` are forgotten.

    Args:
        wait: seconds to wait for the writer lock while a run holds it (default: none).

    Raises:
        TableLockedError: a run held the table for longer than ``wait`` (maintenance waits for the next time).
        ingest.lake.lease.LeaseLostError: on S3, the lease was lost meanwhile; nothing more was written.
    """
    now = now or datetime.now(UTC)
    paths = TablePaths.of(config, spec.name)
    held = acquire_writer_lock(config, spec.name, wait=wait)

    def guard() -> None:
        locks.check(paths.table)

    try:
        state = load_state(paths.table)
        # pyspark: a session for tables with deletion vectors only, with the configuration's master and settings
        from ingest.spark.session import session_for

        report = maintain(paths.table, options, key_columns=state.key_columns, now=now,
                          spark=lambda: session_for(config), guard=guard)
        guard()
        report.tombstones_purged = purge_tombstones(paths.tombstones, now - spec.tombstone_retention)
        stones = maintain(paths.tombstones, options, key_columns=state.key_columns, now=now, guard=guard)
        moves = purge_moves(paths.moves, now - spec.tombstone_retention)
    finally:
        locks.release_all(held)
    if moves:
        report.notes.append(f"moves: {moves} rows of primary-key moves older than the tombstone retention forgotten")
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
