"""``ingest run`` as a child process: started, watched, killed, restarted; its output in numbered logs.

Each start runs ``python -m ingest.cli run -c <config> [--continuous]`` in its own session (process
group), so a SIGKILL of the group takes the Spark JVM and the Python workers with the driver, as
a crash would. ``INGEST_KILL_AT`` (:mod:`ingest.crashpoints`) can be armed per start so that the process
kills itself at a named point. Output (stdout and stderr) goes to ``<logs>/<name>-<n>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO


class IngestProcess:
    """One ``ingest run`` at a time, for a configuration.

    Args:
        config: the configuration file.
        logs: directory for the output of each start.
        env: the child's environment (credentials included; ``INGEST_KILL_AT`` is set per start).
        continuous: pass ``--continuous``.
        name: prefix of the log files.
        cwd: the child's working directory (default: this process's).
        args: more options of ``ingest run`` (``--metrics-port``, say).
    """

    def __init__(self, config: Path, logs: Path, env: dict[str, str], *, continuous: bool = True,
                 name: str = "ingest", cwd: Path | None = None, args: Sequence[str] = ()) -> None:
        self.config, self.logs, self.env, self.cwd, self.args = config, logs, dict(env), cwd, list(args)
        self.continuous, self.name = continuous, name
        self.starts = 0
        self._seq = 0
        self.armed: str | None = None
        self.started_at = 0.0
        self._child: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self.log_path: Path | None = None
        self.logs.mkdir(parents=True, exist_ok=True)

    def start(self, kill_at: str | None = None) -> None:
        """Start a new process (the previous one must have ended); ``kill_at`` arms ``INGEST_KILL_AT``."""
        if self.alive:
            raise RuntimeError("the previous ingest process is still running")
        self._close()
        self.starts += 1
        self._seq += 1
        while (self.logs / f"{self.name}-{self._seq:03d}.log").exists():  # an earlier supervisor's logs
            self._seq += 1
        self.armed = kill_at
        env = {k: v for k, v in self.env.items() if k != "INGEST_KILL_AT"}
        if kill_at:
            env["INGEST_KILL_AT"] = kill_at
        self.log_path = self.logs / f"{self.name}-{self._seq:03d}.log"
        self._out = self.log_path.open("wb")
        cmd = [sys.executable, "-m", "ingest.cli", "run", "-c", str(self.config)]
        if self.continuous:
            cmd.append("--continuous")
        cmd += self.args
        self.started_at = time.monotonic()
        self._child = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                       cwd=self.cwd, start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    @property
    def alive(self) -> bool:
        return self._child is not None and self._child.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._child.poll() if self._child is not None else None

    def uptime(self) -> float:
        """Seconds since the current process started."""
        return time.monotonic() - self.started_at

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the process to end; returns its exit code (``-9`` for SIGKILL) or ``None`` on timeout."""
        if self._child is None:
            return None
        try:
            code = self._child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reap()
        return code

    def kill(self) -> int | None:
        """SIGKILL the whole process group (driver, JVM, Python workers); returns the exit code."""
        if self._child is None:
            return None
        self._reap()
        code = self._child.wait()
        self._close()
        return code

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ask the driver to stop (SIGINT: queries stop after their batch); SIGKILL after ``timeout``."""
        if not self.alive:
            return self.returncode
        assert self._child is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._child.pid, signal.SIGINT)
        code = self.wait(timeout)
        return code if code is not None else self.kill()

    def tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of the current log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _reap(self) -> None:
        # The JVM and the Python workers of a dead driver go with its group.
        if self._child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._child.pid, signal.SIGKILL)

    def _close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def run_once(config: Path, logs: Path, env: dict[str, str], *, name: str = "final",
             timeout: float = 900.0) -> tuple[int | None, Path]:
    """``ingest run`` until caught up (``availableNow``).

    Returns:
        The exit code (``None``: it timed out and was killed) and the log file.
    """
    process = IngestProcess(config, logs, env, continuous=False, name=name)
    process.start()
    code = process.wait(timeout)
    if code is None:
        process.kill()
    assert process.log_path is not None
    return code, process.log_path
