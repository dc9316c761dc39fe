"""CPU seconds spent by this process and its descendants, by kind, over stretches of a benchmark.

Linux only (``/proc``). A background thread samples every process under this one -- the Python
driver (with the processes it forks to decode a run without Spark), Spark's JVM, the Python workers
it forks, a Kafka broker or registry the benchmark started -- and the JVM's JIT compiler threads
apart, so a stretch's CPU can be read afterwards by kind. A process that ends counts up to its last
sample, so a figure may miss up to one interval (0.25 s) of a process that lived shorter than the
stretch.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("driver", "Spark JVM", "Python workers", "broker, registry")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


def _stat(pid: int | str, task: str | None = None) -> tuple[str, int, float] | None:
    """``(name, parent pid, CPU seconds)`` of a process (or one of its threads), ``None`` if it is gone."""
    path = _PROC / str(pid) / ("stat" if task is None else f"task/{task}/stat")
    try:
        raw = path.read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2:].split()
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def processes() -> dict[int, tuple[str, int, float]]:
    """Every process of the machine: ``pid -> (name, parent pid, CPU seconds)``, read from ``/proc`` at once."""
    return {int(entry): stat for entry in os.listdir(_PROC) if entry.isdigit() and (stat := _stat(entry)) is not None}


def descendants(root: int, seen: dict[int, tuple[str, int, float]] | None = None) -> list[int]:
    """``root`` and every process under it, from ``seen`` (:func:`processes`; read now by default)."""
    seen = processes() if seen is None else seen
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in seen.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def _kind(pid: int, root: int) -> str | None:
    if pid == root:
        return "driver"
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
        if raw == (_PROC / str(root) / "cmdline").read_bytes():
            return "driver"  # a process the driver forked: the decoders of a run without Spark
    except OSError:
        return None
    argv = raw.split(b"\0")
    exe = os.path.basename(argv[0].decode(errors="replace"))
    command = b" ".join(argv).decode(errors="replace")
    if exe == "java":
        # The stack's servers run their own JVMs; Spark's runs SparkSubmit.
        return "Spark JVM" if "org.apache.spark" in command else "broker, registry"
    if "pyspark" in command:
        return "Python workers"  # the daemons, their forked workers, the streaming source runner
    return None  # a shell or a short helper: too little to show


def _jit_threads(pid: int) -> list[str]:
    """The thread ids of a JVM's JIT compiler threads (``C1 CompilerThre``, ``C2 CompilerThre``)."""
    try:
        tasks = os.listdir(_PROC / str(pid) / "task")
    except OSError:
        return []
    return [task for task in tasks if (stat := _stat(pid, task)) is not None and "CompilerThre" in stat[0]]


@dataclass
class CpuMeter:
    """Samples the process tree's CPU in the background between :meth:`start` and :meth:`stop`."""

    interval: float = 0.25
    #: ``(time.perf_counter(), {pid: (kind, CPU seconds, JIT seconds)})``
    samples: list[tuple[float, dict[int, tuple[str, float, float]]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    # What a sample would otherwise read again every time (the meter's own CPU is the engine's loss
    # on two busy cores): each process's kind, by pid and command name (spark-submit's shell becomes
    # the JVM by exec), and each JVM's compiler threads, looked for again every few seconds
    # (HotSpot starts C2 threads on demand).
    _kinds: dict[tuple[int, str], str | None] = field(default_factory=dict)
    _compilers: dict[int, tuple[float, list[str]]] = field(default_factory=dict)

    @staticmethod
    def available() -> bool:
        return (_PROC / "self" / "stat").exists()

    def start(self) -> CpuMeter:
        if self.available():
            self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.available():
            self.samples.append((time.perf_counter(), self._sample()))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._sample()))
            self._stop.wait(self.interval)

    def _sample(self) -> dict[int, tuple[str, float, float]]:
        root = os.getpid()
        seen = processes()
        out: dict[int, tuple[str, float, float]] = {}
        for pid in descendants(root, seen):
            if pid not in seen:
                continue
            name, _, cpu = seen[pid]
            if (pid, name) not in self._kinds:
                self._kinds[(pid, name)] = _kind(pid, root)
            kind = self._kinds[(pid, name)]
            if kind is not None:
                out[pid] = (kind, cpu, self._jit(pid) if kind == "Spark JVM" else 0.0)
        return out

    def _jit(self, pid: int) -> float:
        """CPU seconds of a JVM's JIT compiler threads."""
        now = time.monotonic()
        found, threads = self._compilers.get(pid, (0.0, []))
        if now - found > 5.0:
            threads = _jit_threads(pid)
            self._compilers[pid] = (now, threads)
        return sum(stat[2] for task in threads if (stat := _stat(pid, task)) is not None)

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per kind from ``start`` to ``end`` (``time.perf_counter`` times), and ``"JIT"``."""
        before: dict[int, tuple[str, float, float]] = {}
        after: dict[int, tuple[str, float, float]] = {}
        for at, sample in self.samples:
            if at <= start:
                before = sample
            elif at <= end:
                for pid, value in sample.items():
                    after[pid] = value  # a process that ended keeps its last sample
        out = dict.fromkeys((*KINDS, "JIT"), 0.0)
        for pid, (kind, cpu, jit) in after.items():
            _, cpu0, jit0 = before.get(pid, (kind, 0.0, 0.0))
            out[kind] += cpu - cpu0
            out["JIT"] += jit - jit0
        return out
