"""Maintenance of many tables, as ``ingest maintain`` runs it: one after the other, each table's outcome
reported as it ends, and a table that fails or is held by a run leaving the others to go on -- unless
the lake itself failed it (its store's endpoint, credentials or bucket): every table lives there, so
the others are not tried, rather than each riding out ``target.storage.retry_seconds`` in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal

from ingest import secrets
from ingest.config import IngestConfig
from ingest.errors import LakeUnavailableError, TableLockedError
from ingest.ops.maintain import MaintenanceOptions, TableMaintenance, maintain_cdc_table, maintain_shared_table
from ingest.ops.maintain_plan import MaintenancePlan, plan_cdc_table, plan_shared_table

Status = Literal["done", "planned", "absent", "skipped", "failed"]


@dataclass(slots=True)
class TableOutcome:
    """What became of one table in :func:`maintain_tables`.

    ``status``: ``done`` (maintained), ``planned`` (a dry run's plan), ``absent`` (no table yet),
    ``skipped`` (a run kept the writer lock: ``reason`` names it), ``failed`` (``reason`` says why).
    """

    table: str
    status: Status
    seconds: float = 0.0
    reason: str | None = None
    report: TableMaintenance | None = None
    plan: MaintenancePlan | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "status": self.status, "seconds": round(self.seconds, 3), "reason": self.reason,
                "report": self.report.as_dict() if self.report else None,
                "plan": self.plan.as_dict() if self.plan else None}


def tables_to_maintain(config: IngestConfig, tables: list[str] | None = None) -> list[str]:
    """The tables :func:`maintain_tables` works on, in its order: ``tables``, or every configured
    table and then the shared audit and quarantine tables.

    Raises:
        ConfigError: a name in ``tables`` is not a configured table.
    """
    if tables:
        return [config.table(name).name for name in tables]
    return [*(spec.name for spec in config.tables), config.target.audit_table, config.target.quarantine_table]


def maintain_tables(config: IngestConfig, options: MaintenanceOptions, *, tables: list[str] | None = None,
                    dry_run: bool = False, wait: float = 0.0, now: datetime | None = None,
                    on_table: Callable[[TableOutcome], None] | None = None) -> list[TableOutcome]:
    """Maintain (or, ``dry_run``, plan) ``tables`` -- by default every configured table and the shared
    audit and quarantine tables -- one after the other; a table that fails or is held does not stop
    the others. A table the lake failed (:class:`~ingest.errors.LakeUnavailableError`) leaves the
    tables after it ``failed`` without trying them: they live in the same store.

    Raises:
        ConfigError: a name in ``tables`` is not a configured table (before anything is done).
    """
    shared = {config.target.audit_table, config.target.quarantine_table}
    jobs: list[tuple[str, Callable[[], TableMaintenance | MaintenancePlan]]] = []
    for name in tables_to_maintain(config, tables):
        if name in shared:
            path = config.tables_root / name
            jobs.append((name, partial(plan_shared_table if dry_run else maintain_shared_table, path, options)))
        elif dry_run:
            jobs.append((name, partial(plan_cdc_table, config, config.table(name), options, now=now)))
        else:
            jobs.append((name, partial(maintain_cdc_table, config, config.table(name), options, now=now, wait=wait)))
    outcomes: list[TableOutcome] = []
    lake_failed: str | None = None  # the table whose attempt found the lake unavailable
    for name, job in jobs:
        if lake_failed is not None:
            outcome = TableOutcome(name, "failed", reason=f"not tried: the lake failed table {lake_failed}")
        else:
            outcome, lake = _run(name, job)
            lake_failed = name if lake else None
        outcomes.append(outcome)
        if on_table is not None:
            on_table(outcome)
    return outcomes


def _run(name: str, job: Callable[[], TableMaintenance | MaintenancePlan]) -> tuple[TableOutcome, bool]:
    """The table's outcome, and whether the lake was unavailable to it."""
    started = time.perf_counter()
    try:
        result = job()
    except TableLockedError as exc:
        return TableOutcome(name, "skipped", time.perf_counter() - started,
                            secrets.redact(f"another writer holds the table ({exc.holder})")), False
    except Exception as exc:  # one table's failure is reported in its row; the others go on
        return (TableOutcome(name, "failed", time.perf_counter() - started, secrets.describe(exc)),
                isinstance(exc, LakeUnavailableError))
    seconds = time.perf_counter() - started
    if isinstance(result, MaintenancePlan):
        return TableOutcome(name, "planned" if result.exists else "absent", seconds, plan=result), False
    return TableOutcome(name, "done" if result.exists else "absent", seconds, report=result), False
