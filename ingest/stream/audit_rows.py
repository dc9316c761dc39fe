"""The micro-batches' audit rows, appended behind the batches, those of an interval in one commit.

Each table's commit already holds its batch's row (:func:`ingest.records.audit.reconcile` restores the
rows a stop loses), so the shared audit table need not be written on the path between micro-batches:
its append runs on a background thread while Spark commits the batch and starts the next one. And a
continuous run with many tables would commit the audit table once per table and batch, one commit at
a time; rows of ``target.audit_interval_seconds`` go in one commit instead, the first batch's at once,
and a timer sends what waits when no micro-batch comes by the interval's end.
"""

from __future__ import annotations

import threading
import time

from ingest.behind import Behind
from ingest.config import IngestConfig
from ingest.lake.layout import TablePaths
from ingest.records import audit
from ingest.records.audit import AuditRecord


class AuditRows:
    """One query's audit rows on their way to the audit table (see the module)."""

    def __init__(self, config: IngestConfig) -> None:
        self.config = config
        #: the audit table, kept open from one append to the next
        self.table = audit.AuditLog()
        self._appender = Behind("audit")
        #: rows waiting for their commit, when it is due (``time.monotonic``), and the timer that makes
        #: it when no micro-batch comes by then; the lock keeps the timer and the batches apart
        self._rows: list[AuditRecord] = []
        self._due = float("-inf")
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def add(self, records: list[AuditRecord]) -> None:
        """Have ``records`` appended: now, when the last append is ``target.audit_interval_seconds`` ago,
        else with the rows that come until then."""
        with self._lock:
            self._rows += records
            wait = self._due - time.monotonic()
            if wait <= 0:
                self._flush_locked()
            elif self._timer is None:  # no micro-batch may come by then: the rows go anyway
                self._timer = threading.Timer(wait, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Send the rows that wait, without waiting for their interval to end."""
        with self._lock:
            self._flush_locked()

    def wait(self) -> None:
        """Return once the appends under way are done; raises what the first that failed failed with."""
        self._appender.wait()

    def close(self) -> list[BaseException]:
        """Send the rows that wait, let the thread go once they are appended; returns what failed and was
        not raised yet."""
        self.flush()
        return self._appender.close()

    def _flush_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        self._due = time.monotonic() + self.config.target.audit_interval_seconds
        self._appender.submit(self.table.append, TablePaths.of(self.config, rows[0].table).audit, rows)
