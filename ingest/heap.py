"""Keep Python's full garbage collections off a long run's micro-batches.

CPython's cyclic collector walks every object it tracks in a full collection, and starts one
whenever the objects promoted since the last one reach a quarter of those it found alive then.
Most of what a process of the engine tracks is what its start-up built -- modules, classes,
functions, schemas: about a hundred thousand objects in a decode worker, several times that in a
driver. Each micro-batch promotes objects that reference counting frees soon after, so full
collections keep coming, find nothing, and pause the process each time for as long as the walk
takes: in the decode workers, inside a micro-batch's read. ``benchmarks/bench_latency.py`` counts
them, per kind of process.

:func:`freeze_start_up` collects once, then moves every object alive to the permanent generation
(``gc.freeze``), which later collections skip: they walk only what the run built since. The cost is
that a cycle of frozen objects that dies later is never collected; the call therefore comes after
start-up and a first batch, whose objects stay for the whole run. At exit they are handed back to
the collector (``gc.unfreeze``), whose last collection frees them as in any process: native
bindings that count their objects (DuckDB's) would otherwise report them as leaked.
"""

from __future__ import annotations

import atexit
import gc
import logging
import time
from functools import cache

_LOG = logging.getLogger(__name__)


@cache
def freeze_start_up() -> None:
    """Once per process: collect what start-up left behind, then freeze what is alive
    (module docstring). Later calls do nothing."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
    _LOG.debug("froze %d objects start-up left (%.0f ms)", gc.get_freeze_count(),
               (time.perf_counter() - started) * 1000)
