"""``ingest verify --source-db``: every configured Delta table against a ``SELECT`` of its source table.

Steps:

1. PostgreSQL: read the source's WAL position and wait until Debezium's replication slots have
   confirmed it (:func:`ingest.verify.capture.wait_for_capture`): Kafka then holds every change
   committed before. MariaDB/MySQL keep no such record of a connector's position
   (:func:`ingest.verify.mysql_source.wait_for_capture`), so step 3 is repeated until equal or timed out;
2. wait until each table has applied its topic's current end offsets
   (:func:`ingest.ops.status.table_status`, which asks the configured source), so a concurrently running
   ``ingest run --continuous`` can catch up;
3. compare each table's live rows (``_cdc_*`` columns dropped) with the source rows converted to
   the engine's representation (:mod:`ingest.verify.source_values`), key by key
   (:func:`ingest.verify.compare.verify_table`).

The comparison is exact only for a quiescent source: rows written after step 1 are in the
``SELECT`` but not necessarily in the tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ingest import secrets
from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError, EnvironmentProblem, SourceUnavailableError, first_line
from ingest.lake.delta import open_table, read_all
from ingest.verify.captured import CaptureResult
from ingest.verify.compare import TableVerification, verify_table
from ingest.verify.source_values import NotRepresentable, SourceColumn

Say = Callable[[str], None]


class SourceDatabase(Protocol):
    """What ``verify`` (and ``resnapshot`` through a signal table) needs of a source database (a module:
    :mod:`ingest.verify.pg_source`, :mod:`ingest.verify.mysql_source`)."""

    @property
    def Error(self) -> type[Exception]:
        """What its client raises."""

    @property
    def OperationalError(self) -> type[Exception]:
        """What its client raises when it cannot connect."""

    def connect(self, dsn: str) -> AbstractContextManager[Any]: ...

    def read_columns(self, conn: Any, schema: str, table: str, key_override: tuple[str, ...] | None
                     ) -> tuple[list[SourceColumn], tuple[str, ...], Iterator[tuple[Any, ...]]]: ...

    def wait_for_capture(self, dsn: str, *, timeout: float = 120.0, say: Say | None = None,
                         on_stall: Callable[[], object] | None = None) -> CaptureResult: ...

    def describe(self, dsn: str) -> str: ...

    def insert_signal(self, conn: Any, table: str, row: tuple[str, str, str]) -> None: ...


def source_table_of(spec: TableSpec) -> tuple[str, str]:
    """``(schema, table)`` of a configured table's source: ``source_table``, else from the topic name.

    Raises:
        ConfigError: no ``source_table`` and the topic is not ``<prefix>.<schema>.<table>``.
    """
    name = spec.source_table
    if name is None:
        parts = spec.topic.split(".")
        if len(parts) != 3 or not all(parts):
            raise ConfigError(f"table {spec.name!r}: topic {spec.topic!r} is not <prefix>.<schema>.<table>; "
                              "set source_table: <schema>.<table> in the configuration")
        return parts[1], parts[2]
    schema, table = name.split(".")
    return schema, table


@dataclass
class SourceRows:
    """A source table read in the engine's representation."""

    rows: pa.Table
    key: tuple[str, ...]
    columns: list[SourceColumn]
    notes: list[str] = field(default_factory=list)

    @property
    def normalizers(self) -> dict[str, Callable[[Any], Any]]:
        return {c.name: c.normalize for c in self.columns if c.normalize is not None and c.arrow is not None}


def extra_of(dsn: str) -> str:
    """The distribution's extra whose client reads ``dsn``: ``mariadb`` for ``mysql://`` and
    ``mariadb://`` URLs, ``postgres`` for anything else (a libpq connection string)."""
    return "mariadb" if dsn.split("://", 1)[0].lower() in ("mysql", "mariadb") else "postgres"


def source_database(dsn: str) -> SourceDatabase:
    """The module that reads the source database ``dsn`` names.

    ``mysql://`` and ``mariadb://`` URLs are MariaDB or MySQL (:mod:`ingest.verify.mysql_source`);
    anything else is a libpq connection string (:mod:`ingest.verify.pg_source`).

    Raises:
        EnvironmentProblem: that database's client library (an extra of the distribution) is not
            installed: one line naming the extra.
    """
    # Each source's client library is an extra of the distribution (postgres, mariadb): only the one
    # this source needs is loaded.
    try:
        if extra_of(dsn) == "mariadb":
            from ingest.verify import mysql_source  # PyMySQL: the mariadb extra

            return mysql_source
        from ingest.verify import pg_source  # psycopg: the postgres extra

        return pg_source
    except ImportError as exc:
        raise EnvironmentProblem(f"reaching a source database needs {exc.name}, which is not installed: "
                                 f"pip install 'cdc-lakehouse-ingest[{extra_of(dsn)}]'") from None


