"""Work a batch leaves behind it: done on a background thread while the batch goes on.

Four things run this way: the Delta checkpoint a commit reached (:mod:`ingest.lake.checkpoints`), the
packing of the small files the side tables gained (the remembered deletes and the moves:
:mod:`ingest.lake.side`), the micro-batches' audit rows (:mod:`ingest.stream.audit_rows`), and the
apply of a micro-batch Spark decoded while the next one is planned (:mod:`ingest.stream.callback`).
Each has a :class:`Behind`, one thread that does what it is given in order, and whoever needs the
work done (the next batch, the next write of the same table, the run's end) waits for it.

Maintenance (a checkpoint, a pack) changes no row: when it fails, :func:`maintenance_failed` says so
in a warning and counts it, and ``ingest run --metrics-port`` shows the count as
``cdc_ingest_maintenance_failures_total{work}`` (:mod:`ingest.metrics`), so that a lake that keeps
refusing them is seen before its readers slow down.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

#: The kinds of maintenance done behind the batch, as ``maintenance_failures_total`` labels them.
MAINTENANCE: Final = ("checkpoint", "pack")
_FAILURES: Counter[str] = Counter()
_FAILURES_LOCK = threading.Lock()


def maintenance_failed(logger: logging.Logger, work: str, message: str, *args: Any) -> None:
    """Maintenance of kind ``work`` (one of :data:`MAINTENANCE`) failed: counted, and a warning
    (``message % args``) from ``logger``, the module that did it."""
    with _FAILURES_LOCK:
        _FAILURES[work] += 1
    logger.warning(message, *args)


def maintenance_failures() -> dict[str, int]:
    """How many times each kind of maintenance failed in this process, every kind included."""
    with _FAILURES_LOCK:
        return {work: _FAILURES[work] for work in MAINTENANCE}


class Behind:
    """One background thread, started with the first piece of work, that does each in turn."""

    def __init__(self, name: str) -> None:
        """``name``: the thread's name (what a thread dump shows)."""
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()

    def submit(self, work: Callable[..., None], *args: Any) -> Future[None]:
        """Do ``work(*args)`` after what was given before; returns its future (:meth:`wait` awaits it too)."""
        with self._lock:
            if self._pool is None:  # most runs never reach some kinds of work: no thread until one comes
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
            # work done well is forgotten; a failure stays until :meth:`wait` or :meth:`close` raises or returns it
            self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
            future = self._pool.submit(work, *args)
            self._pending.append(future)
            return future

    def wait(self) -> None:
        """Return once everything given so far is done; raises what the first that failed raised."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> list[BaseException]:
        """Let the thread go once everything given is done; returns what failed and was not raised yet."""
        with self._lock:
            pool, self._pool = self._pool, None
            pending, self._pending = self._pending, []
        if pool is not None:
            pool.shutdown(wait=True)
        return [exc for f in pending if (exc := f.exception()) is not None]
