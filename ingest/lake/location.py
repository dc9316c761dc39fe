"""Where the lake lives: a local directory or an object-store prefix, behind one path type.

``target.root`` is either a directory (relative to ``workdir``) or an ``s3://bucket/prefix`` URI.
Every Delta table the engine writes (targets, tombstones, audit, quarantine, analytics) is a
:class:`LakePath` below it. A ``LakePath`` carries the storage options that reach it -- endpoint,
region, addressing style, never a credential -- so each delta-rs or polars call opens it the same
way. Credentials come from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``) or the secrets file, which :func:`ingest.secrets.prepare` exports; both
delta-rs and boto3 read them there, so they never pass through a path, a log line or an audit row.
:func:`s3_client` is the boto3 client for what delta-rs does not do: the writer lease, checkpoint
reads, listings.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypeAlias
from urllib.parse import urlsplit

from ingest.errors import EnvironmentProblem

log = logging.getLogger(__name__)

#: URI schemes of the object stores the lake can live on (``s3a`` is Hadoop's name for ``s3``).
OBJECT_STORE_SCHEMES: Final = frozenset({"s3", "s3a"})


def is_uri(value: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` (an object-store location), false for a file-system path."""
    return "://" in str(value)


@dataclass(frozen=True, slots=True)
class LakePath:
    """A location in the lake: a local directory (``uri`` is its absolute path) or ``s3://bucket/key``.

    ``options`` are delta-rs storage options (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...); they are
    not part of equality and hold no secret.
    """

    uri: str
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False, repr=False)

    @classmethod
    def local_dir(cls, path: str | os.PathLike[str]) -> LakePath:
        return cls(str(Path(path)))

    @classmethod
    def of(cls, value: LakePath | str | os.PathLike[str]) -> LakePath:
        """``value`` as a lake path (a plain path or URI carries no storage options)."""
        if isinstance(value, LakePath):
            return value
        return cls(str(value).rstrip("/")) if is_uri(value) else cls.local_dir(value)

    # -- what it is ---------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return not is_uri(self.uri)

    @property
    def local(self) -> Path:
        """The directory, for code that needs the file system (locks, fingerprints of files)."""
        if not self.is_local:
            raise ValueError(f"{self.uri} is on an object store, not a local directory")
        return Path(self.uri)

    @property
    def scheme(self) -> str:
        return urlsplit(self.uri).scheme if not self.is_local else "file"

    @property
    def bucket(self) -> str:
        return urlsplit(self.uri).netloc

    @property
    def key(self) -> str:
        """The object key of this location inside its bucket (no leading or trailing slash)."""
        return urlsplit(self.uri).path.strip("/")

    @property
    def storage_options(self) -> dict[str, str] | None:
        """What delta-rs and polars need to open it (``None`` for a local directory)."""
        return None if self.is_local else dict(self.options)

    # -- where it leads -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> LakePath:
        if self.is_local:
            return LakePath(str(Path(self.uri).parent), self.options)
        head, _, _ = self.uri.rstrip("/").rpartition("/")
        if head.endswith(":/"):  # s3://bucket has no parent
            return self
        return LakePath(head, self.options)

    def __truediv__(self, part: str) -> LakePath:
        if self.is_local:
            return LakePath(str(Path(self.uri) / part), self.options)
        return LakePath(f"{self.uri.rstrip('/')}/{part.strip('/')}", self.options)

    def exists(self) -> bool:
        """True when the local directory or file is there (tools and tests; tables: ``deltaio.open_table``)."""
        return self.local.exists()

    @property
    def spark_uri(self) -> str:
        """The location as Spark names it: Hadoop's S3A file system answers ``s3a://``, not ``s3://``."""
        return "s3a://" + self.uri.split("://", 1)[1] if self.scheme == "s3" else self.uri

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        # os.fspath / open() keep working on local lakes; on S3 they fail here, loudly, not on a
        # file named "s3:" in the working directory.
        return str(self.local)


#: Anything naming a lake location: a :class:`LakePath`, a URI or a local path.
Location: TypeAlias = "LakePath | str | os.PathLike[str]"


