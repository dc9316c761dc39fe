"""Ctrl-C where a KeyboardInterrupt would do harm: while a run applies batches, and while Spark starts.

SIGTERM does what Ctrl-C does (:func:`terminate`). Raised where the driver
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


#: This module's handlers in place, the innermost last: SIGTERM goes to it (:func:`terminate`).
_active: list[_OwnCtrlC] = []


class _OwnCtrlC:
    """SIGINT's handler from construction until :meth:`restore`, in the main thread, and SIGTERM's
    through :func:`terminate`. Where SIGINT is ignored (a script's background job, ``trap '' INT``,
    as the shell's convention has it), it stays ignored: the handler only takes SIGTERM."""

    def __init__(self) -> None:
        self._main = threading.current_thread() is threading.main_thread()
        self._ignored = self._main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        self._installed = self._main and not self._ignored
        self._previous: Any = signal.signal(signal.SIGINT, self._press) if self._installed else None
        if self._main:
            _active.append(self)

    def _press(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def reclaim(self) -> None:
        """Be the handler again after a library put its own in place, which :meth:`restore` then puts
        back (PySpark's context installs one, which cancels every Spark job, as it starts). Where
        SIGINT was ignored, it is ignored again, and stays so after :meth:`restore`."""
        if self._ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        elif self._installed and signal.getsignal(signal.SIGINT) != self._press:
            self._previous = signal.signal(signal.SIGINT, self._press)

    def restore(self) -> None:
        """Put the handler that was there back (PySpark's, once a session started)."""
        if self in _active:
            _active.remove(self)
        if self._installed:
            # A handler installed outside Python reads as None and cannot be put back: the default then.
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.default_int_handler)
            self._installed = False


def terminate(frame: Any) -> None:
    """SIGTERM does what Ctrl-C does, even where Ctrl-C is ignored: the innermost of this module's
    handlers takes it, else SIGINT's handler (PySpark's, once a session started), else Python's
    KeyboardInterrupt."""
    if _active:
        _active[-1]._press(signal.SIGINT, frame)
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


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
    outside it (a run's :class:`FirstCtrlC`, or the one there on entry: Python's raises
    KeyboardInterrupt), and puts back the handler :meth:`reclaim` took back from a library, if it did.
    Where SIGINT is ignored, only SIGTERM is held, and handed on as an interrupt."""

    def __init__(self) -> None:
        self.pressed = False
        super().__init__()
        self._outer = _active[-2] if self._main and len(_active) > 1 else None
        self._on_entry = self._previous

    def _press(self, signum: int, frame: Any) -> None:
        self.pressed = True

    def __enter__(self) -> HeldCtrlC:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.restore()
        if exc_type is not None or not self.pressed:
            return
        if self._outer is not None:
            self._outer._press(signal.SIGINT, None)
        elif callable(self._on_entry):
            self._on_entry(signal.SIGINT, None)
        else:  # SIG_DFL, a handler from outside Python, or SIGTERM where SIGINT is ignored
            raise KeyboardInterrupt
