"""Spark's JVM prints what it prints on our stderr as it comes, less the incubator warning of its boot."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ingest.spark.gateway import INCUBATOR_WARNING, LineFilter, _Relay

#: A JVM's stderr: the warning first, lines that only resemble it, and a last line left unfinished.
STREAM = (INCUBATOR_WARNING + b"Picked up JAVA_TOOL_OPTIONS: -Dx=1\n"
          + INCUBATOR_WARNING.rstrip(b"\n") + b" and more\n"
          + b"WARNING: Using incubator\n"
          + b"one" + INCUBATOR_WARNING
          + INCUBATOR_WARNING + b"ERROR SparkContext: failed\n" + b"WARNING: Using")
KEPT = (b"Picked up JAVA_TOOL_OPTIONS: -Dx=1\n" + INCUBATOR_WARNING.rstrip(b"\n") + b" and more\n"
        + b"WARNING: Using incubator\n" + b"one" + INCUBATOR_WARNING + b"ERROR SparkContext: failed\n"
        + b"WARNING: Using")


def _filtered(chunks: list[bytes]) -> bytes:
    kept = LineFilter(INCUBATOR_WARNING)
    return b"".join(kept.feed(chunk) for chunk in chunks) + kept.close()


def test_only_whole_lines_equal_to_the_warning_are_left_out_wherever_the_reads_end() -> None:
    """The pipe gives what the JVM wrote in reads of any length: a line is judged when it has ended,
    and its end is judged with its start (the warning's text after another line's start is kept)."""
    assert [cut for cut in range(len(STREAM) + 1) if _filtered([STREAM[:cut], STREAM[cut:]]) != KEPT] == []
    assert _filtered([bytes([b]) for b in STREAM]) == KEPT


def test_an_unfinished_line_goes_out_at_once_unless_it_could_be_the_warning() -> None:
    kept = LineFilter(INCUBATOR_WARNING)
    assert kept.feed(b"Enter a value: ") == b"Enter a value: "  # not held until its line ends
    assert kept.feed(b"WARNING: Using incubator") == b"WARNING: Using incubator"  # inside that line
    assert kept.feed(b"\nWARNING: Using incubator") == b"\n"  # could be the warning: held
    assert kept.feed(b" modules: jdk.incubator.vector\nnext") == b"next"


def _pipe_reader(fd: int, into: bytearray) -> threading.Thread:
    def read() -> None:
        with open(fd, "rb") as pipe:
            into.extend(pipe.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_the_relay_copies_what_the_jvm_writes_and_ends_with_the_pipe() -> None:
    source, writer = os.pipe()
    sink_read, sink = os.pipe()
    copied = bytearray()
    reader = _pipe_reader(sink_read, copied)
    relay = _Relay(source, sink)
    relay.start()
    os.write(writer, STREAM)
    os.close(writer)  # the JVM exits
    relay.join(timeout=10)
    reader.join(timeout=10)
    assert not relay.is_alive() and bytes(copied) == KEPT


def test_the_relay_settles_once_everything_written_is_copied() -> None:
    source, writer = os.pipe()
    sink_read, sink = os.pipe()
    relay = _Relay(source, sink)
    relay.start()
    os.write(writer, b"line one\n" * 1000)
    relay.settle(timeout=10)
    os.set_blocking(sink_read, False)
    assert os.read(sink_read, 1 << 20) == b"line one\n" * 1000  # all of it, before the process would exit
    os.close(writer)
    relay.join(timeout=10)
    os.close(sink_read)


def test_the_jvm_never_waits_on_a_stderr_that_is_gone() -> None:
    """``ingest run 2>&1 | head`` and its reader ended: the JVM's pipe is still read, and what it
    writes is dropped, or the JVM would block at its next line once the pipe's 64 KiB are full."""
    source, writer = os.pipe()
    sink_read, sink = os.pipe()
    os.close(sink_read)
    relay = _Relay(source, sink)
    relay.start()
    written: list[int] = []
    wrote = threading.Thread(target=lambda: written.append(os.write(writer, b"x" * 4096 * 1024)), daemon=True)
    wrote.start()
    wrote.join(timeout=30)
    assert not wrote.is_alive(), "the JVM's writes blocked"
    assert written == [4096 * 1024]  # the pipe was read to the end, never closed on the JVM
    os.close(writer)
    relay.join(timeout=10)
    assert not relay.is_alive()


@pytest.mark.spark
def test_a_session_prints_what_its_jvm_prints_less_the_warning(tmp_path: Path) -> None:
    """Every start of Spark 4 on Java 17 printed the warning: the demo's output, and an operational
    error's one line, had it beside them."""
    script = tmp_path / "jvm.py"
    script.write_text(
        "from ingest.spark.session import get_spark\n"
        "err = get_spark('local[1]', 1).sparkContext._jvm.java.lang.System.err\n"
        "err.println('a line of the JVM')\n"
        "err.print('its last, unfinished')\n"
        "err.flush()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert b"a line of the JVM\n" in done.stderr and done.stderr.endswith(b"its last, unfinished"), done.stderr
    assert b"incubator" not in done.stderr, done.stderr
