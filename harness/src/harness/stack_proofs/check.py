"""End-state checks after a run on the real stack: every table against its database, keys, audit, records.

The stack's counterpart of :func:`harness.torture.consistency.check` (which needs the simulator's truth):

* every table equals its PostgreSQL or MariaDB table (``verify --source-db``:
  :func:`ingest.ops.verify_source.verify_source_db`, which first waits for Debezium and for the
  tables to apply their topics' end offsets);
* no primary key twice in a Delta table;
* every audit row balanced
  (``received = inserted + updated + deleted + truncates + superseded + stale + quarantined + skipped``)
  and one audit row per engine commit;
* every record of every topic received exactly once across the audit (the topics were created
  empty by the reset, so a topic holds ``end offset`` records; Debezium's redeliveries are records
  too and must be counted once each);
* nothing quarantined: the stack runs no expectations suites, so a quarantined message is a real
  Debezium message the engine could not decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from harness.mariadb.capture import CONNECTOR as MARIADB_PREFIX
from harness.postgres.schema import TABLES
from harness.torture.consistency import ConsistencyReport, account_table
from ingest.config import IngestConfig
from ingest.lake.layout import TablePaths
from ingest.ops.verify_source import SourceVerification, verify_source_db
from ingest.records import quarantine
from ingest.source.sources import source_for
from ingest.verify.compare import TableVerification
from ingest.verify.source_db import source_table_of

Say = Callable[[str], None]
_SHOP_KEYS = {t.name: t.key for t in TABLES}


@dataclass(slots=True)
class StackCheck(ConsistencyReport):
    """What :func:`check_stack` found: the embedded proof's counts, plus the comparison with PostgreSQL."""

    verifications: list[TableVerification] = field(default_factory=list)
    verification: SourceVerification | None = None
    #: the MariaDB tables' comparison, when there are any
    mariadb_verification: SourceVerification | None = None
    #: changes the audit counts as ``stale`` (older than the row: Debezium's redeliveries, replays)
    stale: int = 0
    source_rows: int = 0
    delta_rows: int = 0

    @property
    def ok(self) -> bool:
        return (self.verification is not None and self.verification.ok
                and (self.mariadb_verification is None or self.mariadb_verification.ok) and not self.problems
                and not self.divergent_rows and not self.duplicate_keys and not self.unbalanced_audit_rows)


def check_stack(config: IngestConfig, dsn: str, *, wait: float = 300.0, say: Say | None = None,
                mariadb_url: str | None = None) -> StackCheck:
    """Run every check of the module docstring on ``config``'s tables against the database ``dsn``, and
    on the tables read from the stack's MariaDB connector against ``mariadb_url``."""
    say = say or (lambda _line: None)
    result = StackCheck()
    maria_tables = [s.name for s in config.tables if s.topic.startswith(f"{MARIADB_PREFIX}.")]
    pg_tables = [s.name for s in config.tables if s.name not in maria_tables]
    result.verification = verify_source_db(config, dsn, wait=wait, say=say, tables=pg_tables)
    _tally(result, result.verification)
    if maria_tables:
        if mariadb_url is None:
            raise ValueError(f"tables {maria_tables} come from MariaDB: pass mariadb_url")
        result.mariadb_verification = verify_source_db(config, mariadb_url, wait=wait, say=say, tables=maria_tables)
        _tally(result, result.mariadb_verification)
    source = source_for(config)
    for spec in config.tables:
        paths = TablePaths.of(config, spec.name)
        keys = spec.primary_key or _SHOP_KEYS.get(source_table_of(spec)[1], ())
        records = sum(source.end_offsets(spec.topic).values())
        rows = account_table(spec.name, spec.topic, paths, tuple(keys), records, result)
        result.stale += sum(r["stale"] or 0 for r in rows)
        held = quarantine.read(paths.quarantine, table=spec.name).to_pylist()
        result.quarantined += len(held)
        for row in held[:3]:
            result.problems.append(f"{spec.name}: quarantined {row['topic']}:{row['partition']}:{row['offset']} "
                                   f"({row['stage']}): {row['reason']}")
    return result


def _tally(result: StackCheck, v: SourceVerification) -> None:
    """Add one source database's comparison to ``result``: problems, rows, divergent rows."""
    if not v.capture.ok:
        result.problems.append(f"Debezium did not capture everything: {v.capture.problem}")
    if not v.catch_up.ok:
        result.problems.append(v.catch_up.problem or "the tables did not catch up")
    for table_check in v.tables:
        if table_check.error:
            result.problems.append(f"{table_check.table}: {table_check.error}")
        tv = table_check.verification
        if tv is None:
            continue
        result.source_rows += tv.expected_rows
        result.delta_rows += tv.actual_rows
        result.divergent_rows += tv.missing + tv.unexpected + tv.different
        result.problems += [f"{tv.table}: {e}" for e in tv.examples] if not tv.ok else []
