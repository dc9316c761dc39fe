"""Exception hierarchy.

One root (:class:`IngestError`). Classes the loop handles by name: :class:`SchemaIncompatibleError`
stops one table, :class:`OffsetsConflictError` refuses to move progress backwards,
:class:`CommitConflictError` reports a second writer, :class:`QualityGateError` stops a table whose
batch failed expectations under policy ``fail``. Record-level failures are :class:`DecodeError`
(and failed expectations under policy ``quarantine``) and end in quarantine, never in a bare
``except``.
"""

from __future__ import annotations

import re
from typing import ClassVar


def first_line(error: BaseException | str) -> str:
    """The first line of an error's text (a driver's message often goes on with context and hints), or
    an exception's class name when it has no text: what a one-line report of the error shows."""
    lines = str(error).strip().splitlines()
    if lines:
        return lines[0].strip()
    return type(error).__name__ if isinstance(error, BaseException) else ""


def shortened(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``...`` where it was cut: a value or a
    reason shown in one line of a report."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class IngestError(Exception):
    """Root of every error raised by the engine.

    ``transient`` says what the engine does about it: a transient error (a registry or broker that
    does not answer, a concurrent commit) is retried with backoff; a terminal one (bad configuration,
    an incompatible schema, a failed quality gate) stops the table until someone acts.
    """

    transient: ClassVar[bool] = False


class ConfigError(IngestError):
    """The configuration file is missing or invalid; the message names the file and the field."""


class EnvironmentProblem(IngestError):
    """The machine lacks something the engine needs (for example Java for Spark)."""


class DecodeError(IngestError):
    """One message cannot be turned into a change event; it goes to quarantine with this reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SchemaRegistryError(IngestError):
    """A schema id is unknown or a schema cannot be registered."""


class TopicLogError(IngestError):
    """The embedded topic log is missing, corrupt, or was asked for offsets it does not hold."""


class TableError(IngestError):
    """A target table cannot accept the batch; the table stops, the others go on."""

    def __init__(self, table: str, message: str) -> None:
        super().__init__(f"table {table!r}: {message}")
        self.table = table


class SchemaIncompatibleError(TableError):
    """A column changed type in a way that cannot be applied safely (not a widening)."""

    def __init__(self, table: str, column: str, current: str, incoming: str) -> None:
        super().__init__(
            table,
            f"column {column!r} changed type from {current} to {incoming}, which is not a safe widening; "
            "nothing was committed for this table. Revert the source's change, or give the table's column the new "
            f"type: ingest retype {table} {column} <type> (docs/operations.md#a-column-changed-type-at-the-source)",
        )
        self.column = column
        self.current = current
        self.incoming = incoming


class OffsetsConflictError(TableError):
    """A batch would move the recorded source offsets of a table backwards."""


class TopicBehindTableError(TableError):
    """The table's topic ends before offsets the table applied. A Kafka topic never takes records back --
    retention and compaction drop records but keep their offsets -- so it was deleted and created again
    (or it is another cluster's, or an unclean leader election lost its tail): the records at those
    offsets now are not the ones the table read, and a resume by offset would skip them, and as many
    new ones after them.

    Args:
        behind: partition -> (the last offset the table applied, the partition's end offset).
    """

    def __init__(self, table: str, topic: str, behind: dict[int, tuple[int, int]]) -> None:
        where = "; ".join(f"partition {p} {f'ends at offset {end - 1}' if end else 'is empty'}, the table applied "
                          f"up to {applied}" for p, (applied, end) in sorted(behind.items()))
        super().__init__(table, (
            f"topic {topic} ends before the offsets the table applied: {where}. A topic keeps its offsets, so it "
            "was deleted and created again, or it is another cluster's; its records are not the ones the table "
            "read, and none of them is applied. Point tables[].topic and source.kafka at the table's source or, "
            "if this topic is its source now, rebuild the table from it "
            "(docs/operations.md#a-topic-that-ends-before-its-table)"))
        self.topic = topic
        self.behind = behind


class CommitConflictError(TableError):
    """Another writer committed to the table concurrently (transient: the retry re-reads the table)."""

    transient: ClassVar[bool] = True


class SuiteError(ConfigError):
    """A Great Expectations suite cannot be loaded or does not fit its table; raised at start-up."""


class SuiteMismatchError(TableError):
    """A suite names a column the batch does not have (found on a table's first batch, before any commit)."""


class QualityGateError(TableError):
    """Expectations under policy ``fail`` failed: nothing was committed and the offsets did not advance.

    Attributes:
        expectations: names of the failed ``fail``-policy expectations.
    """

    def __init__(self, table: str, message: str, expectations: list[str]) -> None:
        super().__init__(table, message)
        self.expectations = expectations


class TableLockedError(TableError):
    """Another process is writing the table: one writer per table (see README, "Operating rules").

    Attributes:
        holder: what the lock file says about the holder (pid, host, since), if readable.
    """

    def __init__(self, table: str, message: str, holder: str) -> None:
        super().__init__(table, message)
        self.holder = holder


class RegistryUnavailableError(IngestError):
    """The schema registry could not answer (network, authentication, server error).

    Not the message's fault, so nothing is quarantined: the batch fails, the table stops, and the
    next run retries. The message is already redacted (no URL credentials). ``status`` is the HTTP
    status the registry answered with, if it answered.
    """

    transient: ClassVar[bool] = True

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def refused(self) -> bool:
        """The registry answered, and waiting does not mend its answer, as
        :attr:`SourceUnavailableError.refused` says of the source: it refused the credentials (HTTP 401
        or 403), or the URL leads to no registry API (404 without the registry's error code)."""
        return self.status in (401, 403, 404)


class SourceUnavailableError(IngestError):
    """The source (Kafka broker, embedded topic log) cannot answer: the lag is unknown, not zero.

    Transient: nothing is committed, and the next run or tick asks again. The message names the
    source and what failed, never a credential. ``refused``: the source answered and refused the
    credentials or the TLS handshake, which waiting does not mend.
    """

    transient: ClassVar[bool] = True

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class LakeUnavailableError(IngestError):
    """The lake (a directory or an object store) cannot be read or written: missing credentials, an
    endpoint that does not answer, a bucket that does not exist. The message names the location and
    the cause, never a credential; transient, as a store that answers again serves the next try."""

    transient: ClassVar[bool] = True


class QueryError(IngestError):
    """An analyst's query cannot run: bad SQL, an unknown table, a version or time the table lacks."""


def is_unavailability(exc: BaseException) -> bool:
    """Whether ``exc`` says that something outside answered not, or refused (source, registry, lake)."""
    return isinstance(exc, _UNAVAILABLE)


_UNAVAILABLE = (SourceUnavailableError, RegistryUnavailableError, LakeUnavailableError, TopicLogError)


def unavailability_in(text: str) -> str | None:
    """The line of ``text`` (a Spark error carrying a Python traceback from the source runner) that
    raised one of :func:`is_unavailability`'s errors, without its module; ``None`` if none did."""
    names = tuple(f"ingest.errors.{cls.__name__}: " for cls in _UNAVAILABLE)
    for line in text.splitlines():
        for name in names:
            if name in line:
                return line[line.index(name) + len("ingest.errors."):].strip()
    return None


def engine_error_in(text: str) -> str | None:
    """The line of ``text`` (a Spark error carrying a Python traceback from the source runner) that
    raised one of the engine's own errors, as ``<class>: <message>``; ``None`` if none did."""
    for line in text.splitlines():
        if found := _ENGINE_ERROR.search(line):
            return line[found.start(1):].strip()
    return None


_ENGINE_ERROR = re.compile(r"\bingest(?:\.\w+)+\.(\w+Error): ")


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same work later may succeed (see :class:`IngestError`)."""
    if isinstance(exc, IngestError):
        return exc.transient
    return isinstance(exc, (ConnectionError, TimeoutError))


#: Spark's error condition of a job that was cancelled (``SparkContext.cancelAllJobs``, a query's stop).
_JOB_CANCELLED = "SPARK_JOB_CANCELLED"


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a Spark job cancelled by this process: pyspark's SIGINT
    handler cancels every running job, so a Ctrl-C during a MERGE ends that MERGE, before its commit."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        condition = getattr(current, "getCondition", None)
        if (callable(condition) and condition() == _JOB_CANCELLED) or _JOB_CANCELLED in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False
