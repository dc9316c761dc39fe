"""Which faults ``ingest torture --stack`` injects, in which order, and a watch on the ingest process.

Fault kinds: ``ingest-kill`` (SIGKILL of the ``ingest run --continuous`` process group, then a
restart), and a restart of a stack component through :meth:`harness.stack.Stack.restart`:
``kafka`` (the broker), ``connect`` (Kafka Connect with both Debezium connectors; Debezium then
redelivers from its last flushed offset), ``registry`` (Apicurio behind nginx) and ``pg``
(PostgreSQL; the load generator reconnects, Debezium restarts its task).

An ``ingest-kill`` is either a SIGKILL from outside at whatever moment the schedule reaches, or
one at a named point of :mod:`ingest.crashpoints`: the running process is killed and restarted with
``INGEST_KILL_AT`` armed, so that it dies again exactly there (after the tombstones, before the
commit, during the MERGE, between the Delta commit and the audit row, between the batch and
Spark's checkpoint commit); then it is started unarmed.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from harness.torture.process import IngestProcess

#: Fault kinds, in the order the summary lists them.
KINDS: Final = ("ingest-kill", "kafka", "connect", "registry", "pg", "mariadb")
#: Named points for armed restarts (``label``: ``INGEST_KILL_AT`` without the hit count).
POINTS: Final = ("after-tombstones", "before-commit", "during-merge", "after-delta-commit", "after-batch")
Say = Callable[[str], None]


def schedule(rng: random.Random, faults: int, kinds: tuple[str, ...] = KINDS) -> list[str]:
    """``faults`` kinds in a seeded random order: every kind equally often (the remainder drawn at random)."""
    whole, rest = divmod(faults, len(kinds))
    plan = [k for k in kinds for _ in range(whole)] + rng.sample(kinds, rest)
    rng.shuffle(plan)
    return plan


def kill_at(rng: random.Random, point: str) -> str:
    """``INGEST_KILL_AT`` for a named point: its first hit (``during-merge``: 5-250 ms after ``before-commit``)."""
    if point == "during-merge":
        return f"before-commit:1:{rng.randint(5, 250)}"
    return f"{point}:1"


@dataclass
class Watch:
    """What the watch saw of the ingest processes (besides the faults it was told about)."""

    unexpected_exits: list[str] = field(default_factory=list)
    batches: int = 0
    table_stops: list[str] = field(default_factory=list)
    retries: int = 0
    longest_stall: float = 0.0
    stall_after: str = ""


class IngestWatch:
    """A thread that restarts the ingest process when it ends on its own and watches its progress.

    Progress is the ``<table>: batch <n> ...`` lines the engine prints per committed table batch;
    the longest stretch without one while the process was up longer than ``warmup`` seconds is
    reported (``stall_after`` names the last fault before it).
    """

    def __init__(self, process: IngestProcess, say: Say, *, warmup: float = 90.0) -> None:
        self.process, self.say, self.warmup = process, say, warmup
        self.lock = threading.RLock()  # held by whoever kills or starts the process
        self.seen = Watch()
        self.last_fault = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ingest-watch", daemon=True)
        self._read: tuple[object, int] = (None, 0)
        self._last_batch = time.monotonic()

    def start(self) -> IngestWatch:
        self._thread.start()
        return self

    def stop(self) -> Watch:
        self._stop.set()
        self._thread.join(10)
        return self.seen

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            with self.lock:
                self._scan()
                if self.process.alive or self._stop.is_set():
                    continue
                if self.process.armed:
                    continue  # an armed process: the fault in progress handles its end
                code = self.process.returncode
                tail = self.process.tail(6).replace("\n", " | ")[-400:]
                self.seen.unexpected_exits.append(f"exit {code} after {self.process.uptime():.0f} s "
                                                  f"(last fault: {self.last_fault}): {tail}")
                self.say(f"    ingest process ended on its own (exit {code}, last fault: {self.last_fault}); "
                         f"restarting it; log {self.process.log_path}")
                self._stop.wait(3.0)
                self.process.start()

    def _scan(self) -> None:
        """Count new batch lines, table stops and retries in the current log."""
        path = self.process.log_path
        now = time.monotonic()
        if path is None or not path.exists():
            return
        last_path, offset = self._read
        if last_path != path:
            offset = 0
        with path.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self._read = (path, offset + end)
        for line in chunk[:end].decode(errors="replace").splitlines():
            if ": batch " in line and " received " in line:
                self.seen.batches += 1
                self._last_batch = now
            elif "stopped:" in line and line.startswith("ERROR ingest.stream."):
                self.seen.table_stops.append(f"{line[:300]} (last fault: {self.last_fault})")
            elif "failed (" in line and "retrying" in line:
                self.seen.retries += 1
        if self.process.alive and self.process.uptime() > self.warmup:
            stall = now - max(self._last_batch, self.process.started_at + self.warmup)
            if stall > self.seen.longest_stall:
                self.seen.longest_stall, self.seen.stall_after = stall, self.last_fault
