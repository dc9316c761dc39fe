"""Named crash points: where the consistency proof (``ingest torture``) may kill the process.

``INGEST_KILL_AT="<point>:<n>"`` makes the process SIGKILL itself the n-th time it reaches
``<point>`` -- a real, unclean death at exactly the moments that matter (between the Delta commit
and the Spark checkpoint, between tombstones and the MERGE, around a schema rewrite).
``INGEST_KILL_AT="<point>:<n>:<ms>"`` instead arms a SIGKILL that lands ``ms`` milliseconds after
the n-th hit while the process carries on, so the death falls *inside* what follows the point: the
MERGE after ``before-commit``, the table rewrite after ``before-widen``. The delayed kill comes from
a separate process, because the work it interrupts runs in native code that may hold the GIL.
Unset, a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import Counter

POINTS = (
    "after-quarantine",       # quarantine written, table not yet committed
    "after-tombstones",       # tombstones recorded, MERGE not yet committed
    "before-commit",          # MERGE planned, nothing of the batch committed to the table
    "before-widen",           # schema rewrite about to start (with a delay: killed during it)
    "after-widen",            # schema rewritten, batch not yet committed
    "after-delta-commit",     # table committed, audit row not yet appended
    "after-batch",            # batch fully done, Spark checkpoint not yet committed
)

_hits: Counter[str] = Counter()
_lock = threading.Lock()


def _target() -> tuple[str, int, int | None] | None:
    spec = os.environ.get("INGEST_KILL_AT")
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    count, _, delay = rest.partition(":")
    return name, int(count or "1"), int(delay) if delay else None


def point(name: str) -> None:
    """Die here with SIGKILL if the environment asks for it (see module docstring)."""
    target = _target()
    if target is None or target[0] != name:
        return
    with _lock:
        _hits[name] += 1
        if _hits[name] != target[1]:
            return
    delay = target[2]
    if delay is None:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        # Same process group as this process, so whoever cleans the group up also ends the killer.
        subprocess.Popen(["/bin/sh", "-c", f"sleep {delay / 1000:.3f}; kill -KILL {os.getpid()}"])
