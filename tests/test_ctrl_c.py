"""Ctrl-C's two handlers: the first press a stop (a run's), every press held (while Spark starts)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.ctrl_c import FirstCtrlC, HeldCtrlC, terminate


def press() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)  # the handler runs between the main thread's bytecodes


@contextlib.contextmanager
def _sigint(handler: Any) -> Iterator[None]:
    before = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def presses() -> Iterator[list[int]]:
    """SIGINT's handler for the test: it records each press."""
    seen: list[int] = []
    with _sigint(lambda signum, _frame: seen.append(signum)):
        yield seen


@pytest.fixture
def python_default() -> Iterator[None]:
    """Python's own handler, as in a command's process (a test runner's worker may have its own)."""
    with _sigint(signal.default_int_handler):
        yield


@pytest.fixture
def ignored() -> Iterator[None]:
    """Ctrl-C ignored, as the shell has it for a script's background job (``ingest run &``)."""
    with _sigint(signal.SIG_IGN):
        yield


@pytest.mark.parametrize("replaced", [False, True])
def test_a_press_held_while_spark_starts_reaches_the_handler_before_it_once_it_has_started(
        presses: list[int], replaced: bool) -> None:
    """Cut short, PySpark's launch left Spark's JVM running after the process, for good. The press is
    held, then handed to the handler that was there; one the start put in place (PySpark's) stays."""
    pyspark_like = signal.default_int_handler
    with HeldCtrlC() as held:
        press()  # the launch goes on: nothing is raised in it
        if replaced:
            signal.signal(signal.SIGINT, pyspark_like)
            held.reclaim()
            press()  # held too, after the context started
        assert presses == []
    assert presses == [signal.SIGINT]
    assert (signal.getsignal(signal.SIGINT) is pyspark_like) is replaced


def test_a_start_that_fails_hands_on_no_press(presses: list[int]) -> None:
    """The start's error is what the command reports, not an interrupt raised over it."""
    with pytest.raises(RuntimeError, match="no JVM"), HeldCtrlC():
        press()
        raise RuntimeError("no JVM")
    assert presses == []


def test_with_nothing_pressed_nothing_is_handed_on(presses: list[int]) -> None:
    with HeldCtrlC():
        pass
    assert presses == []


@pytest.mark.usefixtures("python_default")
def test_a_press_held_while_spark_starts_is_a_runs_first_press(caplog: pytest.LogCaptureFixture) -> None:
    """The two together, as a Spark run starts: the held press stops the run, a second interrupts."""
    stops: list[bool] = []
    run = FirstCtrlC("interrupted while the run starts", on_press=lambda: stops.append(True))
    try:
        with HeldCtrlC():
            press()
            assert stops == []
        assert run.pressed and stops == [True]
        assert "interrupted while the run starts" in caplog.text
        with pytest.raises(KeyboardInterrupt):
            press()
    finally:
        run.restore()


@pytest.mark.usefixtures("python_default")
def test_python_default_handler_raises_once_spark_has_started() -> None:
    """Any other command (``maintain`` through delta-spark) is interrupted, once the session is up."""
    with pytest.raises(KeyboardInterrupt), HeldCtrlC():
        press()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("ignored")
def test_an_ignored_ctrl_c_stays_ignored() -> None:
    with HeldCtrlC():
        press()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.usefixtures("python_default")
def test_the_first_press_stops_and_the_second_interrupts(caplog: pytest.LogCaptureFixture) -> None:
    stops: list[bool] = []
    run = FirstCtrlC("interrupted: the batch under way finishes", on_press=lambda: stops.append(True))
    try:
        press()
        assert run.pressed and stops == [True]
        with pytest.raises(KeyboardInterrupt):
            press()
    finally:
        run.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.usefixtures("ignored")
def test_where_ctrl_c_is_ignored_a_run_ignores_it_and_sigterm_still_stops_it() -> None:
    """The run's handler replaced the ignore: Ctrl-C at a script's terminal stopped its background runs."""
    stops: list[bool] = []
    run = FirstCtrlC("interrupted: the batch under way finishes", on_press=lambda: stops.append(True))
    try:
        press()
        assert not run.pressed and stops == [] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        terminate(None)  # SIGTERM, as the command's handler passes it on
        assert run.pressed and stops == [True]
        with pytest.raises(KeyboardInterrupt):
            terminate(None)
    finally:
        run.restore()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.usefixtures("ignored")
def test_where_ctrl_c_is_ignored_it_is_ignored_again_once_spark_has_started() -> None:
    """PySpark's context puts its handler in place whatever was there: taken back, it is the ignore again."""
    with HeldCtrlC() as held:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # PySpark's, as its context starts
        held.reclaim()
        press()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.usefixtures("ignored")
def test_sigterm_while_spark_starts_is_held_then_ends_a_command_that_ignores_ctrl_c() -> None:
    with pytest.raises(KeyboardInterrupt), HeldCtrlC():
        terminate(None)
        time.sleep(0.1)  # the launch goes on


@pytest.mark.usefixtures("ignored")
def test_sigterm_while_a_runs_spark_starts_stops_the_run_where_ctrl_c_is_ignored() -> None:
    stops: list[bool] = []
    run = FirstCtrlC("interrupted while the run starts", on_press=lambda: stops.append(True))
    try:
        with HeldCtrlC():
            terminate(None)
            assert stops == []
        assert stops == [True]
    finally:
        run.restore()


@pytest.mark.usefixtures("python_default")
def test_sigterm_reaches_the_innermost_handler_else_interrupts() -> None:
    with pytest.raises(KeyboardInterrupt):
        terminate(None)
    outer, inner = FirstCtrlC("outer"), FirstCtrlC("inner")
    try:
        terminate(None)
        assert (outer.pressed, inner.pressed) == (False, True)
    finally:
        inner.restore()
        outer.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
