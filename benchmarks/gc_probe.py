"""Full garbage collections in an engine's Python processes: the driver and Spark's Python workers.

A full (generation 2) collection pauses every thread of its process for as long as it walks the
objects the process tracks. :func:`environment` gives the engine's process a ``PYTHONPATH`` whose
``sitecustomize`` registers a ``gc.callbacks`` hook in the driver (``python -m ingest.cli``) and in
every Python process Spark starts for it (their command lines name ``pyspark``; Spark hands its
workers the driver's ``PYTHONPATH``). Each full collection appends a line -- end time, process id,
kind, milliseconds -- to a file in the probe's directory; :func:`collections` counts those of a window.

Only a benchmark's engine loads it: a ``sitecustomize`` of the environment's own is shadowed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_SITECUSTOMIZE = '''\
import gc, os, sys, time

_line = " ".join(getattr(sys, "orig_argv", sys.argv))
_kind = "driver" if "ingest.cli" in _line else "worker" if "pyspark" in _line else None
if _kind is not None:
    _out = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"gc-{os.getpid()}.log"), "a",
                buffering=1)
    _began = [0.0]

    def _full_collection(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            _began[0] = time.perf_counter()
        else:  # a forked worker writes to its parent's file, under its own pid
            _out.write(f"{time.time():.3f} {os.getpid()} {_kind} {(time.perf_counter() - _began[0]) * 1000:.2f}\\n")

    gc.callbacks.append(_full_collection)
'''


def environment(directory: Path) -> dict[str, str]:
    """Write the probe into ``directory``; the environment variables that load it in a process."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    given = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(directory) + (os.pathsep + given if given else "")}


@dataclass(frozen=True)
class Collections:
    """One kind of process's full collections in a window."""

    count: int
    milliseconds: float
    processes: int


def collections(directory: Path, since: float, until: float) -> dict[str, Collections]:
    """``kind -> Collections`` ending in ``since <= t < until`` (epoch seconds), for each kind of
    process that ran one; a line a killed process left half written is skipped."""
    found: dict[str, list[tuple[int, float]]] = {}
    for log in sorted(directory.glob("gc-*.log")):
        for line in log.read_text().splitlines():
            fields = line.split()
            if len(fields) != 4:
                continue
            try:
                ended, pid, kind, ms = float(fields[0]), int(fields[1]), fields[2], float(fields[3])
            except ValueError:
                continue
            if since <= ended < until:
                found.setdefault(kind, []).append((pid, ms))
    return {kind: Collections(len(seen), sum(ms for _, ms in seen), len({pid for pid, _ in seen}))
            for kind, seen in sorted(found.items())}
