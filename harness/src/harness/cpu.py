"""The machine's CPU time from ``/proc/stat``: how busy the cores were over a window, and how much of
their time the hypervisor gave to other machines (steal). Benchmarks and tools that time something
on a shared host report it beside their figures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

#: Clock ticks per second, the unit of ``/proc/stat``.
TICKS: Final = os.sysconf("SC_CLK_TCK")


def cpu_ticks(text: str | None = None) -> tuple[int, int, int]:
    """The machine's CPU time since boot, in ticks: all of it, the busy part (everything but idle and
    I/O wait), and the part stolen by the hypervisor. ``text``: ``/proc/stat``'s (default: read now)."""
    if text is None:
        text = Path("/proc/stat").read_text()
    fields = [int(v) for v in text.splitlines()[0].split()[1:9]]
    total = sum(fields)
    return total, total - fields[3] - fields[4], fields[7]


def busy_seconds() -> float:
    """The machine's busy CPU seconds since boot (:func:`cpu_ticks`'s busy part)."""
    return cpu_ticks()[1] / TICKS


def cpu_shares(before: tuple[int, int, int], after: tuple[int, int, int]) -> tuple[float, float] | None:
    """Between two :func:`cpu_ticks`: the share of the cores' time that was busy, and the share stolen
    (``None``: no time passed). A window with much stolen time ran beside another machine's work."""
    total = after[0] - before[0]
    if total <= 0:
        return None
    return (after[1] - before[1]) / total, (after[2] - before[2]) / total
