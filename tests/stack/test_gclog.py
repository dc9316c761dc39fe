"""The stack's Java servers log their garbage-collection pauses, and the log of a window is read back."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness.stack import gclog
from harness.stack.kafka import jvm_options

#: A program that makes the JVM collect three times on request, then a while later once more.
_PROGRAM = """
public class Collect {
    public static void main(String[] args) throws Exception {
        for (int i = 0; i < 3; i++) {
            byte[][] junk = new byte[64][];
            for (int j = 0; j < 64; j++) junk[j] = new byte[1 << 16];
            System.gc();
        }
        Thread.sleep(1500);
        System.gc();
    }
}
"""


def test_a_servers_pauses_are_logged_and_read_back_by_window(tmp_path: Path) -> None:
    java = shutil.which("java")
    assert java is not None, "java is needed by the stack and by this test"
    (tmp_path / "Collect.java").write_text(_PROGRAM)
    flags = [flag for flag in jvm_options("64m", tmp_path) if not flag.startswith("-Xms")]
    began = time.time()
    subprocess.run([java, *flags, str(tmp_path / "Collect.java")], check=True, capture_output=True, timeout=120)
    ended = time.time()
    every = gclog.pauses(tmp_path, began, ended)
    assert every is not None and every.count >= 4  # the four requested, and any the compiler needed
    assert 0 < every.longest <= every.milliseconds
    lines = [line for line in (tmp_path / gclog.GC_LOG).read_text().splitlines() if "Pause Full" in line]
    last = gclog.pauses(tmp_path, ended - 1.0, ended + 1)  # the last request, 1.5 s after the others
    assert last is not None and last.count >= 1 and last.count < every.count, lines
    assert gclog.pauses(tmp_path, ended + 1, ended + 2) == gclog.Pauses(0, 0.0, 0.0)


def test_a_server_without_a_log_is_told_apart_from_one_without_pauses(tmp_path: Path) -> None:
    assert gclog.pauses(tmp_path, 0, time.time()) is None


@pytest.mark.parametrize("line, ms", [
    ("[2026-12-04T08:33:37.098+0000] GC(90) Pause Full (Allocation Failure) 976M->128M(989M) 299.906ms", 299.906),
    ("[2026-12-04T08:27:08.379+0000][271.972s] GC(3) Pause Young (Allocation Failure) 436M->165M(989M) 42.291ms",
     42.291),
])
def test_a_pause_line_gives_its_time_and_length(tmp_path: Path, line: str, ms: float) -> None:
    (tmp_path / gclog.GC_LOG).write_text("[2026-12-04T08:27:00.000+0000] Using Serial\n" + line + "\n")
    at = 1796373217.098 if "Full" in line else 1796372828.379
    assert gclog.pauses(tmp_path, at - 0.001, at + 0.001) == gclog.Pauses(1, ms, ms)
    assert gclog.pauses(tmp_path, at + 0.001, at + 1).count == 0  # type: ignore[union-attr]