@contextmanager
def reached(source: SourceDatabase, where: str) -> Iterator[None]:
    """Turn a connection failure of ``source`` into one redacted line naming ``where``.

    Raises:
        SourceUnavailableError: the database did not take the connection.
    """
    try:
        yield
    except source.OperationalError as exc:
        raise SourceUnavailableError(secrets.redact(f"source database {where}: {first_line(exc)}")) from None


def read_source(source: SourceDatabase, conn: Any, schema: str, table: str,
                key_override: tuple[str, ...] | None = None) -> SourceRows:
    """Read ``schema.table`` with each compared column converted to the engine's value and type.

    Raises:
        ConfigError: the table does not exist or has neither a primary key nor an override.
    """
    plans, key, rows = source.read_columns(conn, schema, table, key_override)
    if not key:
        raise ConfigError(f"source table {schema}.{table} has no primary key; set primary_key in the configuration")
    compared = [p for p in plans if p.arrow is not None]
    notes = [f"column {p.name!r}: {p.note}" for p in plans if p.arrow is None]
    missing_key = [k for k in key if k not in {p.name for p in compared}]
    if missing_key:
        raise ConfigError(f"source table {schema}.{table}: key column(s) {missing_key} cannot be compared")
    values: list[list[Any]] = [[] for _ in compared]
    unrepresentable = 0
    for row in rows:
        for i, (plan, value) in enumerate(zip(compared, row, strict=True)):
            if value is not None and plan.convert is not None:
                try:
                    value = plan.convert(value)
                except NotRepresentable as exc:
                    unrepresentable += 1
                    if unrepresentable <= 3:
                        notes.append(f"column {plan.name!r}: {exc}; compared as null (the engine quarantines it)")
                    value = None
            values[i].append(value)
    arrays = {p.name: pa.array(v, type=p.arrow) for p, v in zip(compared, values, strict=True)}
    return SourceRows(pa.table(arrays), key, plans, notes)


@dataclass
class TableCheck:
    """One configured table against its source table."""

    table: str
    source_table: str
    verification: TableVerification | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    unknown_rows: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.verification is not None and self.verification.ok


@dataclass
class CatchUp:
    """Whether every table applied its topic's end offsets in time."""

    ok: bool
    seconds: float
    lag: dict[str, int | None] = field(default_factory=dict)
    problem: str | None = None


@dataclass
class SourceVerification:
    """The whole ``verify --source-db`` outcome; ``ok`` only when caught up and every table is equal."""

    capture: CaptureResult
    catch_up: CatchUp
    tables: list[TableCheck]

    @property
    def ok(self) -> bool:
        return self.capture.ok and self.catch_up.ok and all(t.ok for t in self.tables)


def verify_source_db(config: IngestConfig, dsn: str, *, wait: float = 120.0, say: Say | None = None,
                     tables: list[str] | None = None, on_stall: Callable[[], object] | None = None
                     ) -> SourceVerification:
    """Wait for Debezium and the engine, then compare every configured table with its source table.

    Args:
        config: the ingestion configuration (tables, their topics and Delta locations).
        dsn: the source database: a libpq connection string, or a ``mysql://`` / ``mariadb://`` URL.
        wait: seconds to wait for Debezium's capture, and again for the tables to catch up.
        say: receives progress lines.
        tables: only these configured tables (default: all).
        on_stall: restarts Kafka Connect if Debezium's slots stall (the project's own stack only;
            :func:`~ingest.verify.capture.wait_for_capture`).

    Returns:
        What was found; the tables are compared even when waiting timed out (for diagnosis). Where
        the source cannot show how far Debezium has read (MariaDB/MySQL: the connector keeps its binlog
        position to itself), the tables are compared again, each time they have caught up, until they
        are equal or ``wait`` has passed.
    """
    say = say or (lambda _line: None)
    source = source_database(dsn)
    specs = [s for s in config.tables if tables is None or s.name in tables]
    say("waiting until Debezium has captured everything committed so far")
    capture = source.wait_for_capture(dsn, timeout=wait, say=say, on_stall=on_stall)
    if not capture.visible:
        say(f"  the source is at {capture.target_lsn}; how far Debezium has read it does not show, so the "
            "tables are compared until equal" if capture.target_lsn else "  how far Debezium has read the "
            "source does not show, so the tables are compared until equal")
    elif capture.ok:
        say(f"  captured up to {capture.target_lsn} after {capture.seconds:.1f} s")
    else:
        say(f"  NOT captured: {capture.problem}")
    started = time.monotonic()
    rounds = 0
    while True:
        catch_up = wait_for_tables(config, specs, wait=wait, say=say if rounds == 0 else lambda _line: None)
        with source.connect(dsn) as conn:
            checks = [check_table(config, spec, conn, source) for spec in specs]
        settled = all(c.ok for c in checks) or any(c.error for c in checks)  # an error does not pass by waiting
        if capture.visible or settled or time.monotonic() - started >= wait:
            return SourceVerification(capture, catch_up, checks)
        if rounds == 0:
            say(f"  not equal yet: comparing again, each time the tables have caught up, for up to {wait:.0f} s")
        rounds += 1
        time.sleep(2.0)