#: delta-rs's (object_store's) retry settings, which polars's own reader does not take.
RETRY_OPTIONS: Final = ("max_retries", "retry_timeout", "backoff_config.init_backoff", "backoff_config.max_backoff")


def delta_storage_options(*, endpoint_url: str | None, region: str, path_style: bool,
                          allow_http: bool, retry_seconds: float | None = None) -> Mapping[str, str]:
    """delta-rs/object_store options for an S3-compatible endpoint (credentials excluded).

    ``retry_seconds``: how long each request is retried, with pauses growing from 0.2 s to 10 s, so that
    a store that restarts or stalls for less than that is ridden out instead of failing the batch.
    """
    options = {"AWS_REGION": region, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if path_style else "true"}
    if endpoint_url:
        options["AWS_ENDPOINT_URL"] = endpoint_url
    if allow_http:
        options["AWS_ALLOW_HTTP"] = "true"
    if retry_seconds is not None:
        options.update({"max_retries": "1000", "retry_timeout": f"{max(0, int(retry_seconds))}s",
                        "backoff_config.init_backoff": "200ms", "backoff_config.max_backoff": "10s"})
    return MappingProxyType(options)


def reader_options(options: Mapping[str, str] | None) -> dict[str, str] | None:
    """``options`` without delta-rs's retry settings: what polars's object-store reader accepts."""
    return None if options is None else {k: v for k, v in options.items() if k not in RETRY_OPTIONS}


#: Why a lake or checkpoints on S3 cannot be used here, and what to install.
S3_EXTRA: Final = ("a lake or checkpoints on S3 need boto3, which is not installed: "
                   "pip install 'cdc-lakehouse-ingest[s3]'")


def s3_errors() -> tuple[type[Exception], ...]:
    """botocore's errors (a request to S3 that failed); none without boto3, which no local path needs."""
    # botocore (an extra of the distribution): only where it is installed
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return ()
    return (ClientError, BotoCoreError)


def s3_client(where: LakePath) -> Any:
    """A boto3 S3 client for the endpoint of ``where`` (credentials: the environment's, as delta-rs's).

    Clients are kept per endpoint and keys: the shared tables take a lease at every batch, and
    building a boto3 client costs far more than the lease's two requests.
    """
    options = where.options
    return _client(options.get("AWS_ENDPOINT_URL"), options.get("AWS_REGION"),
                   options.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false") == "true",
                   os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY"),
                   os.environ.get("AWS_SESSION_TOKEN"), _retry_seconds(options))


def _retry_seconds(options: Mapping[str, str]) -> int:
    """``retry_seconds`` back from the storage options, as :func:`delta_storage_options` wrote it."""
    return int(options.get("retry_timeout", "0s").removesuffix("s") or 0)


@lru_cache(maxsize=16)
def _client(endpoint: str | None, region: str | None, virtual: bool, key: str | None, secret: str | None,
            token: str | None, retry_seconds: int) -> Any:
    # boto3 (about 1 s to import, and an extra of the distribution): only for a lake on S3
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise EnvironmentProblem(S3_EXTRA) from None

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=key, aws_secret_access_key=secret,
        aws_session_token=token,
        config=Config(s3={"addressing_style": "virtual" if virtual else "path"},
                      retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=10))
    if retry_seconds > 0:
        # botocore counts attempts, and its pauses between them are drawn at random (from 50 ms up): so
        # many attempts may last well under a second. The lease and the checkpoint reads must ride out
        # a store that restarts for as long as delta-rs does, so their retries are bounded by time.
        client.meta.events.register_first("needs-retry.s3", _RideOut(retry_seconds, endpoint or "AWS S3"))
    return client


