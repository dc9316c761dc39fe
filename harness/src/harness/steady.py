"""A load at a steady rate of row changes, across restarts of its database: what every source's
load generator shares (:class:`harness.postgres.load.LoadGenerator`,
:class:`harness.mariadb.load.MariaLoadGenerator`).

It writes transactions at a target rate (changes per second) for a duration, in a background thread
(:meth:`SteadyLoad.start`, :meth:`SteadyLoad.stop`, :meth:`SteadyLoad.join`) or in the caller's
(:meth:`SteadyLoad.run`). When the database goes away (a restart by :meth:`harness.stack.Stack.restart`),
it reconnects with a growing pause (0.2 s up to 2 s) until the duration is over. A transaction whose
COMMIT was sent but not answered may or may not have committed: it is counted as ``uncertain``,
never as committed.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ingest.errors import first_line

Say = Callable[[str], None]


@dataclass
class LoadReport:
    """What the generator did."""

    committed_changes: int = 0
    committed_transactions: int = 0
    failed_transactions: int = 0
    uncertain_transactions: int = 0
    reconnects: int = 0
    seconds: float = 0.0
    target_rate: float = 0.0
    last_error: str | None = None

    @property
    def rate(self) -> float:
        """Committed changes per second over the run."""
        return self.committed_changes / self.seconds if self.seconds else 0.0


class SteadyLoad(ABC):
    """Writes ``rate`` row changes per second for ``duration`` seconds (``None``: until :meth:`stop`).

    A subclass says how to connect, what to read once per connection, and how to write one
    transaction; :attr:`disconnected` are its client's errors that mean the database went away.
    """

    #: the client's errors after which the generator reconnects
    disconnected: tuple[type[Exception], ...] = ()
    #: the background thread's name
    thread_name = "load"

    def __init__(self, *, rate: float, duration: float | None, seed: int = 1, say: Say | None = None,
                 report_every: float = 10.0) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate, self.duration = rate, duration
        self.rng = random.Random(seed)
        self.say = say or (lambda _line: None)
        self.report_every = report_every
        self.report = LoadReport(target_rate=rate)
        self._mine: list[int] = []  # the ids of the rows this generator wrote and has not deleted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def connect(self) -> AbstractContextManager[Any]:
        """A connection, closed when the context ends."""

    @abstractmethod
    def prepare(self, conn: Any) -> Any:
        """What a transaction needs to know, read once per connection."""

    @abstractmethod
    def transaction(self, conn: Any, state: Any) -> int:
        """Write one transaction; the changes it committed (0 if it failed). Raises one of
        :attr:`disconnected` (after counting the transaction) when the database went away."""

    # -- a transaction's outcome, for transaction() ------------------------------------------------

    def went_away(self, committing: bool) -> None:
        """Count a transaction during which the database went away: failed before its commit was
        sent, uncertain after (it may have committed)."""
        if committing:
            self.report.uncertain_transactions += 1
        else:
            self.report.failed_transactions += 1

    def failed(self, error: str) -> int:
        """Count a transaction the database refused (and that was rolled back); returns 0 changes."""
        self.report.failed_transactions += 1
        self.report.last_error = error
        return 0

    def committed(self, changes: int, written: list[int], deleted: list[int]) -> int:
        """Count a committed transaction and note the ids it wrote and deleted; returns ``changes``."""
        self._mine.extend(written)
        for gone in deleted:
            self._mine.remove(gone)
        self.report.committed_transactions += 1
        self.report.committed_changes += changes
        return changes

    # -- control ------------------------------------------------------------------------------------

    def start(self) -> SteadyLoad:
        """Run in a background (daemon) thread."""
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the generator to stop after its current transaction."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> LoadReport:
        """Wait for the background thread and return the report."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.report

    def run(self) -> LoadReport:
        """Generate load until the duration is over or :meth:`stop` is called."""
        started = time.monotonic()
        deadline = None if self.duration is None else started + self.duration
        pause = 0.2
        last_said = started
        tokens, refilled = 0.0, started
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                with self.connect() as conn:
                    state = self.prepare(conn)
                    pause = 0.2
                    refilled = time.monotonic()
                    while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                        now = time.monotonic()
                        # Token bucket holding at most one second of changes: steady, and no burst
                        # to make up for an outage.
                        tokens = min(tokens + (now - refilled) * self.rate, max(self.rate, 10.0))
                        refilled = now
                        if tokens <= 0:
                            time.sleep(min(-tokens / self.rate, 0.2) or 0.001)
                            continue
                        tokens -= self.transaction(conn, state)
                        elapsed = time.monotonic() - started
                        if time.monotonic() - last_said >= self.report_every:
                            last_said = time.monotonic()
                            self.say(f"  load: {self.report.committed_changes} changes committed "
                                     f"({self.report.committed_changes / max(elapsed, 1e-9):.0f}/s, "
                                     f"target {self.rate:.0f}/s, {self.report.reconnects} reconnects)")
            except self.disconnected as exc:
                self.report.last_error = first_line(exc)
                self.report.reconnects += 1
                self._stop.wait(pause)
                pause = min(pause * 2, 2.0)
        self.report.seconds = time.monotonic() - started
        return self.report
