"""One writer per table, enforced with exclusive file locks.

A run holds ``<tables root>/_cdc_locks/<table>.lock`` (``flock``, exclusive, non-blocking) for
every table it ingests, from before its query starts until the run ends. A second ``ingest run``
on the same table fails at once with :class:`TableLockedError`, naming the table and the holder.
The kernel releases a lock when its process dies, even by SIGKILL, so a crash never leaves a
stale lock behind. The tables every run shares (audit, quarantine) are written under a blocking
lock of their own (:func:`shared`): concurrent runs on different tables wait for each other there.

Delta's optimistic concurrency is the second line of defence: a commit that races another writer
fails with :class:`ingest.errors.CommitConflictError` instead of corrupting the table.

A lake on an object store has no file locks and may be shared by machines: there the same rule
is kept by a lease object per table (:mod:`ingest.lake.lease`), and :func:`check` before each commit
makes sure the run still holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final, Protocol

from ingest.errors import TableLockedError
from ingest.lake.lease import Lease, describe_holder
from ingest.lake.location import LakePath, Location

LOCK_DIR: Final = "_cdc_locks"
#: The lease of a shared table (audit, quarantine) on an object store lives this long without renewal.
SHARED_LEASE_SECONDS: Final = 30.0
_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()
_leases: dict[str, Lease] = {}  # table location -> the lease this process holds on it


class WriterLock(Protocol):
    table: str

    def release(self) -> None: ...


def lock_path(tables_root: Path, name: str) -> Path:
    return tables_root / LOCK_DIR / f"{name}.lock"


class TableLock:
    """The exclusive writer lock of one table, held until :meth:`release`.

    Args:
        tables_root: directory of the Delta tables (a local lake).
        table: table name (already validated as a safe file name by the config).
    """

    def __init__(self, tables_root: Location, table: str) -> None:
        self.table = table
        self.path = lock_path(LakePath.of(tables_root).local, table)
        self._file: IO[str] | None = None

    def acquire(self) -> TableLock:
        """Take the lock or fail at once.

        Raises:
            TableLockedError: another process holds it; the message names the table and the holder.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 -- kept open: the lock lives as long as the file
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = describe_holder(handle.read())
            handle.close()
            raise TableLockedError(
                self.table,
                f"another writer holds its lock ({holder}); only one `ingest run` may write a table at a time. "
                f"Wait for it to finish or stop it; the lock file is {self.path}",
                holder,
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": datetime.now(UTC).isoformat(timespec="seconds")}))
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            # The holder's details stay in the file; they describe the last writer, harmlessly.
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def acquire_all(tables_root: LakePath, tables: list[str], *, lease_seconds: float = 60.0) -> list[WriterLock]:
    """Lock every table or none: on the first refusal the locks already taken are released.

    A local lake takes ``flock`` locks; a lake on an object store takes leases of ``lease_seconds``.
    """
    held: list[WriterLock] = []
    try:
        for name in tables:
            if tables_root.is_local:
                held.append(TableLock(tables_root.local, name).acquire())
            else:
                lease = Lease(tables_root, name, ttl=lease_seconds).acquire()
                with _guard:
                    _leases[lease.table_path.uri] = lease
                held.append(lease)
    except BaseException:
        release_all(held)
        raise
    return held


def release_all(locks: list[WriterLock]) -> None:
    for lock in locks:
        if isinstance(lock, Lease):
            with _guard:
                _leases.pop(lock.table_path.uri, None)
        lock.release()


def check(table_path: Location) -> None:
    """Before a commit: raise if this process held the table's lease and no longer does.

    Raises:
        ingest.lake.lease.LeaseLostError: the lease was taken over or could not be renewed in time.
    """
    with _guard:
        lease = _leases.get(LakePath.of(table_path).uri)
    if lease is not None:
        lease.check()


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created with its directory), waiting for any other holder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def shared(table_path: Location) -> Iterator[None]:
    """Serialize writes to a table shared by every run (audit, quarantine), across threads and processes."""
    where = LakePath.of(table_path)
    with _guard:
        thread_lock = _thread_locks.setdefault(where.uri, threading.Lock())
    # blocking: the other writer's append takes milliseconds
    with thread_lock:
        if where.is_local:
            with exclusive(lock_path(where.local.parent, where.name)):
                yield
        else:
            lease = _wait_for_lease(where)
            try:
                yield
            finally:
                lease.release()


def _wait_for_lease(where: LakePath, *, patience: float = 4 * SHARED_LEASE_SECONDS) -> Lease:
    deadline = time.monotonic() + patience
    while True:
        try:
            return Lease(where.parent, where.name, ttl=SHARED_LEASE_SECONDS).acquire()
        except TableLockedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
