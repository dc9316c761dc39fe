"""One writer per table, enforced with exclusive file locks.

A run holds ``<tables root>/_cdc_locks/<table>.lock`` (``flock``, exclusive, non-blocking) for
every table it ingests, from before its query starts until the run ends. A second ``ingest run``
on the same table fails at once with :class:`TableLockedError`, naming the table and the holder.
The kernel releases a lock when its process dies, even by SIGKILL, so a crash never leaves a
stale lock behind. The tables every run shares (audit, quarantine) are written under a blocking
lock of their own (:func:`shared`): concurrent runs on different tables wait for each other there.

Delta's optimistic concurrency is the second line of defence: a commit that races another writer
fails with :class:`ingest.errors.CommitConflictError` instead of corrupting the table.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

from ingest.errors import TableLockedError

LOCK_DIR: Final = "_cdc_locks"
_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def lock_path(tables_root: Path, name: str) -> Path:
    return tables_root / LOCK_DIR / f"{name}.lock"


class TableLock:
    """The exclusive writer lock of one table, held until :meth:`release`.

    Args:
        tables_root: directory of the Delta tables.
        table: table name (already validated as a safe file name by the config).
    """

    def __init__(self, tables_root: Path, table: str) -> None:
        self.table = table
        self.path = lock_path(tables_root, table)
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
            holder = _describe(handle.read())
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


def acquire_all(tables_root: Path, tables: list[str]) -> list[TableLock]:
    """Lock every table or none: on the first refusal the locks already taken are released."""
    held: list[TableLock] = []
    try:
        for name in tables:
            held.append(TableLock(tables_root, name).acquire())
    except BaseException:
        release_all(held)
        raise
    return held


def release_all(locks: list[TableLock]) -> None:
    for lock in locks:
        lock.release()


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
def shared(table_path: Path) -> Iterator[None]:
    """Serialize writes to a table shared by every run (audit, quarantine), across threads and processes."""
    key = str(table_path)
    with _guard:
        thread_lock = _thread_locks.setdefault(key, threading.Lock())
    # blocking: the other writer's append takes milliseconds
    with thread_lock, exclusive(lock_path(table_path.parent, table_path.name)):
        yield


def _describe(content: str) -> str:
    try:
        info = json.loads(content)
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
