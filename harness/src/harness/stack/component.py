"""One component of the stack: how to prepare, start, probe and stop it."""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from harness.stack.process import Progress, alive, read_pid
from harness.stack.settings import StackSettings


@dataclass(frozen=True)
class Launch:
    """How to run a component's process."""

    cmd: list[str]
    cwd: Path
    env: dict[str, str] | None = None
    user: str | None = None


class Component(ABC):
    """A server of the stack, with its files under ``$STACK_DIR/<name>/``.

    Subclasses say how to prepare (install, render configuration, initialise storage), how to
    launch, how to tell it is healthy and what to do once it is (bootstrap roles, credentials,
    connectors). :class:`harness.stack.Stack` does the rest.
    """

    #: Component name (``pg``, ``kafka``, ``registry``, ``registry-auth``, ``connect``).
    name: str = ""
    #: Components that must be up before this one.
    requires: tuple[str, ...] = ()
    #: Signal for a clean stop.
    stop_signal: int = signal.SIGTERM
    #: Seconds to wait for health after a start (``STACK_TIMEOUT`` overrides).
    start_timeout: float = 120.0
    #: Seconds to wait for a clean stop before SIGKILL.
    stop_timeout: float = 30.0

    def __init__(self, settings: StackSettings, progress: Progress) -> None:
        self.settings = settings
        self.progress = progress

    @property
    def dir(self) -> Path:
        """``$STACK_DIR/<name>``."""
        return self.settings.stack_dir / self.name

    @property
    def log(self) -> Path:
        """The process' stdout and stderr."""
        return self.dir / f"{self.name}.log"

    @property
    def pidfile(self) -> Path:
        """Where the pid is kept."""
        return self.dir / f"{self.name}.pid"

    def pid(self) -> int | None:
        """The pid of the running process, or None (a stale pid file counts as none)."""
        pid = read_pid(self.pidfile)
        return pid if alive(pid, self.marker()) else None

    def marker(self) -> str:
        """A string the process' command line contains (rejects recycled pids)."""
        return str(self.dir)

    @abstractmethod
    def ports(self) -> dict[str, int]:
        """The ports it listens on, by role (the first one is the main port)."""

    def needs_jars(self) -> bool:
        """Whether it runs from the Maven-resolved jars."""
        return False

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Install what is missing and write configuration; runs before every start."""

    @abstractmethod
    def launch(self) -> Launch:
        """The command that runs the server in the foreground."""

    @abstractmethod
    def healthy(self) -> bool:
        """One quick probe: does it answer?"""

    def after_start(self) -> None:  # noqa: B027 - optional hook
        """Idempotent set-up once healthy (also run when it was already up)."""

    def ready(self) -> bool:
        """Healthy, and whatever it must serve is in place (Connect: connectors RUNNING)."""
        return self.healthy()
