"""``ingest verify --source-db``: every configured Delta table against a ``SELECT`` of its source table.

Steps:

1. read the source's WAL position and wait until Debezium's replication slots have confirmed it
   (:func:`ingest.verify.capture.wait_for_capture`): Kafka then holds every change committed before;
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError
from ingest.lake.delta import open_table, read_all
from ingest.verify.capture import CaptureResult, wait_for_capture
from ingest.verify.compare import TableVerification, verify_table
from ingest.verify.source_values import NotRepresentable, SourceColumn, column_plan

Say = Callable[[str], None]
_COLUMNS_QUERY = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typname, t.typtype, a.atttypmod,
       CASE WHEN t.typcategory = 'A' THEN et.typname END
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type et ON et.oid = t.typelem
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_KEY_QUERY = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


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


def read_source(conn: psycopg.Connection, schema: str, table: str,
                key_override: tuple[str, ...] | None = None) -> SourceRows:
    """Read ``schema.table`` with each compared column converted to the engine's value and type.

    Raises:
        ConfigError: the table does not exist or has neither a primary key nor an override.
    """
    relid = conn.execute("SELECT to_regclass(%s)::oid", (f'"{schema}"."{table}"',)).fetchone()
    if relid is None or relid[0] is None:
        raise ConfigError(f"source table {schema}.{table} does not exist")
    plans = [column_plan(*row) for row in conn.execute(_COLUMNS_QUERY, (relid[0],)).fetchall()]
    key = key_override or tuple(r[0] for r in conn.execute(_KEY_QUERY, (relid[0],)).fetchall())
    if not key:
        raise ConfigError(f"source table {schema}.{table} has no primary key; set primary_key in the configuration")
    compared = [p for p in plans if p.arrow is not None]
    notes = [f"column {p.name!r}: {p.note}" for p in plans if p.arrow is None]
    missing_key = [k for k in key if k not in {p.name for p in compared}]
    if missing_key:
        raise ConfigError(f"source table {schema}.{table}: key column(s) {missing_key} cannot be compared")
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(p.select for p in compared), sql.Identifier(schema), sql.Identifier(table))
    values: list[list[Any]] = [[] for _ in compared]
    unrepresentable = 0
    for row in conn.execute(query):
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
        dsn: libpq connection string of the source database.
        wait: seconds to wait for Debezium's slots, and again for the tables to catch up.
        say: receives progress lines.
        tables: only these configured tables (default: all).
        on_stall: restarts Kafka Connect if Debezium's slots stall (the project's own stack only;
            :func:`~ingest.verify.capture.wait_for_capture`).

    Returns:
        What was found; the tables are compared even when waiting timed out (for diagnosis).
    """
    say = say or (lambda _line: None)
    specs = [s for s in config.tables if tables is None or s.name in tables]
    say("waiting until Debezium has captured everything committed so far")
    capture = wait_for_capture(dsn, timeout=wait, say=say, on_stall=on_stall)
    say(f"  captured up to {capture.target_lsn} after {capture.seconds:.1f} s" if capture.ok
        else f"  NOT captured: {capture.problem}")
    catch_up = wait_for_tables(config, specs, wait=wait, say=say)
    checks = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for spec in specs:
            checks.append(check_table(config, spec, conn))
    return SourceVerification(capture, catch_up, checks)


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


def check_table(config: IngestConfig, spec: TableSpec, conn: psycopg.Connection) -> TableCheck:
    """Compare one configured table with its source table."""
    try:
        schema, table = source_table_of(spec)
    except ConfigError as exc:
        return TableCheck(spec.name, "?", error=str(exc))
    check = TableCheck(spec.name, f"{schema}.{table}")
    try:
        source = read_source(conn, schema, table, spec.primary_key)
    except (ConfigError, psycopg.Error) as exc:
        check.error = str(exc).strip().splitlines()[0]
        return check
    check.notes = list(source.notes)
    path = config.table_path(spec.name)
    check.verification = verify_table(spec.name, path, source.rows, source.key, normalizers=source.normalizers)
    check.unknown_rows, unknown_note = _unknown_values(path, source.key)
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
