"""The garbage-collection pauses of the stack's Java servers, from the log each one keeps.

Kafka, Connect and the registry run with the serial collector (:data:`~harness.stack.tools.LEAN_JVM`),
whose every collection stops the whole server: a pause of Connect holds back the changes it is
converting, one of Kafka the appends. Each server writes one line per pause to ``gc.log`` in its
directory (:func:`option`), through the JVM's unified logging; :func:`pauses` reads those of a
window, so that a benchmark can tell a stall of the stack from one of the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

#: The file, in a server's directory, its pauses are logged to.
GC_LOG: Final = "gc.log"
#: A pause as the JVM logs it with the ``utctime`` decorator, e.g.
#: ``[2026-12-04T08:33:37.098+0000] GC(90) Pause Full (Allocation Failure) 976M->128M(989M) 299.906ms``.
#: Other decorators after the time (``[271.972s]``, ``[info][gc]``) are passed over.
_PAUSE = re.compile(r"^\[(?P<at>[^\]]+)\](?:\[[^\]]*\])*\s*GC\(\d+\)\s+Pause \w+.*?\s(?P<ms>\d+(?:\.\d+)?)ms$")


def option(directory: Path) -> str:
    """The JVM flag that logs every pause to ``directory/gc.log`` (two files of at most 10 MB)."""
    return f"-Xlog:gc:file={directory / GC_LOG}:utctime:filecount=2,filesize=10m"


@dataclass(frozen=True)
class Pauses:
    """One server's pauses in a window."""

    count: int
    milliseconds: float
    longest: float


def pauses(directory: Path, since: float, until: float) -> Pauses | None:
    """The pauses logged in ``directory`` that ended in ``since <= t < until`` (epoch seconds);
    ``None`` when the server keeps no log (started before it did, or not a Java server)."""
    logs = sorted(directory.glob(GC_LOG + "*"))
    if not logs:
        return None
    seen = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if (m := _PAUSE.match(line)) is None:
                continue
            ended = datetime.strptime(m["at"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
            if since <= ended < until:
                seen.append(float(m["ms"]))
    return Pauses(len(seen), sum(seen), max(seen, default=0.0))
