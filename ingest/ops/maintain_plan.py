"""Maintenance's dry run: what :func:`~ingest.ops.maintain.maintain` would do to a table now, without writing
anything or taking a lock -- the files compaction would rewrite (delta-rs's bin-packing, estimated
from the file sizes), the files vacuum would delete (Delta's own dry run), the remembered deletes
older than the retention.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from ingest.commit.remembered import purgeable
from ingest.commit.state import load_state
from ingest.config import IngestConfig, TableSpec
from ingest.lake.delta import has_deletion_vectors, open_table
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath, Location
from ingest.ops.maintain import MaintenanceOptions, data_files, session_factory, spark_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file of a table's snapshot."""

    path: str
    size: int


@dataclass(slots=True)
class MaintenancePlan:
    """What maintenance would do to one Delta table (a dry run).

    Attributes:
        maintained_by: ``delta-rs``, or ``delta-spark`` for a table with deletion vectors.
        compact: the files compaction would rewrite (an estimate for ``compact``: see :func:`plan`).
        vacuum: the files vacuum would delete now.
        tombstones_to_purge: remembered deletes older than the table's ``tombstone_retention``.
    """

    path: str
    exists: bool = True
    version: int | None = None
    maintained_by: str = "delta-rs"
    compact: list[DataFile] = field(default_factory=list)
    vacuum: list[str] = field(default_factory=list)
    tombstones_to_purge: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def compact_bytes(self) -> int:
        return sum(f.size for f in self.compact)

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]
        out["compact"] = [{"path": f.path, "size": f.size} for f in self.compact]
        out["compact_bytes"] = self.compact_bytes
        return out




def plan(path: Location, options: MaintenanceOptions, *, key_columns: tuple[str, ...] | None = None,
         spark: Callable[[], SparkSession] | None = None) -> MaintenancePlan:
    """What :func:`~ingest.ops.maintain.maintain` would do to one table now, without writing anything or taking a lock.

    Compaction's files are those delta-rs's bin-packing picks: per partition, the files no larger
    than the target size, packed largest first into bins of at most the target size, a bin of one
    file left alone (delta-spark's ``OPTIMIZE`` packs the same way and also rewrites a file whose
    deletion vector it folds in). Z-order rewrites every file. Vacuum's files come from Delta's
    own dry run (``VACUUM ... DRY RUN`` for a table with deletion vectors).
    """
    where = LakePath.of(path)
    out = MaintenancePlan(str(path))
    table = open_table(where)
    if table is None:
        out.exists = False
        return out
    out.version = table.version()
    spark_table = has_deletion_vectors(table)
    out.maintained_by = "delta-spark" if spark_table else "delta-rs"
    files, with_vectors, partitions = _snapshot_files(table)
    target = options.target_file_size_mb * 1024 * 1024
    if options.layout == "zorder" and key_columns:
        out.compact = files
    elif options.layout != "none":
        out.compact = _compaction_candidates(files, partitions, target, with_vectors if spark_table else set())
    if options.vacuum_retention_hours is not None:
        if spark_table:
            session, name = spark_sql(where, options, session_factory(where, spark))
            rows = session.sql(f"VACUUM {name} RETAIN {options.vacuum_retention_hours} HOURS DRY RUN").collect()
            out.vacuum = sorted(data_files(where) & {_relative(where, str(r[0])) for r in rows})  # not directories
        else:
            listed = table.vacuum(retention_hours=options.vacuum_retention_hours, dry_run=True,
                                  enforce_retention_duration=False)
            out.vacuum = sorted(data_files(where) & {unquote(f) for f in listed})  # files still there
    return out


def plan_cdc_table(config: IngestConfig, spec: TableSpec, options: MaintenanceOptions, *,
                   now: datetime | None = None) -> MaintenancePlan:
    """:func:`plan` for a CDC target table, with its tombstones older than ``tombstone_retention``."""
    now = now or datetime.now(UTC)
    paths = TablePaths.of(config, spec.name)
    state = load_state(paths.table)
    # pyspark: a session for tables with deletion vectors only, with the configuration's master and settings
    from ingest.spark.session import session_for

    out = plan(paths.table, options, key_columns=state.key_columns, spark=lambda: session_for(config))
    out.tombstones_to_purge = purgeable(paths.tombstones, now - spec.tombstone_retention)
    stones = plan(paths.tombstones, options, key_columns=state.key_columns)
    if stones.exists:
        out.notes.append(f"tombstones: {len(stones.compact)} files to compact, {len(stones.vacuum)} to vacuum")
    return out


def plan_shared_table(path: Location, options: MaintenanceOptions) -> MaintenancePlan:
    """:func:`plan` for the audit or the quarantine table."""
    return plan(path, options)


def _snapshot_files(table: DeltaTable) -> tuple[list[DataFile], set[str], list[tuple[Any, ...]]]:
    """The snapshot's data files, those with a deletion vector, and each file's partition values."""
    actions = pa.table(table.get_add_actions(flatten=True))
    rows = actions.to_pylist()
    partition_columns = [c for c in actions.column_names if c.startswith("partition.")]
    vector_column = next((c for c in actions.column_names if c.startswith("deletionVector.")), None)
    files = [DataFile(str(r["path"]), int(r["size_bytes"] or 0)) for r in rows]
    vectors = {str(r["path"]) for r in rows if vector_column and r[vector_column] is not None}
    partitions = [tuple(r[c] for c in partition_columns) for r in rows]
    return files, vectors, partitions


def _compaction_candidates(files: list[DataFile], partitions: list[tuple[Any, ...]], target: int,
                           with_vectors: set[str]) -> list[DataFile]:
    """The files a bin-packing compaction rewrites (see :func:`plan`)."""
    by_partition: dict[tuple[Any, ...], list[DataFile]] = defaultdict(list)
    for f, part in zip(files, partitions, strict=True):
        if f.size <= target or f.path in with_vectors:
            by_partition[part].append(f)
    picked: list[DataFile] = []
    for small in by_partition.values():
        bins: list[list[DataFile]] = []
        for f in sorted(small, key=lambda f: f.size, reverse=True):
            fits = next((b for b in bins if sum(g.size for g in b) + f.size <= target), None)
            if fits is None:
                bins.append([f])
            else:
                fits.append(f)
        picked += [f for b in bins for f in b if len(b) > 1 or f.path in with_vectors]
    return picked


def _relative(where: LakePath, path: str) -> str:
    """A file path Spark gives (a URI) relative to the table's root."""
    root = (where.local.as_posix() if where.is_local else where.key).rstrip("/") + "/"
    return unquote(path).split(root, 1)[-1]
