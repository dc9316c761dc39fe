"""How much memory each test's worker reached, and what it was doing when it grew too large.

Each test's JUnit entry carries two properties: ``peak_rss_mib``, its process's peak resident memory
once the test is done (``ru_maxrss``, which only grows), and ``rss_rise_mib``, how much the test
raised that peak. ``scripts/suite_times.py --memory`` lists the tests that raised it most.

A thread samples the process's resident memory twice a second. When it passes :data:`ALARM_GIB`
(``TEST_RSS_ALARM_GIB``) it writes the running test and every thread's Python stack to
``.test-results/memory-<worker>.txt``, and again at each further :data:`ALARM_STEP_GIB`: a worker
that grows until the kernel kills it (one did, at 17 GB, in a clean-clone run) leaves no JUnit entry
and no traceback, only this file. ``make test`` runs three workers beside the stack's servers; all of
them used 12.6 GB at most (sampled by hand), so a single worker past 6 GiB is something to look at.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

ALARM_GIB: Final = float(os.environ.get("TEST_RSS_ALARM_GIB", "6"))
ALARM_STEP_GIB: Final = 2.0
RESULTS: Final = Path(__file__).resolve().parents[1] / ".test-results"
_PAGE = resource.getpagesize()

#: the test this process runs now (read by the sampling thread)
_running = "(between tests)"
#: the peak before each test
_BEFORE: Final = pytest.StashKey[float]()


def resident_bytes() -> int:
    """This process's resident memory now (Linux; 0 where ``/proc`` has no ``statm``)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def peak_mib() -> float:
    """This process's peak resident memory so far (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check(report: Path, alarm: float) -> float:
    """Write the running test and every thread's stack to ``report`` if this process holds ``alarm``
    bytes or more; the level to check against next."""
    rss = resident_bytes()
    if rss < alarm:
        return alarm
    report.parent.mkdir(parents=True, exist_ok=True)
    with report.open("a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} resident {rss / 1024**3:.1f} GiB during {_running}\n")
        out.flush()
        faulthandler.dump_traceback(out, all_threads=True)
        out.write("\n")
    return rss + ALARM_STEP_GIB * 1024**3


def _watch(report: Path, every: float, alarm: float) -> None:
    pause = threading.Event()  # never set: its wait is a pause a test's stand-in for ``time.sleep`` does not touch
    while True:
        pause.wait(every)
        alarm = check(report, alarm)


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    threading.Thread(target=_watch, args=(RESULTS / f"memory-{worker}.txt", 0.5, ALARM_GIB * 1024**3),
                     name="memory-watch", daemon=True).start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _running
    _running, item.stash[_BEFORE] = item.nodeid, peak_mib()
    yield
    _running = "(between tests)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the teardown report, which JUnit takes a test's properties from, is made after this
    peak = peak_mib()
    item.user_properties += [("peak_rss_mib", f"{peak:.0f}"), ("rss_rise_mib", f"{peak - item.stash[_BEFORE]:.0f}")]