def wait_for_tables(config: IngestConfig, specs: list[TableSpec], *, wait: float, say: Say) -> CatchUp:
    """Wait until every table's applied offsets reach its topic's end offsets (lag 0)."""
    from ingest.ops.status import table_status  # delta-rs: only when waiting for tables
    from ingest.source.catalog import catalog_for

    names = {s.name for s in specs}
    started = time.monotonic()
    last_said = started
    source = catalog_for(config)
    while True:
        statuses = [s for s in table_status(config, source=source) if s.table in names]
        lag = {s.table: s.lag for s in statuses}
        errors = sorted({s.source_error for s in statuses if s.source_error})
        elapsed = time.monotonic() - started
        if not errors and all(v == 0 for v in lag.values()):
            say(f"  every table has applied its topic's end offsets ({elapsed:.1f} s)")
            return CatchUp(True, elapsed, lag)
        if elapsed >= wait:
            problem = ("source unavailable, lag unknown: " + "; ".join(errors)) if errors else (
                f"tables not caught up after {wait:.0f} s: "
                + ", ".join(f"{t} lag {n}" for t, n in sorted(lag.items()) if n))
            say(f"  {problem}")
            return CatchUp(False, elapsed, lag, problem)
        if time.monotonic() - last_said >= 5.0:
            pending = ", ".join(f"{t} {'unknown' if n is None else n}" for t, n in sorted(lag.items()) if n != 0)
            say(f"  waiting for the tables to apply their topics (lag: {pending})")
            last_said = time.monotonic()
        time.sleep(1.0)


def check_table(config: IngestConfig, spec: TableSpec, conn: Any, source: SourceDatabase) -> TableCheck:
    """Compare one configured table with its source table (``conn``: a connection of ``source``)."""
    try:
        schema, table = source_table_of(spec)
    except ConfigError as exc:
        return TableCheck(spec.name, "?", error=str(exc))
    check = TableCheck(spec.name, f"{schema}.{table}")
    try:
        rows = read_source(source, conn, schema, table, spec.primary_key)
    except (ConfigError, source.Error) as exc:
        check.error = first_line(exc)
        return check
    check.notes = list(rows.notes)
    path = config.table_path(spec.name)
    check.verification = verify_table(spec.name, path, rows.rows, rows.key, normalizers=rows.normalizers)
    check.unknown_rows, unknown_note = _unknown_values(path, rows.key)
    if unknown_note:
        check.notes.append(unknown_note)
    return check


def _unknown_values(path: Any, key: tuple[str, ...]) -> tuple[int, str | None]:
    """Live rows whose ``_cdc_unknown_columns`` is not empty (an unchanged-TOAST value never seen)."""

    delta = open_table(path)
    if delta is None:
        return 0, None
    names = {f.name for f in delta.schema().fields}
    if "_cdc_unknown_columns" not in names or not set(key) <= names:
        return 0, None
    rows = read_all(delta, columns=[*key, "_cdc_unknown_columns", *(["_cdc_deleted"] if "_cdc_deleted" in names
                                                                      else [])])
    if "_cdc_deleted" in rows.column_names:
        rows = rows.filter(pc.invert(pc.fill_null(rows["_cdc_deleted"], False)))
    marked = [r for r in rows.to_pylist() if r["_cdc_unknown_columns"]]
    if not marked:
        return 0, None
    sample = ", ".join("(" + ", ".join(f"{k}={r[k]!r}" for k in key) + f") {r['_cdc_unknown_columns']}"
                       for r in marked[:3])
    return len(marked), (f"{len(marked)} live row(s) hold values the engine marked unknown (unchanged TOAST "
                         f"with no stored value, written as null), e.g. {sample}")
