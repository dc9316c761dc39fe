"""A query's stopped tables: why each stopped, and when a continuous run tries it again.

A table whose batch fails stops alone; the query's other tables go on. Its offsets stay where its
Delta log has them, so the next run resumes there. In a continuous run (``retry_stopped``) a table
whose error was transient (a registry or broker that did not answer, a concurrent writer) is tried
again after ``source.retry_stopped_seconds``, doubling with each stop up to
:data:`RETRY_MAX_SECONDS`; any other error (quality policy ``fail``, an incompatible schema, a bad
configuration) stops it until the run is restarted.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from ingest import logs, secrets
from ingest.config import IngestConfig, TableSpec
from ingest.errors import is_cancellation, is_transient, is_unavailability
from ingest.stream.report import RunReport

if TYPE_CHECKING:
    from ingest.metrics import RunMetrics

log = logging.getLogger(__name__)

RETRY_MAX_SECONDS = 600.0  # longest wait before a stopped table is tried again (continuous runs)


class Stops:
    """The stopped tables of one query (see the module)."""

    def __init__(self, config: IngestConfig, report: RunReport, metrics: RunMetrics | None, *,
                 retry_stopped: bool) -> None:
        self.config, self.report, self.metrics = config, report, metrics
        self.retry_stopped = retry_stopped
        #: each stopped table's error, by name
        self.errors: dict[str, BaseException] = {}
        #: when each stopped table may be tried again (``time.monotonic``); only with ``retry_stopped``
        self.retry_at: dict[str, float] = {}
        self._count: Counter[str] = Counter()

    def __contains__(self, table: str) -> bool:
        return table in self.errors

    def __len__(self) -> int:
        return len(self.errors)

    def due(self, specs: list[TableSpec]) -> list[TableSpec]:
        """The stopped tables among ``specs`` whose next try is due now."""
        now = time.monotonic()
        return [s for s in specs if s.name in self.errors and self.retry_at.get(s.name, now + 1) <= now]

    @property
    def waiting(self) -> bool:
        """Whether some stopped table will be tried again."""
        return bool(self.retry_at)

    def all_for_good(self, specs: list[TableSpec]) -> bool:
        """Whether every table of ``specs`` stopped, none to be tried again."""
        return len(self.errors) == len(specs) and not self.retry_at

    def stop(self, spec: TableSpec, exc: BaseException) -> None:
        """The table stops; its offsets stay where its Delta log has them, and the next run resumes there."""
        self.errors[spec.name] = exc
        if is_cancellation(exc):  # the run is being stopped: not the table's failure
            self.report.tables[spec.name].interrupted = True
            logs.event(log, "table-interrupted", f"table {spec.name}: its batch was cancelled before its commit as "
                       "the run stops; the next run applies it", table=spec.name, level=logging.WARNING)
            return
        if self.metrics is not None:
            self.metrics.stopped(spec.name, exc)
        self.report.tables[spec.name].error = secrets.redact(f"{type(exc).__name__}: {exc}")
        self.report.tables[spec.name].unavailable = is_unavailability(exc)
        if self.retry_stopped and is_transient(exc):
            self._count[spec.name] += 1
            wait = min(RETRY_MAX_SECONDS, self.config.source.retry_stopped_seconds * 2 ** (self._count[spec.name] - 1))
            self.retry_at[spec.name] = time.monotonic() + wait
            logs.event(log, "table-stopped", f"table {spec.name} stopped: {secrets.describe(exc)}; trying again in "
                       f"{wait:.0f} s", table=spec.name, level=logging.ERROR, retry_seconds=wait)
        else:
            self.retry_at.pop(spec.name, None)
            logs.event(log, "table-stopped", f"table {spec.name} stopped: {secrets.describe(exc)}", table=spec.name,
                       level=logging.ERROR)

    def running_again(self, spec: TableSpec) -> None:
        """The table caught up after its stop and runs again; a later outage waits from the first step again."""
        del self.errors[spec.name]
        self.retry_at.pop(spec.name, None)
        self._count.pop(spec.name, None)
        run = self.report.tables[spec.name]
        run.recovered.append(run.error or "")
        run.error, run.unavailable = None, False
        if self.metrics is not None:
            self.metrics.running(spec.name)
        log.warning("table %s: caught up and running again", spec.name)
