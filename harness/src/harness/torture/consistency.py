"""End-state checks of the consistency proof: tables, keys, audit and quarantine against the source.

After any history of crashes, replays and lost checkpoints, a correct engine leaves:

* every table equal to the simulated source (:func:`harness.demo.verify_all`): no divergent rows;
* no primary key twice in a table (soft-deleted rows included);
* one audit row per engine commit and none for a commit the table lacks, each balanced
  (``received = inserted + updated + deleted + truncates + superseded + stale + quarantined + skipped``);
* every record of every topic received exactly once across the audit (no gap, no double count);
* every malformed message quarantined exactly once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ingest.commit.state import cdc_commits
from ingest.config import IngestConfig
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.records import audit, quarantine
from ingest.source.topiclog import TopicLog
from ingest.verify.compare import TableVerification

_BALANCE_TERMS = ("inserted", "updated", "deleted", "truncates", "superseded", "stale", "quarantined", "skipped")


@dataclass(slots=True)
class ConsistencyReport:
    """What :func:`check` found; ``ok`` only when every count that must be zero is zero."""

    verifications: list[TableVerification]
    divergent_rows: int = 0
    duplicate_keys: int = 0
    audit_rows: int = 0
    unbalanced_audit_rows: int = 0
    commits: int = 0
    records: int = 0
    received: int = 0
    quarantined: int = 0
    malformed: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.divergent_rows and not self.duplicate_keys \
            and not self.unbalanced_audit_rows


def check(config: IngestConfig) -> ConsistencyReport:
    """Check every configured table of a simulated workload (see module docstring)."""
    from harness.demo import truth_dir, verify_all
    from harness.simulator import Truth

    truth = Truth.load(truth_dir(config))
    report = ConsistencyReport(verify_all(config))
    for v in report.verifications:
        report.divergent_rows += v.missing + v.unexpected + v.different
        report.problems += [] if v.ok else [f"{v.table}: {e}" for e in v.examples]
    log = TopicLog(config.log_dir)
    for spec in config.tables:
        paths = TablePaths.of(config, spec.name)
        keys = truth.key_columns.get(spec.name) or spec.primary_key or ()
        records = sum(log.end_offsets(spec.topic).values()) if log.exists(spec.topic) else 0
        account_table(spec.name, spec.topic, paths, tuple(keys), records, report)
        _quarantine_once(spec.name, paths, truth.counts.get(spec.name, {}).get("malformed", 0), report)
    return report


def account_table(name: str, topic: str, paths: TablePaths, keys: tuple[str, ...], records: int,
                  report: ConsistencyReport) -> list[dict[str, Any]]:
    """The checks every proof runs on one table: keys once, audit balanced, one audit row per commit,
    every topic record received once. Adds to ``report``; returns the table's audit rows."""
    report.duplicate_keys += _duplicate_keys(paths, keys, report.problems)
    rows = audit.read(paths.audit, table=name).to_pylist()
    report.audit_rows += len(rows)
    report.unbalanced_audit_rows += sum(1 for r in rows if not _balanced(r))
    _audit_matches_commits(name, paths, rows, report)
    # A quarantine replay (batch -1) re-applies records its table had already received.
    received = sum(r["received"] for r in rows if r["batch_id"] >= 0)
    report.records += records
    report.received += received
    if received != records:
        report.problems.append(f"{name}: the audit accounts for {received} records but topic {topic} holds "
                               f"{records} ({'a gap' if received < records else 'a double count'})")
    return rows


def _balanced(row: dict[str, Any]) -> bool:
    return bool(row["balanced"]) and row["received"] == sum(row[t] or 0 for t in _BALANCE_TERMS)


def _duplicate_keys(paths: TablePaths, keys: tuple[str, ...], problems: list[str]) -> int:
    table = open_table(paths.table)
    if table is None or not keys:
        return 0
    rows = read_all(table, columns=list(keys))
    counts = Counter(zip(*(rows[k].to_pylist() for k in keys), strict=True))
    extra = sum(n - 1 for n in counts.values() if n > 1)
    if extra:
        example = next(k for k, n in counts.items() if n > 1)
        problems.append(f"{paths.table.name}: {extra} duplicate key rows, e.g. {example}")
    return extra


def _audit_matches_commits(name: str, paths: TablePaths, rows: list[dict[str, Any]], report: ConsistencyReport) -> None:
    table = open_table(paths.table)
    commits = {c["version"] for c in cdc_commits(table)} if table is not None else set()
    report.commits += len(commits)
    versions = Counter(r["delta_version"] for r in rows if r["delta_version"] is not None)
    missing = commits - set(versions)
    doubled = [v for v, n in versions.items() if n > 1]
    if missing or doubled:
        report.problems.append(f"{name}: audit rows missing for commits {sorted(missing)[:5]}, "
                               f"repeated for {sorted(doubled)[:5]}")
    phantom = set(versions) - commits  # an audit row for a commit the table does not have
    if phantom:
        report.problems.append(f"{name}: audit rows name versions {sorted(phantom)[:5]}, which are not commits "
                               "of this engine in the table")


def _quarantine_once(name: str, paths: TablePaths, malformed: int, report: ConsistencyReport) -> None:
    rows = quarantine.read(paths.quarantine, table=name).to_pylist()
    ids = Counter((r["topic"], r["partition"], r["offset"], r["stage"]) for r in rows)
    decode = sum(1 for r in rows if r["stage"] == "decode")
    report.quarantined += len(rows)
    report.malformed += malformed
    if any(n > 1 for n in ids.values()):
        report.problems.append(f"{name}: a message is quarantined more than once")
    if decode != malformed:
        report.problems.append(f"{name}: {decode} messages quarantined as undecodable, {malformed} were injected")
