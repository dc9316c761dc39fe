"""Ctrl-C where a KeyboardInterrupt would do harm: while a run applies batches, and while Spark starts.

SIGTERM does what Ctrl-C does (``ingest.cli.outcome.stop_as_interrupted``). Raised where the driver
happened to be, a KeyboardInterrupt cuts short a batch inside DuckDB (which fails its table: "Query
interrupted") or inside a py4j call, whose connection to Spark's JVM it breaks ("Answer from Java
side is empty"); PySpark's own handler also cancels every Spark job first. Cut short, PySpark's
launch deletes the directory Spark's JVM is about to write its port in: the JVM then outlives the
process for good, holding its standard output and error open, so whatever reads them waits for ever.

:class:`FirstCtrlC` takes the first press as a stop and a second as an interrupt; :class:`HeldCtrlC`
holds every press and hands one on once Spark has started. Both work together: a press held while
Spark starts goes to the run's :class:`FirstCtrlC`. Only the main thread can handle a signal; in any
other, Ctrl-C is left as it is.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class _OwnCtrlC:
    """SIGINT's handler from construction until :meth:`restore`, in the main thread."""

    def __init__(self) -> None:
        self._installed = threading.current_thread() is threading.main_thread()
        self._previous: Any = signal.signal(signal.SIGINT, self._press) if self._installed else None

    def _press(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def reclaim(self) -> None:
        """Be the handler again after a library put its own in place, which :meth:`restore` then puts
        back (PySpark's context installs one, which cancels every Spark job, as it starts)."""
        if self._installed and signal.getsignal(signal.SIGINT) != self._press:
            self._previous = signal.signal(signal.SIGINT, self._press)

    def restore(self) -> None:
        """Put the handler that was there back (PySpark's, once a session started)."""
        if self._installed:
            # A handler installed outside Python reads as None and cannot be put back: the default then.
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
            self._installed = False


class FirstCtrlC(_OwnCtrlC):
    """The first press is a stop: logged, and ``on_press`` called; a second raises KeyboardInterrupt."""

    def __init__(self, message: str, on_press: Callable[[], None] | None = None) -> None:
        """``message``: the warning the first press logs; ``on_press``: called then too (it must not block)."""
        self.pressed = False
        self._message = message
        self._on_press = on_press
        super().__init__()

    def _press(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        log.warning("%s", self._message)
        if self._on_press is not None:
            self._on_press()


class HeldCtrlC(_OwnCtrlC):
    """A context in which every press is held. Leaving it without an error hands one to the handler
    that was there on entry (a :class:`FirstCtrlC`, or Python's, which raises KeyboardInterrupt), and
    puts back the handler :meth:`reclaim` took back from a library, if it did."""

    def __init__(self) -> None:
        self.pressed = False
        super().__init__()
        self._first = self._previous

    def _press(self, signum: int, frame: Any) -> None:
        self.pressed = True

    def __enter__(self) -> HeldCtrlC:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.restore()
        if exc_type is not None or not self.pressed or self._first is signal.SIG_IGN:
            return
        if callable(self._first):
            self._first(signal.SIGINT, None)
        else:  # SIG_DFL, or a handler from outside Python: the process is being interrupted
            raise KeyboardInterrupt
