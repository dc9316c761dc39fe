"""How an ``ingest`` command ends: its exit code, and one line for what went wrong.

Every command exits with one of :class:`Exit`'s codes, documented in ``ingest --help``, so a deploy
script or a scheduler can tell a data mismatch from an outage. An operational error -- missing or
refused credentials, an endpoint that does not answer, a path the file system refuses, bad SQL, a
missing or locked table -- ends in one line naming the cause and the endpoint or object it concerns,
redacted; ``--debug`` shows the traceback instead. What no rule here recognises is an internal
error: one line too, and the traceback with ``--debug``.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
from enum import IntEnum
from typing import Any, Final

from ingest import secrets
from ingest.ctrl_c import terminate
from ingest.errors import (
    ConfigError,
    EnvironmentProblem,
    IngestError,
    LakeUnavailableError,
    QueryError,
    RegistryUnavailableError,
    SourceUnavailableError,
    TableError,
    TopicLogError,
)


class Exit(IntEnum):
    """The exit codes of every ``ingest`` command."""

    OK = 0
    #: the lake differs from its source (``verify``, ``demo``, ``torture``)
    MISMATCH = 1
    #: the command line or the configuration is wrong (a usage error, an invalid file, bad SQL)
    USAGE = 2
    #: something the command needs does not answer or refuses it: the source, the registry, the
    #: lake, Java
    UNAVAILABLE = 3
    #: a table could not be processed (it stopped on an error, or another writer holds it)
    TABLE_FAILED = 4
    #: an error no rule recognises (a bug: run again with --debug and report it)
    INTERNAL = 5
    #: whoever read the output stopped reading (``| head``): ended quietly, as the shell reports a
    #: command that SIGPIPE stopped
    OUTPUT_CLOSED = 128 + signal.SIGPIPE
    #: interrupted (Ctrl-C, SIGINT or SIGTERM) before it finished: Typer's code for a KeyboardInterrupt,
    #: as the shell reports a command SIGINT stopped; ``run`` ends its run instead, with its report and exit 0
    INTERRUPTED = 128 + signal.SIGINT


#: The codes, as ``ingest --help`` lists them.
EXIT_CODES_HELP = ("Exit codes: 0 success; 1 the lake differs from its source; 2 usage or configuration error; "
                   "3 source, registry, lake or Java unavailable; 4 a table failed; 5 internal error "
                   "(--debug shows the traceback); 130 interrupted (Ctrl-C, SIGTERM; run ends with 0); "
                   "141 the output's reader stopped reading.")


def classify(exc: BaseException) -> tuple[Exit, str]:
    """The exit code and the one line for ``exc`` (redacted)."""
    return _code(exc), secrets.redact(_line(exc))


def output_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is the command's standard output refusing a write because its reader went away.

    A broken pipe elsewhere (a socket the command talks to) is an error like any other."""
    if not isinstance(exc, BrokenPipeError):
        return False
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))  # a pipe without its reader
    except (OSError, ValueError, AttributeError):  # no file descriptor: not a pipe the system closed
        return False


def stop_as_interrupted(signum: int, frame: Any) -> None:
    """SIGTERM -- a service manager's stop, ``docker stop``, Kubernetes, ``kill`` -- does what Ctrl-C does:
    a run lets the batch under way commit or cancels it before its commit, releases its tables and
    prints its report; a second one interrupts at once. A process that ignores Ctrl-C (a script's
    background job) still stops (:func:`ingest.ctrl_c.terminate`)."""
    terminate(frame)


def discard_output() -> None:
    """Send what is left to write on standard output nowhere, so that leaving does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _code(exc: BaseException) -> Exit:
    if isinstance(exc, ConfigError | QueryError):
        return Exit.USAGE
    if isinstance(exc, SourceUnavailableError | RegistryUnavailableError | LakeUnavailableError | TopicLogError
                  | EnvironmentProblem):
        return Exit.UNAVAILABLE
    if isinstance(exc, TableError):
        return Exit.TABLE_FAILED
    if isinstance(exc, IngestError):
        return Exit.USAGE
    if _third_party_unavailable(exc):
        return Exit.UNAVAILABLE
    return Exit.INTERNAL


#: What a file system answers when it refuses a path the configuration names: a lake or checkpoint
#: directory that is a file, not writable, read-only or full.
_REFUSED_PATH: Final = frozenset({errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EROFS,
                                  errno.ENOSPC, errno.EDQUOT})


def _third_party_unavailable(exc: BaseException) -> bool:
    """An outage a library reported in its own type, outside the stages that wrap theirs."""
    module = type(exc).__module__ or ""
    if module.startswith(("confluent_kafka", "cimpl", "botocore", "psycopg", "requests", "urllib3")):
        return True
    return isinstance(exc, ConnectionError | TimeoutError) or _refused_path(exc)


def _refused_path(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.filename is not None and exc.errno in _REFUSED_PATH


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, IngestError):
        return first or type(exc).__name__
    if _refused_path(exc):
        assert isinstance(exc, OSError)
        return f"unavailable: {exc.filename}: {exc.strerror}"
    if _code(exc) == Exit.UNAVAILABLE:
        return f"unavailable: {type(exc).__name__}: {first}"
    return f"internal error: {type(exc).__name__}: {first} (run again with --debug for the traceback)"
