"""A TCP relay in front of the test S3 server that can go away and come back, as a restarting server does.

moto keeps its objects in memory, so restarting it would lose the lake. Clients that talk to the
relay instead see what a restart looks like from outside: open connections reset, new ones refused
for a while, then the same address answering again, with every object still there.

The relay is a process of its own (this file run as a script), so that a client in the test's
process that holds the GIL while it waits for an answer cannot starve it; an outage kills it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit


class Relay:
    """Relays ``127.0.0.1:<port>`` to ``endpoint``; :meth:`outage` takes it away for a while."""

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self._process: subprocess.Popen[bytes] | None = None
        self._start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        self._process = subprocess.Popen([sys.executable, __file__, str(self.port), *map(str, self.target)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the relay on port {self.port} did not start")

    def _stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)  # the kernel resets every connection it had
            self._process.wait()
            self._process = None

    def outage(self, seconds: float = 4.0) -> float:
        """Reset every connection, refuse new ones for ``seconds``, then relay again; returns the seconds away."""
        started = time.monotonic()
        self._stop()
        time.sleep(seconds)
        self._start()
        return time.monotonic() - started

    def close(self) -> None:
        self._stop()


# -- the relay process --------------------------------------------------------------------------------
def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def _serve(port: int, target: tuple[str, int]) -> None:
    class Pipe(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            try:
                upstream = socket.create_connection(target, timeout=30)
            except OSError:
                return
            pump = threading.Thread(target=_copy, args=(upstream, self.request), daemon=True)
            pump.start()
            _copy(self.request, upstream)
            pump.join()

    class Listener(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    with Listener(("127.0.0.1", port), Pipe) as server:
        server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), (sys.argv[2], int(sys.argv[3])))
