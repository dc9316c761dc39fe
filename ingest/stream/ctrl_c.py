"""Ctrl-C while a run applies batches: the first lets the batch under way finish, a second interrupts.

SIGTERM does what Ctrl-C does (``ingest.cli.outcome.stop_as_interrupted``). The first press only
records itself: raised where the driver happened to be, a KeyboardInterrupt would cut short a
batch inside DuckDB (which fails its table: "Query interrupted") or inside a py4j call, whose
connection to Spark's JVM it breaks ("Answer from Java side is empty"). PySpark's own handler
also cancels every Spark job first. Only the main thread can handle a signal; in any other, Ctrl-C
is left as it is.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class FirstCtrlC:
    """Installed from construction until :meth:`restore`."""

    def __init__(self, message: str, on_press: Callable[[], None] | None = None) -> None:
        """``message``: the warning the first press logs; ``on_press``: called then too (it must not block)."""
        self.pressed = False
        self._message = message
        self._on_press = on_press
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous: Any = signal.signal(signal.SIGINT, self._press) if self._installed else None

    def _press(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        log.warning("%s", self._message)
        if self._on_press is not None:
            self._on_press()

    def reclaim(self) -> None:
        """Be the handler again after a library put its own in place, which :meth:`restore` then puts
        back (PySpark's context installs one, which cancels every Spark job, as it starts)."""
        if self._installed and signal.getsignal(signal.SIGINT) != self._press:
            self._previous = signal.signal(signal.SIGINT, self._press)

    def restore(self) -> None:
        """Put the handler that was there back (PySpark's, in a run that started Spark)."""
        if self._installed:
            # A handler installed outside Python reads as None and cannot be put back: the default then.
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
            self._installed = False
