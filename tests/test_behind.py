"""ingest.behind: the background thread that checkpoints, packs and audit appends run on."""

from __future__ import annotations

import threading

import pytest

from ingest.behind import Behind


def test_work_runs_in_turn_on_one_thread_that_starts_with_the_first_piece() -> None:
    behind = Behind("test-behind")
    assert not [t for t in threading.enumerate() if t.name.startswith("test-behind")]
    done: list[tuple[int, str]] = []
    gate = threading.Event()
    behind.submit(lambda: gate.wait(10))
    for i in range(3):
        behind.submit(lambda i=i: done.append((i, threading.current_thread().name)))
    assert done == []  # held behind the first
    gate.set()
    behind.wait()
    assert [i for i, _ in done] == [0, 1, 2]
    assert len({name for _, name in done}) == 1 and done[0][1].startswith("test-behind")
    assert behind.close() == []


def test_a_failure_is_kept_until_someone_waits_or_closes() -> None:
    behind = Behind("test-behind")

    def fail(message: str) -> None:
        raise OSError(message)

    behind.submit(lambda: None)
    behind.submit(fail, "first").exception(timeout=10)  # both done
    behind.submit(lambda: None)  # a later submit forgets the work done well, never a failure
    with pytest.raises(OSError, match="first"):
        behind.wait()
    behind.wait()  # raised once: what waits next sees only what came after
    behind.submit(fail, "second")
    behind.submit(lambda: None)
    assert [str(e) for e in behind.close()] == ["second"]