#: The answers of a store that is restarting or overloaded; not 501, which a store gives for what it
#: will never do (a conditional put it does not support), and which must fail at once.
_AWAY_STATUS: Final = frozenset({500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class _RideOut:
    """botocore's ``needs-retry`` handler for a store that is away: a request that could not connect,
    was cut off or answered 500, 502, 503 or 504 is tried again, with pauses growing from 0.2 s to 10 s, until
    ``seconds`` have passed since its first failure. Anything else it leaves to botocore's own retries."""

    seconds: float
    endpoint: str
    #: when this client last said that the store is away (once per ``seconds`` at most)
    _said: list[float] = field(default_factory=lambda: [-float("inf")])

    def __call__(self, attempts: int, request_dict: dict[str, Any], response: Any = None,
                 caught_exception: Exception | None = None, **_: Any) -> float | None:
        # botocore (the s3 extra): already loaded, by the client this handler belongs to
        from botocore.exceptions import ConnectionError as Unreachable
        from botocore.exceptions import HTTPClientError

        away = isinstance(caught_exception, (Unreachable, HTTPClientError)) or (
            response is not None and response[0].status_code in _AWAY_STATUS)
        if not away:
            return None
        first = request_dict["context"].setdefault("ingest_first_failure", time.monotonic())
        if attempts == 1 and first - self._said[0] >= self.seconds:  # a wait the user should hear of
            self._said[0] = first
            why = type(caught_exception).__name__ if caught_exception is not None else f"HTTP {response[0].status_code}"
            _say_away(self.endpoint, why, self.seconds)
        left = first + self.seconds - time.monotonic()
        return min(0.2 * 2 ** (attempts - 1), 10.0, left) if left > 0 else None


def say_if_away(where: LakePath) -> None:
    """Warn, once per endpoint and process, when ``where``'s S3 endpoint takes no connection: delta-rs
    then retries each request for ``retry_seconds`` (two minutes by default) without a word, and a
    command against a wrong ``endpoint_url`` would seem to hang. AWS's own endpoints are not asked."""
    if where.is_local:
        return
    endpoint, retry = where.options.get("AWS_ENDPOINT_URL"), _retry_seconds(where.options)
    if endpoint and retry > 0:
        _say_if_away(endpoint, retry)


@lru_cache(maxsize=16)
def _say_if_away(endpoint: str, retry_seconds: int) -> None:
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=2).close()
    except OSError as exc:
        _say_away(endpoint, exc.strerror or type(exc).__name__, retry_seconds)


def _say_away(endpoint: str, why: str, seconds: float) -> None:
    log.warning("the object store at %s does not answer (%s); trying again for up to %.0f s "
                "(target.storage.retry_seconds)", endpoint, why, seconds)


_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")
_URL_PATH: Final = re.compile(r"([a-z][a-z0-9+.-]*://[^/\s\"'<>]*)[^\s\"'<>]*", re.IGNORECASE)
#: What delta-rs's object store says, and what to do about it.
_STORE_CAUSES: Final = (
    (("169.254.169.254", "imds", "credential", "no valid credential", "invalidaccesskeyid"),
     "no usable S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (environment or secrets_file)"),
    # the status as botocore ("(403)") and delta-rs ("403 Forbidden") write it: a bare "403" is also in
    # URLs, such as an endpoint's port 40395 that did not answer
    (("signaturedoesnotmatch", "accessdenied", "(403)", "403 forbidden"),
     "the store refused the credentials (access denied)"),
    (("nosuchbucket",), "the bucket does not exist"),
    (("connection refused", "error sending request", "dns error", "timed out", "tcp connect",
      "could not connect to the endpoint"),
     "the store's endpoint does not answer (target.storage.endpoint_url)"),
)


def unavailable(where: LakePath, exc: BaseException) -> str:
    """One line naming ``where`` and why the store failed (delta-rs's message is several lines; botocore's
    names the URL, not the setting)."""
    text = _ANSI.sub("", str(exc))
    # The paths the message names are not why it failed: a table called "credentials" is no
    # missing credential. Hosts stay (IMDS is one).
    lowered = _URL_PATH.sub(r"\1", text.replace(where.key, "") if where.key else text).lower()
    for needles, cause in _STORE_CAUSES:
        if any(n in lowered for n in needles):
            return f"lake {where.uri}: {cause}"
    first = next((line.strip(" ↳") for line in text.splitlines() if line.strip(" ↳")), type(exc).__name__)
    return f"lake {where.uri}: {first}"
