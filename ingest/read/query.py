"""SQL for analysts over the live rows of the Delta tables, with DuckDB; time travel and history.

Each configured table (and the audit and quarantine tables) is a DuckDB view over the delta-rs
dataset of its current version -- or of the version ``--as-of`` picks (:class:`AsOf`) -- read by
polars when it has deletion vectors; target-table views hold live rows only. :func:`history` lists
a table's commits with what the engine recorded in each.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from ingest.columns import normalize
from ingest.commit.state import BATCH_KEY, OFFSETS_KEY, decoded_commit
from ingest.config import IngestConfig
from ingest.errors import QueryError, first_line
from ingest.lake.delta import has_deletion_vectors, open_table, scan


class TimeTravelError(QueryError):
    """An ``--as-of`` that names no readable version of a table."""


class NotYetCreated(TimeTravelError):
    """The table had no commit yet at the time asked for."""


@dataclass(frozen=True, slots=True)
class AsOf:
    """A point in the tables' history: a version or a time, of one table (``table``) or of every one.

    A time applies to every table (each read at its latest commit at or before it); a version is a
    table's own, so one without a table applies only to the one table a query reads.
    """

    version: int | None = None
    time: datetime | None = None
    table: str | None = None

    @classmethod
    def parse(cls, text: str) -> AsOf:
        """``12``, ``orders@12``, ``2026-11-24T06:00:00Z`` or ``orders@2026-11-24 06:00``."""
        table, _, point = text.rpartition("@") if "@" in text else (None, "", text)
        point = point.strip()
        if point.isdigit():
            return cls(version=int(point), table=table or None)
        try:
            moment = datetime.fromisoformat(point.replace("Z", "+00:00"))
        except ValueError:
            raise TimeTravelError(f"--as-of {text!r}: expected a version (12), a time (2026-11-24T06:00:00Z), "
                                  "either one after a table name (orders@12)") from None
        return cls(time=moment if moment.tzinfo else moment.replace(tzinfo=UTC), table=table or None)

    @property
    def moment(self) -> datetime:
        assert self.time is not None, "a version, not a time"
        return self.time

    def describe(self) -> str:
        return f"version {self.version}" if self.version is not None else f"time {self.time:%Y-%m-%dT%H:%M:%S%z}"


def resolve_as_of(points: list[AsOf], sql: str, tables: list[str]) -> dict[str, AsOf]:
    """Which tables the points apply to: ``table -> point``.

    Raises:
        TimeTravelError: a point names an unknown table, or a bare version would apply to several tables.
    """
    out: dict[str, AsOf] = {}
    for point in points:
        if point.table is not None:
            if point.table not in tables:
                raise TimeTravelError(f"--as-of {point.table}@...: no table {point.table!r} (tables: "
                                      f"{', '.join(tables)})")
            out[point.table] = point
    for point in points:
        if point.table is not None:
            continue
        if point.time is not None:
            out.update({name: point for name in tables if name not in out})
            continue
        try:
            with duckdb.connect() as con:
                named = sorted(con.get_table_names(sql) & set(tables))
        except duckdb.Error:
            named = []
        unpinned = [name for name in named if name not in out]
        if len(unpinned) != 1:
            raise TimeTravelError(
                f"--as-of {point.version}: a version belongs to one table, and this query reads "
                f"{', '.join(unpinned) or 'none of the tables'}; name the table, e.g. --as-of "
                f"{(unpinned or tables or ['orders'])[0]}@{point.version}")
        out[unpinned[0]] = point
    return out


def load_at(path: Any, name: str, point: AsOf | None) -> DeltaTable | None:
    """The table at ``point`` (its current version without one); ``None`` if it does not exist.

    Raises:
        TimeTravelError: the version does not exist (or its files were vacuumed), or the table had
            no commit yet at that time.
    """
    table = open_table(path)
    if table is None or point is None:
        return table
    latest = table.version()
    if point.version is not None and not 0 <= point.version <= latest:
        raise TimeTravelError(f"{name}: no version {point.version} (versions 0..{latest})")
    version = point.version if point.version is not None else version_at(table, name, point.moment)
    try:
        table.load_as_version(version)
    except Exception as exc:  # delta-rs names the cause (log expired, files vacuumed)
        raise TimeTravelError(f"{name}: cannot read {point.describe()}: {exc}") from exc
    return table


def commit_times(table: DeltaTable, history: list[dict[str, Any]] | None = None) -> dict[int, datetime]:
    """Each version's commit time, as its commit info records it (what ``ingest history`` shows).

    ``history``: the table's ``history()``, when the caller has read it already.
    """
    return {int(c["version"]): datetime.fromtimestamp(c["timestamp"] / 1000, UTC)
            for c in (table.history() if history is None else history) if "timestamp" in c and "version" in c}


def version_at(table: DeltaTable, name: str, moment: datetime) -> int:
    """The table's latest version committed at or before ``moment``.

    Commit times are those of the commit infos (``ingest history``), not of the log files: a time
    copied from the history reads that very commit.

    Raises:
        NotYetCreated: the table's first commit is later.
    """
    times = commit_times(table)
    at_or_before = [v for v, t in times.items() if t <= moment]
    if not at_or_before:
        first = min(times.values())
        raise NotYetCreated(f"{name}: the table did not exist yet at {moment.isoformat()} "
                            f"(first commit {first.isoformat()})")
    return max(at_or_before)


def connect(config: IngestConfig, as_of: dict[str, AsOf] | None = None, absent: Collection[str] = ()
            ) -> tuple[duckdb.DuckDBPyConnection, list[Any]]:
    """A DuckDB connection with one view per table; keep the returned datasets alive while querying.

    ``as_of`` reads those tables at a past version or time (:func:`resolve_as_of`); ``absent``
    tables get no view (they had no commit at the point read).
    """
    con = duckdb.connect()
    keep: list[Any] = []
    root = config.tables_root
    names = [(t.name, True) for t in config.tables]
    names += [(config.target.audit_table, False), (config.target.quarantine_table, False)]
    for name, is_target in names:
        if name in absent:
            continue
        point = (as_of or {}).get(name)
        try:
            delta = load_at(root / name, name, point)
        except NotYetCreated:
            if point is None or point.table is not None:
                raise
            continue  # a time for every table: the ones created after it have no view (run_sql says so)
        if delta is None:
            continue
        # deltalake cannot read deletion vectors (delta-spark's tables): polars reads those. On an
        # object store polars reads too: a pyarrow dataset over S3 aborts the process at exit
        # (docs/s3-spike.md, "Side finding").
        eager = has_deletion_vectors(delta) or not root.is_local
        dataset = scan(delta).collect().to_arrow() if eager else delta.to_pyarrow_dataset()
        keep.append(dataset)
        raw = f"__raw_{name}"
        con.register(raw, dataset)
        where = " WHERE NOT coalesce(_cdc_deleted, false)" if is_target else ""
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "{raw}"{where}')
    return con, keep


def queryable(config: IngestConfig) -> list[str]:
    """The names ``ingest query`` knows: the configured tables, the audit and the quarantine."""
    return [t.name for t in config.tables] + [config.target.audit_table, config.target.quarantine_table]


def absent_table(config: IngestConfig, name: str) -> str:
    """Why ``name`` has no Delta table: not in the configuration, or no run has created it yet."""
    if name in queryable(config):
        return f"table {name}: no run has created it yet (under {config.tables_root})"
    return f"no table {name!r} in the configuration (its tables: {', '.join(queryable(config))})"


def _why_absent(config: IngestConfig, name: str, point: AsOf | None) -> str:
    """Why a time-travel query found no view of ``name``: created after the time read (and when it
    was), or no commit at the consistent point read."""
    try:
        load_at(config.tables_root / name, name, point)
    except NotYetCreated as exc:
        return str(exc)
    return f"{name}: no commit yet at the point asked for"


def _tables_held(con: duckdb.DuckDBPyConnection, config: IngestConfig) -> str:
    """Which tables a query can name, and which it cannot yet (no run has created them)."""
    views = {row[0] for row in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    held = [name for name in queryable(config) if name in views]
    missing = [name for name in queryable(config) if name not in views]
    note = f"tables: {', '.join(held) or 'none'}"
    return note + (f"; no run has created {', '.join(missing)} yet" if missing else "")


def run_sql(config: IngestConfig, sql: str, as_of: list[AsOf] | None = None, *, absent: Collection[str] = ()
            ) -> pa.Table:
    """Run one SQL statement and return its result as Arrow; ``as_of`` reads tables as they were
    (``absent``: tables that had no commit then)."""
    points = resolve_as_of(as_of, sql, queryable(config)) if as_of else None
    con, keep = connect(config, points, absent)
    if points or absent:
        absent = set(queryable(config)) - {row[0] for row in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
        try:
            named = con.get_table_names(sql) & absent
        except duckdb.Error:
            named = set()
        if named:
            con.close()
            raise TimeTravelError("; ".join(_why_absent(config, name, (points or {}).get(name))
                                            for name in sorted(named)))
    try:
        return normalize(con.sql(sql).to_arrow_table())
    except duckdb.Error as exc:  # the analyst's SQL: its first line says what and where
        raise QueryError(f"the query failed: {first_line(exc)} ({_tables_held(con, config)})") from None
    finally:
        con.close()
        del keep
        # Let pyarrow's scanner threads finish while the runtime is alive (arrow#34314).
        gc.collect()


@dataclass(slots=True)
class Commit:
    """One commit of a table, as ``ingest history`` lists it."""

    version: int
    time: datetime
    operation: str
    #: ``cdc`` (a batch the engine applied), ``replay`` (a quarantine replay), ``maintenance``, or
    #: ``other`` (a commit the engine did not make: a schema rewrite, a user's own write)
    kind: str
    batch_id: int | None = None
    run_id: str | None = None
    engine: str | None = None
    offsets: dict[str, int] | None = None
    received: int | None = None
    inserted: int | None = None
    updated: int | None = None
    deleted: int | None = None
    quarantined: int | None = None
    quality_status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


def history(config: IngestConfig, name: str, *, limit: int | None = None) -> list[Commit]:
    """A table's commits, newest first, with the batch, offsets, counts and quality each one carries.

    Raises:
        TimeTravelError: the table does not exist.
    """
    table = open_table(config.tables_root / name)
    if table is None:
        raise TimeTravelError(absent_table(config, name))
    out = []
    for raw in table.history(limit):
        info = decoded_commit(raw)
        batch = info.get(BATCH_KEY) or {}
        user = info.get("userMetadata")
        maintenance = "cdc.maintenance" in info or (isinstance(user, str) and "cdc.maintenance" in user)
        kind = ("replay" if batch.get("status") == "replayed" else "cdc") if batch else (
            "maintenance" if maintenance else "other")
        out.append(Commit(
            version=int(info["version"]), time=datetime.fromtimestamp(info["timestamp"] / 1000, UTC),
            operation=str(info.get("operation", "")), kind=kind, batch_id=batch.get("batch_id"),
            run_id=batch.get("run_id"), engine=batch.get("engine"), offsets=info.get(OFFSETS_KEY),
            received=batch.get("received"), inserted=batch.get("inserted"), updated=batch.get("updated"),
            deleted=batch.get("deleted"), quarantined=batch.get("quarantined"),
            quality_status=batch.get("quality_status")))
    return out


def offsets_text(offsets: dict[str, int] | None) -> str:
    """``topic:partition -> offset`` compactly: ``t:0=12 t:1=7``."""
    return " ".join(f"{k}={v}" for k, v in (offsets or {}).items()) if offsets else ""


def history_json(commits: list[Commit]) -> str:
    return "\n".join(json.dumps(c.as_dict(), default=str) for c in commits)
