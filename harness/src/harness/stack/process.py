"""Background processes of the stack: start with a log and a pid file, wait for health, stop.

Every component runs in its own session (process group), writes stdout and stderr to
``$STACK_DIR/<component>/<component>.log`` and records its pid in ``$STACK_DIR/<component>/<component>.pid``.
A pid file is trusted only while that process is alive, is not a zombie, and its command line still
mentions the stack directory (a recycled pid of some unrelated process is ignored).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.stack.errors import StackError

#: Popen objects of children started by this Python process, so that they can be reaped (a stopped
#: child that is never waited for stays a zombie, and looks alive to ``kill(pid, 0)``).
_children: dict[int, subprocess.Popen[bytes]] = {}

Progress = Callable[[str], None]


def read_pid(pidfile: Path) -> int | None:
    """The pid recorded in ``pidfile``, or None when there is none."""
    try:
        return int(pidfile.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def alive(pid: int | None, marker: str | None = None) -> bool:
    """Whether ``pid`` is a live (non-zombie) process whose command line contains ``marker``.

    Args:
        pid: Process id, or None.
        marker: A string the process' command line must contain (the stack directory), or None.

    Returns:
        True while the process runs.
    """
    if pid is None or pid <= 0:
        return False
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        _children.pop(pid, None)
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    return marker is None or marker in cmdline


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file (empty when it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def as_user(user: str | None) -> dict[str, Any]:
    """``subprocess`` keyword arguments that run a child as ``user`` (only when we are root)."""
    if user is None or os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def spawn(
    cmd: Sequence[str],
    *,
    log: Path,
    pidfile: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start ``cmd`` in the background, in a new session, with output appended to ``log``.

    Args:
        cmd: Program and arguments.
        log: Log file for stdout and stderr (appended to).
        pidfile: Where to record the pid.
        cwd: Working directory.
        env: Environment (default: this process' environment).
        user: Run as this user (only when running as root: PostgreSQL refuses to run as root).

    Returns:
        The pid.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    kwargs = as_user(user)
    run_env = dict(os.environ if env is None else env)
    if kwargs and user is not None:
        run_env.update(HOME=pwd.getpwnam(user).pw_dir, USER=user, LOGNAME=user)
    with log.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(  # the command is built by the stack from fixed parts
            list(cmd), cwd=cwd, env=run_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, **kwargs,
        )
    _children[proc.pid] = proc
    pidfile.write_text(f"{proc.pid}\n")
    return proc.pid


def stop(pid: int, *, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Stop ``pid`` with ``sig``, then SIGKILL its whole process group after ``timeout`` seconds.

    Args:
        pid: The process (leader of its own process group, see :func:`spawn`).
        sig: The polite signal (SIGTERM; PostgreSQL's fast shutdown is SIGINT).
        timeout: Seconds to wait before SIGKILL.

    Returns:
        True if the process ended on the polite signal, False if it had to be killed.
    """
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        _children.pop(pid, None)
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)  # a stopped process (SIGSTOP, ^Z) acts on the signal once continued
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            _reap(pid)
            return True
        time.sleep(0.1)
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _reap(pid)
    return False


def _reap(pid: int) -> None:
    child = _children.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)


def wait_until(
    check: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    pid: int | None = None,
    log: Path | None = None,
    interval: float = 0.5,
) -> float:
    """Poll ``check`` until it is true; fail early if ``pid`` dies.

    Args:
        check: Health probe; exceptions count as "not yet".
        what: Name used in the error message (``"kafka"``).
        timeout: Seconds before giving up.
        pid: The process being waited for; its death ends the wait at once.
        log: Log whose tail goes into the error.
        interval: Seconds between probes.

    Returns:
        Seconds waited.

    Raises:
        StackError: on timeout or when the process died, with the tail of ``log``.
    """
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # a probe failing is what we are waiting out
            pass
        if pid is not None and not alive(pid):
            raise StackError(_with_tail(f"{what}: the process (pid {pid}) exited before it was healthy", log))
        if time.monotonic() - start > timeout:
            raise StackError(_with_tail(f"{what}: not healthy after {timeout:.0f} s", log))
        time.sleep(interval)


def _with_tail(message: str, log: Path | None) -> str:
    if log is None:
        return message
    text = tail(log)
    return f"{message} (log: {log})" + (f"\n--- last lines of {log.name} ---\n{text}" if text else "")
