"""Credentials: where they come from, and how they are kept out of everything the engine writes.

Secrets -- the schema registry's ``user:password``, Kafka's SASL JAAS config, object-store keys --
come only from the environment or from a secrets file named in the configuration
(``secrets_file``: a YAML mapping ``NAME: value``, read when needed, never copied into the config).
The configuration holds the *names* of environment variables, never values, and refuses values
where a secret would otherwise slip in (credentials in a URL, password options).

Everything written for people or tools passes :func:`redact` at its boundary: log records (see
:func:`install_log_redaction`), error messages of failed tables, audit rows, quarantine reasons and
Dagster metadata. It removes every secret value this process has seen (:func:`register`) and
anything shaped like one (URL user info, ``password=...``, ``Authorization:`` headers), so a
secret is hidden even when a library echoes a value we never looked up ourselves.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import yaml

from ingest import yaml_file
from ingest.errors import ConfigError

#: Object-store credentials delta-rs reads from the environment (it never needs them in the config).
OBJECT_STORE_ENV: Final = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
)
MASK: Final = "***"
_MIN_SECRET: Final = 4  # shorter values would mask ordinary words; they are still never logged by us

_known: set[str] = set()
_lock = threading.Lock()
_files: dict[tuple[str, float], dict[str, str]] = {}

_URL_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@]+@")
_KEY_VALUE: Final = re.compile(
    r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|user[._]info|jaas[._]config)"
    r"(\"?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&}\"']+)"
)
_AUTH_HEADER: Final = re.compile(r"(?i)\b(authorization\"?\s*[:=]\s*\"?(?:basic|bearer)\s+)[A-Za-z0-9+/=._\-]+")
_URL_CREDENTIALS: Final = re.compile(r"(?i)^[a-z][a-z0-9+.\-]*://[^/\s@]+@")


def register(value: str | None) -> None:
    """Remember a secret value so that :func:`redact` removes it (and its password part) everywhere."""
    if not value:
        return
    parts = {value}
    if ":" in value and "\n" not in value:
        parts.add(value.split(":", 1)[1])  # user:password -> the password alone too
    parts |= {m.group(3).strip("\"'") for m in _KEY_VALUE.finditer(value)}  # password="..." in a JAAS config
    with _lock:
        _known.update(p for p in parts if len(p) >= _MIN_SECRET)


def redact(text: Any) -> str:
    """``text`` without any known secret or credential-shaped substring.

    Use it wherever text leaves the engine: errors, logs, audit rows, quarantine reasons, metadata.
    """
    out = str(text)
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in out:
            out = out.replace(value, MASK)
    out = _URL_USERINFO.sub(rf"\1{MASK}@", out)
    out = _AUTH_HEADER.sub(rf"\1{MASK}", out)
    return _KEY_VALUE.sub(rf"\1\2{MASK}", out)


def describe(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, redacted."""
    return redact(f"{type(exc).__name__}: {exc}")


def has_url_credentials(url: str) -> bool:
    """True if ``url`` carries ``user[:password]@`` (credentials belong in the environment instead)."""
    return bool(_URL_CREDENTIALS.match(url.strip()))


def read_secrets_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``NAME: value`` mapping of a secrets file (cached until the file changes).

    Raises:
        ConfigError: the file is missing or not a mapping of names to strings; the message names
            the file and never shows a value.
    """
    file = Path(path)
    try:
        info = file.stat()
    except FileNotFoundError:
        raise ConfigError(f"secrets file {file} not found") from None
    cached = _files.get((str(file), info.st_mtime))
    if cached is not None:
        return cached
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        logging.getLogger(__name__).warning("secrets file %s is readable by group or others; chmod 600 it", file)
    try:
        data = yaml_file.load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        # Only where, and a repeated name: the parser's own words may quote a line, which may hold a secret.
        repeated = isinstance(exc, yaml_file.RepeatedKeyError)
        said = f"{yaml_file.where(exc)}: {exc.problem}" if repeated else yaml_file.where(exc)
        raise ConfigError(f"secrets file {file}: not valid YAML" + (f" ({said})" if said else "")) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError(f"secrets file {file}: expected a mapping of NAME: \"value\" (strings)")
    for value in data.values():
        register(value)
    _files[(str(file), info.st_mtime)] = data
    return data


def lookup(name: str, secrets_file: str | os.PathLike[str] | None = None) -> str | None:
    """A secret by name: the environment first, then the secrets file; registered for redaction.

    Args:
        name: environment variable / secrets-file entry, e.g. ``SCHEMA_REGISTRY_USER_INFO``.
        secrets_file: optional secrets file.

    Returns:
        The value, or ``None`` when neither source has it.
    """
    value = os.environ.get(name) or None
    if value is None and secrets_file is not None:
        value = read_secrets_file(secrets_file).get(name) or None
    register(value)
    return value


def prepare(names: Iterable[str], secrets_file: str | os.PathLike[str] | None) -> None:
    """Register the secrets this process may meet and export object-store keys from the secrets file.

    delta-rs (and Spark, started later) read object-store credentials from the environment, so
    entries of :data:`OBJECT_STORE_ENV` in the secrets file are exported when not already set.
    """
    for name in (*names, *OBJECT_STORE_ENV):
        register(os.environ.get(name))
    if secrets_file is None:
        return
    entries = read_secrets_file(secrets_file)
    for name in OBJECT_STORE_ENV:
        if name in entries and not os.environ.get(name):
            os.environ[name] = entries[name]


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the rendered message (and drops args and exception text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = None
        record.msg, record.args = redact(message), ()
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Attach :class:`RedactingFilter` to every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
