"""The suite's memory watch (tests/memory.py): what a worker grown too large leaves behind."""

from __future__ import annotations

from pathlib import Path

from tests import memory


def test_a_worker_past_the_alarm_leaves_the_running_test_and_its_stacks(tmp_path: Path) -> None:
    report = tmp_path / "memory-gw9.txt"
    resident = memory.resident_bytes()
    assert resident > 10 * 1024**2  # a Python process with pytest loaded

    assert memory.check(report, resident * 4) == resident * 4  # below the alarm: nothing written
    assert not report.exists()

    following = memory.check(report, 1)
    written = report.read_text()
    assert "test_a_worker_past_the_alarm_leaves_the_running_test_and_its_stacks" in written.splitlines()[0]
    assert 'File "' in written and "in check" in written  # every thread's Python stack
    assert following >= resident + memory.ALARM_STEP_GIB * 1024**3  # the next report a step higher
