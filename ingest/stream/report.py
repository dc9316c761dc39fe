"""What a run did, per table: the report ``ingest run`` prints and the Dagster assets record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ingest.records.audit import AuditRecord

if TYPE_CHECKING:
    from ingest.cuts.publish import Outcome


@dataclass(slots=True)
class TableRun:
    """What one table did during a run."""

    table: str
    batches: list[AuditRecord] = field(default_factory=list)
    already_applied: int = 0
    error: str | None = None
    #: the table stopped because something outside did not answer or refused (source, registry, lake)
    unavailable: bool = False
    #: errors this table stopped on and recovered from during the run (continuous runs)
    recovered: list[str] = field(default_factory=list)
    #: the run was stopped (Ctrl-C) while this table's batch ran: it was cancelled before its commit,
    #: nothing of it was written, and the next run applies it
    interrupted: bool = False

    def total(self, attr: str) -> int:
        return sum(getattr(b, attr) for b in self.batches)


@dataclass(slots=True)
class RunReport:
    run_id: str
    tables: dict[str, TableRun]
    seconds: float = 0.0
    #: when the run began (``time.perf_counter``), and how long until its first micro-batch began
    started: float = field(default_factory=time.perf_counter)
    startup_seconds: float | None = None
    #: every table's Delta log already held every offset the source has: Spark was not started
    caught_up: bool = False
    #: the driver applied every table's backlog alone (``source.driver_seconds``): Spark was not started
    on_driver: bool = False
    #: cuts across tables (``source.transactions``): the latest, and what holds newer ones back
    cuts: Outcome | None = None

    @property
    def failed(self) -> list[str]:
        return [name for name, t in self.tables.items() if t.error]

    def add_before(self, earlier: RunReport) -> None:
        """Take in what an earlier part of the same run did (the driver, before it handed over to Spark)."""
        self.seconds += earlier.seconds
        for name, done in earlier.tables.items():
            table = self.tables.setdefault(name, TableRun(name))
            table.batches[:0] = done.batches
            table.already_applied += done.already_applied
            if done.error and not table.error:
                table.recovered.append(done.error)
