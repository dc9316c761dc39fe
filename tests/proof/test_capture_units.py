"""wait_for_capture's stall handling, with the database's answers scripted."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.verify import capture
from ingest.verify.capture import SlotState


class _Slots:
    """A slot that confirms nothing until ``on_stall`` ran ``heal_after`` times."""

    def __init__(self, heal_after: int | None) -> None:
        self.heal_after = heal_after
        self.stalls = 0
        self.markers = 0

    def states(self, _conn: Any, _target: str) -> list[SlotState]:
        healed = self.heal_after is not None and self.stalls >= self.heal_after
        return [SlotState("pgjson", True, "0/20" if healed else "0/10", healed)]

    def on_stall(self) -> None:
        self.stalls += 1


@pytest.fixture
def slots(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Slots]:
    @contextlib.contextmanager
    def connect(*_args: Any, **_kwargs: Any) -> Iterator[object]:
        yield object()

    monkeypatch.setattr(capture.psycopg, "connect", connect)
    monkeypatch.setattr(capture, "current_lsn", lambda _conn: "0/20")
    monkeypatch.setattr(capture, "STALL_SECONDS", 0.02)
    scripted = _Slots(heal_after=None)

    def marker(_conn: Any, _target: str) -> None:
        scripted.markers += 1

    monkeypatch.setattr(capture, "slot_states", scripted.states)
    monkeypatch.setattr(capture, "_emit_marker", marker)
    yield scripted


def test_a_stalled_capture_is_restarted_once_and_then_completes(slots: _Slots) -> None:
    slots.heal_after = 1
    result = capture.wait_for_capture("dsn", timeout=5, poll=0.01, on_stall=slots.on_stall, restart_after=0.1)
    assert result.ok and result.restarts == 1 and slots.stalls == 1
    assert slots.markers >= 1  # markers were tried before the restart


def test_restarts_are_bounded_and_a_capture_that_never_moves_times_out(slots: _Slots) -> None:
    result = capture.wait_for_capture("dsn", timeout=1.0, poll=0.01, on_stall=slots.on_stall, restart_after=0.1)
    assert not result.ok and result.problem and "have not confirmed" in result.problem
    assert result.restarts == slots.stalls == capture.MAX_RESTARTS


def test_without_on_stall_the_wait_only_writes_markers(slots: _Slots) -> None:
    result = capture.wait_for_capture("dsn", timeout=0.5, poll=0.01, restart_after=0.1)
    assert not result.ok and result.restarts == 0 and slots.stalls == 0


class _OneStuck(_Slots):
    """Two connectors: ``pgjson`` confirms every marker, ``pgavro`` is blocked until ``on_stall`` ran."""

    def states(self, _conn: Any, _target: str) -> list[SlotState]:
        healed = self.heal_after is not None and self.stalls >= self.heal_after
        return [SlotState("pgavro", True, "0/30" if healed else "0/10", healed),
                SlotState("pgjson", True, f"0/{30 + self.markers:x}", True)]


def test_one_blocked_connector_is_a_stall_while_the_other_confirms_every_marker(
        slots: _Slots, monkeypatch: pytest.MonkeyPatch) -> None:
    both = _OneStuck(heal_after=1)
    monkeypatch.setattr(capture, "slot_states", both.states)
    monkeypatch.setattr(capture, "_MARKER_EVERY", 0.02)  # the healthy slot moves far more often than restart_after

    def marker(_conn: Any, _target: str) -> None:
        both.markers += 1

    monkeypatch.setattr(capture, "_emit_marker", marker)
    result = capture.wait_for_capture("dsn", timeout=5, poll=0.01, on_stall=both.on_stall, restart_after=0.2)
    assert result.ok and result.restarts == 1 and both.stalls == 1
    assert both.markers > 3  # pgjson kept moving before the restart


class _SlowAfterRestart(_Slots):
    """Stuck until ``on_stall`` ran once; from then on it confirms something new at every look, and
    has caught up ``catch_up`` seconds after the restart."""

    def __init__(self, catch_up: float) -> None:
        super().__init__(heal_after=1)
        self.catch_up = catch_up
        self.restarted_at: float | None = None
        self.looks = 0

    def states(self, _conn: Any, _target: str) -> list[SlotState]:
        if self.restarted_at is None:
            return [SlotState("pgavro", True, "0/10", False)]
        self.looks += 1
        done = time.monotonic() - self.restarted_at >= self.catch_up
        return [SlotState("pgavro", True, "0/ffff" if done else f"0/{0x10 + self.looks:x}", done)]

    def on_stall(self) -> None:
        super().on_stall()
        self.restarted_at = time.monotonic()


def test_the_seconds_a_restart_remedied_do_not_count_against_the_timeout(
        slots: _Slots, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 s stalled, then 1.2 s to catch up: 2.2 s in all against a 1.6 s timeout. The stall was
    Connect's, and was mended: the capture itself took 1.2 s, so the wait succeeds."""
    slow = _SlowAfterRestart(catch_up=1.2)
    monkeypatch.setattr(capture, "slot_states", slow.states)
    result = capture.wait_for_capture("dsn", timeout=1.6, poll=0.01, on_stall=slow.on_stall, restart_after=1.0)
    assert result.ok and result.restarts == 1
    assert result.seconds > 2.1  # longer than the timeout, in all
