"""``ingest verify --source-db``: every configured Delta table against a ``SELECT`` of its source table.

Steps:

1. PostgreSQL: read the source's WAL position and wait until Debezium's replication slots have
   confirmed it (:func:`ingest.verify.capture.wait_for_capture`): Kafka then holds every change
   committed before. MariaDB/MySQL keep no such record of a connector's position
   (:func:`ingest.verify.mysql_source.wait_for_capture`), so step 3 is repeated until equal or timed out;
2. wait until each table has applied its topic's current end offsets
   (:func:`ingest.ops.status.table_status`, which asks the configured source), so a concurrently running
   ``ingest run --continuous`` can catch up;
3. compare each table with its source table (:func:`ingest.verify.source_db.check_table`).

The comparison is exact only for a quiescent source: rows written after step 1 are in the
``SELECT`` but not necessarily in the tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ingest.config import IngestConfig, TableSpec
from ingest.ops.status import table_status
from ingest.source.catalog import catalog_for
from ingest.verify.captured import CaptureResult
from ingest.verify.source_db import Say, TableCheck, check_table, source_database


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
