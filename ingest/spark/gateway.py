"""Spark's JVM, started as pyspark starts it, its stderr copied to ours less one line of boot noise.

Spark's launcher adds ``--add-modules=jdk.incubator.vector`` to every JVM it starts (a fixed list in
its ``JavaModuleOptions``), and Java then prints :data:`INCUBATOR_WARNING` as it boots, with no
option to silence it: left alone, it is the one line of every Spark run that is not the engine's, in
the demo's output and beside an operational error's one line. The JVM's stderr goes to a pipe; a
thread of this process copies it to our stderr as it comes, less that line. Everything else the JVM
and its Python workers print passes unchanged, and with ``--log-format json`` it then goes through
:func:`ingest.logs.json_stderr` as any other line of our stderr.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import select
import struct
import termios
import threading
import time
from typing import Any, Final

from py4j.java_gateway import JavaGateway
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway

#: What the JVM prints at boot for the module Spark's launcher adds.
INCUBATOR_WARNING: Final = b"WARNING: Using incubator modules: jdk.incubator.vector\n"

#: How long the process's exit waits for the JVM's last lines to be copied.
_EXIT_WAIT: Final = 1.0


class LineFilter:
    """Bytes as they come, less every whole line equal to ``line`` (which ends with a newline).

    What could still become ``line`` is held until its line ends; any other unfinished line goes out
    at once (a JVM's prompt or a line it writes in pieces is not delayed).
    """

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.held = b""
        self.within = False  # the last bytes given out ended inside a line

    def feed(self, data: bytes) -> bytes:
        """What of ``data`` (with what was held) goes out now."""
        data, self.held = self.held + data, b""
        out = []
        while data:
            end = data.find(b"\n") + 1
            piece, data = (data[:end], data[end:]) if end else (data, b"")
            if self.within:
                out.append(piece)
            elif piece != self.line:
                if not end and self.line.startswith(piece):
                    self.held = piece
                    break
                out.append(piece)
            self.within = not end
        return b"".join(out)

    def close(self) -> bytes:
        """What is still held: the stream ended inside a line."""
        held, self.held = self.held, b""
        return held


class _Relay(threading.Thread):
    """Copies the pipe ``source`` to ``sink`` through a :class:`LineFilter` until every writer closed it.

    It never stops reading: a JVM whose stderr pipe is full blocks at its next line. What ``sink``
    refuses (closed, or its reader gone) is dropped from then on.
    """

    def __init__(self, source: int, sink: int) -> None:
        super().__init__(name="spark-jvm-stderr", daemon=True)
        self.source, self.sink = source, sink
        self.copying = threading.Lock()  # held from a read to the end of its write

    def run(self) -> None:
        kept, writable = LineFilter(INCUBATOR_WARNING), True
        ready = select.poll()
        ready.register(self.source, select.POLLIN)
        try:
            while True:
                ready.poll()  # the read comes under the lock: while it is free, nothing is on its way
                with self.copying:
                    chunk = os.read(self.source, 65536)
                    data = kept.feed(chunk) if chunk else kept.close()
                    writable = writable and _write_all(self.sink, data)
                if not chunk:
                    return
        finally:
            os.close(self.source)
            os.close(self.sink)

    def settle(self, timeout: float = _EXIT_WAIT) -> None:
        """Wait (up to ``timeout``) until what the JVM wrote so far is copied: at the process's exit,
        a daemon thread's unfinished copy would be lost."""
        deadline = time.monotonic() + timeout
        while self.is_alive() and self.copying.acquire(timeout=max(deadline - time.monotonic(), 0)):
            try:
                if _unread(self.source) == 0:
                    return
            finally:
                self.copying.release()
            time.sleep(0.01)


def _write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` to ``fd``; ``False`` when ``fd`` refuses it."""
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        return False
    return True


def _unread(fd: int) -> int:
    """How many bytes the pipe ``fd`` holds unread (0 once it is closed)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0


def launch(conf: SparkConf, **popen_kwargs: Any) -> JavaGateway:
    """pyspark's :func:`~pyspark.java_gateway.launch_gateway`, the JVM's stderr copied through the filter.

    Without a stderr of our own to copy to (closed), the JVM is started as pyspark starts it.
    """
    try:
        sink = os.dup(2)
    except OSError:
        return launch_gateway(conf, popen_kwargs=popen_kwargs)
    source, writer = os.pipe()
    relay = _Relay(source, sink)
    relay.start()  # before the JVM starts: it must never wait for the pipe to be read
    atexit.register(relay.settle)
    try:
        return launch_gateway(conf, popen_kwargs={**popen_kwargs, "stderr": writer})
    finally:
        os.close(writer)  # the JVM holds its own copy: the pipe ends when it exits


def context(conf: SparkConf) -> SparkContext:
    """The process's SparkContext, as :meth:`SparkContext.getOrCreate` gives it; a JVM it starts is
    started by :func:`launch`."""
    with SparkContext._lock:
        if SparkContext._active_spark_context is None:
            gateway = None if SparkContext._gateway else launch(conf)
            SparkContext(conf=conf, gateway=gateway)
        assert SparkContext._active_spark_context is not None
        return SparkContext._active_spark_context
