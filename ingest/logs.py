"""The engine's log lines: plain text for a terminal, or one JSON object per line for a log pipeline.

``ingest --log-format json`` (or ``CDC_INGEST_LOG_FORMAT=json``) writes each record as one JSON
object with ``time``, ``level``, ``logger`` and ``message``, and, for the engine's events, ``event``
with its ``table``, ``batch`` and ``figures`` (:func:`event`). ``--log-level`` sets how much the engine
says; the libraries it uses are heard from warning, or from debug with ``--log-level debug``. Every
line, in either format, is redacted as a whole after it is rendered (:func:`ingest.secrets.redact`),
so no credential the process knows reaches a log, whichever field carried it.

What others write to the process's stderr -- Spark's JVM prints a few lines of its own at start,
a library may print a warning -- is wrapped as well in JSON mode (:func:`json_stderr`): every line
of stderr is then one JSON object.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from datetime import UTC, datetime
from typing import Any, Final, Literal, get_args

from pythonjsonlogger.json import JsonFormatter

from ingest import secrets

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
#: The variables of ``--log-format`` and ``--log-level``: the CLI reads them, and sets them for the
#: processes it starts (:func:`export`), so that the engine's code Spark runs elsewhere logs alike.
FORMAT_VARIABLE: Final = "CDC_INGEST_LOG_FORMAT"
LEVEL_VARIABLE: Final = "CDC_INGEST_LOG_LEVEL"
TEXT: Final = "%(levelname)s %(name)s: %(message)s"
#: the engine's loggers, which ``--log-level`` sets; other libraries' show from warning (all with debug)
ENGINE: Final = "ingest"
#: the logger librdkafka's own lines go to (shown with ``--log-level debug``)
LIBRDKAFKA: Final = "ingest.librdkafka"
#: pyspark's loggers of the query context of every captured error (shown with ``--log-level debug``)
PYSPARK_ERROR_LOGGERS: Final = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


class _RedactedText(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return secrets.redact(super().format(record))


class _RedactedJson(JsonFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return secrets.redact(super().format(record))


def configure(fmt: LogFormat = "text", level: LogLevel = "warning") -> None:
    """Send the root logger's records to stderr in ``fmt`` at ``level`` and above (replacing its handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_RedactedJson(
            "%(asctime)s %(levelname)s %(name)s %(message)s", timestamp=False,
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z"))
    else:
        handler.setFormatter(_RedactedText(TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    # the level is the engine's: libraries (Great Expectations, py4j, the HTTP clients) log hundreds of
    # lines at info about themselves, so their lines show from warning, and all of them when debugging
    engine = logging.getLevelNamesMapping()[level.upper()]
    root.setLevel(engine if level == "debug" else max(logging.WARNING, engine))
    logging.getLogger(ENGINE).setLevel(engine)
    # librdkafka repeats every failed connection attempt; the engine's own error says why, once
    logging.getLogger(LIBRDKAFKA).setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)
    # pyspark logs each error a DataFrame operation raises, with the JVM's stack trace, as JSON of its own
    # (a handler of its own, not propagated); the engine says what failed in one line of its own
    for name in PYSPARK_ERROR_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)
    secrets.install_log_redaction(root)


def export(fmt: LogFormat, level: LogLevel) -> None:
    """Leave ``fmt`` and ``level`` in the environment of the processes this one starts: Spark's JVM, and
    through it the Python processes that run the engine's code (:func:`inherit`)."""
    os.environ[FORMAT_VARIABLE] = fmt
    os.environ[LEVEL_VARIABLE] = level


def inherit() -> None:
    """Log as the ``ingest`` process that started Spark, in a process Spark started to run the engine's
    code (the Python data source's runner, which asks the source for offsets between micro-batches):
    the format and level from the environment (:func:`export`), the same redaction, the same quiet
    librdkafka. Without it Python's last-resort handler would print bare messages -- and every failed
    connection attempt of librdkafka during a broker outage. Nothing changes in a process whose root
    logger has a handler already (the CLI's own process, a test)."""
    if logging.getLogger().handlers:
        return
    fmt, level = os.environ.get(FORMAT_VARIABLE, "text"), os.environ.get(LEVEL_VARIABLE, "warning")
    configure(fmt if fmt in get_args(LogFormat) else "text",  # type: ignore[arg-type]
              level if level in get_args(LogLevel) else "warning")  # type: ignore[arg-type]


def event(log: logging.Logger, name: str, message: str, *, table: str | None = None, batch: int | None = None,
          level: int = logging.INFO, **figures: Any) -> None:
    """Log one of the engine's events: ``message`` for a reader, ``event``/``table``/``batch``/``figures``
    for a log pipeline (fields of the JSON line; the text format shows only the message)."""
    extra: dict[str, Any] = {"event": name}
    if table is not None:
        extra["table"] = table
    if batch is not None:
        extra["batch"] = batch
    if figures:
        extra["figures"] = figures
    log.log(level, message, extra=extra)


_WRAPPED: list[threading.Thread] = []


def level_of_line(text: str) -> str:
    """The level of a line written to stderr as text: the CLI's own ``error:`` line (why a command
    failed) is an error, and so is a log line saying ERROR near its start (Spark's, the JVM's);
    WARN likewise; anything else is information."""
    head = text[:40]
    if text.startswith("error:") or ("ERROR" in head and "WARN" not in head):
        return "ERROR"
    return "WARNING" if "WARN" in head else "INFO"


def _on_descriptor_2(stream: Any) -> bool:
    try:
        return bool(stream.fileno() == 2)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return False


def json_stderr() -> None:
    """Make every line written to file descriptor 2 -- by this process or a child it starts later,
    such as Spark's JVM -- one JSON object: lines that are one already pass, others become
    ``{"time", "level", "logger": "stderr", "message"}`` (redacted). For ``--log-format json``.
    ``sys.stderr`` is reopened on the rewired descriptor only if it wrote to descriptor 2 before."""
    if _WRAPPED:
        return
    sys.stderr.flush()
    original = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8")
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    if _on_descriptor_2(sys.stderr):
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    # else a caller captures Python's stderr (a test's CLI runner): its stream stays, and only what
    # reaches descriptor 2 becomes JSON -- replacing it would drop the caller's last reference and close it

    def pump() -> None:
        with os.fdopen(read, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                text = line.rstrip("\n")
                if not text.strip():
                    continue
                if not (text.startswith("{") and text.endswith("}")):
                    text = json.dumps({"time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S%z"),
                                       "level": level_of_line(text),
                                       "logger": "stderr", "message": secrets.redact(text)})
                original.write(text + "\n")

    pumping = threading.Thread(target=pump, name="json-stderr", daemon=True)
    pumping.start()
    _WRAPPED.append(pumping)

    def drain() -> None:
        """The lines written last reach the real stderr before the process ends. File descriptor 2
        goes back to the real stderr, which closes this process's end of the pipe: the pump then
        reads to the pipe's end at once, unless a child still holds it (then it gets half a second)."""
        sys.stderr.flush()
        os.dup2(original.fileno(), 2)
        pumping.join(timeout=0.5)
        original.flush()

    atexit.register(drain)
