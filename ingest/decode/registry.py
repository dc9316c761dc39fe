"""Schema registries: the embedded one (files beside the topic log) and Confluent's.

Both answer the two questions the decoder and the producers ask: *which Avro schema has id N*
and *register this schema under this subject*. Avro values then travel in the Confluent wire format
(magic byte 0, 4-byte big-endian schema id, Avro binary), exactly as they would from Kafka.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import fastavro

from ingest import secrets
from ingest.errors import DecodeError, RegistryUnavailableError, SchemaRegistryError
from ingest.lake.locks import exclusive
from ingest.tls import verify_failure

if TYPE_CHECKING:
    from ingest.config import IngestConfig
    from ingest.config.source import TlsSpec

MAGIC_BYTE = 0
_HEADER = struct.Struct(">bI")


class SchemaRegistry(Protocol):
    """What the engine needs from a schema registry."""

    def get_schema(self, schema_id: int) -> dict[str, Any]:
        """Return the parsed (JSON) Avro schema with this id; raise SchemaRegistryError if unknown."""
        ...

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        """Register ``schema`` under ``subject`` (idempotent) and return its id."""
        ...


def frame(schema_id: int, payload: bytes) -> bytes:
    """Prefix Avro binary with the Confluent wire-format header."""
    return _HEADER.pack(MAGIC_BYTE, schema_id) + payload


def unframe(message: bytes) -> tuple[int, memoryview]:
    """Split a Confluent-framed message into ``(schema_id, avro_payload)``.

    Raises:
        DecodeError: the message is too short or does not start with the magic byte.
    """
    if len(message) < _HEADER.size:
        raise DecodeError(f"confluent framing: message of {len(message)} bytes is shorter than the 5-byte header")
    magic, schema_id = _HEADER.unpack_from(message)
    if magic != MAGIC_BYTE:
        looks = "; it starts like JSON: is source.value_format json?" if message[:1] in (b"{", b"[") else ""
        raise DecodeError(f"confluent framing: magic byte is {magic & 0xFF:#04x}, expected 0x00{looks}")
    return schema_id, memoryview(message)[_HEADER.size :]


def _canonical(schema: dict[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


class EmbeddedSchemaRegistry:
    """A schema registry kept as JSON files: ``<root>/ids/<id>.json`` and ``<root>/subjects/<s>.json``.

    Ids are assigned in order under a file lock; registering a schema already known under the
    subject returns its existing id, like Confluent's registry. Safe for several processes.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with exclusive(self.root / ".lock"):
            yield

    def _write_atomic(self, path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        try:
            fastavro.parse_schema(schema)
        except Exception as exc:
            raise SchemaRegistryError(f"subject {subject!r}: not a valid Avro schema: {exc}") from exc
        canonical = _canonical(schema)
        with self._locked():
            subject_file = self._subject_file(subject)
            versions = self._versions(subject)
            for existing in versions:
                if _canonical(self.get_schema(existing)) == canonical:
                    return existing
            ids = [int(p.stem) for p in (self.root / "ids").glob("*.json")] if (self.root / "ids").exists() else []
            new_id = max(ids, default=0) + 1
            self._write_atomic(self.root / "ids" / f"{new_id}.json", {"subject": subject, "schema": schema})
            self._write_atomic(subject_file, [*versions, new_id])
            return new_id

    def get_schema(self, schema_id: int) -> dict[str, Any]:
        return _load_embedded(str(self.root), schema_id)

    def subjects(self) -> dict[str, list[int]]:
        """All subjects with their schema ids, oldest first."""
        folder = self.root / "subjects"
        if not folder.exists():
            return {}
        return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}

    def newest_schema(self, subject: str) -> dict[str, Any] | None:
        """The schema last registered under ``subject`` (``None``: nothing is)."""
        ids = self._versions(subject)
        return self.get_schema(ids[-1]) if ids else None

    def _subject_file(self, subject: str) -> Path:
        return self.root / "subjects" / f"{_safe_name(subject)}.json"

    def _versions(self, subject: str) -> list[int]:
        """The ids registered under ``subject``, oldest first."""
        path = self._subject_file(subject)
        return json.loads(path.read_text()) if path.exists() else []


@lru_cache(maxsize=4096)
def _load_embedded(root: str, schema_id: int) -> dict[str, Any]:
    # Schemas are immutable once written, so caching by (root, id) is safe across batches.
    path = Path(root) / "ids" / f"{schema_id}.json"
    try:
        return json.loads(path.read_text())["schema"]
    except FileNotFoundError:
        raise SchemaRegistryError(f"schema id {schema_id} is not in the registry at {root}") from None


def _safe_name(subject: str) -> str:
    if not subject or "/" in subject or subject.startswith(".") or "\x00" in subject:
        raise SchemaRegistryError(f"subject name {subject!r} is not allowed")
    return subject


class ConfluentSchemaRegistry:
    """Adapter over ``confluent_kafka.schema_registry.SchemaRegistryClient`` for production registries.

    Credentials come from the environment or the secrets file (:meth:`from_settings`), never from
    the configuration or code. Only the registry's "this id does not exist" (HTTP 404 with its error
    code) is the message's fault and ends in quarantine; any other failure (unreachable, 401/403, 5xx,
    a 404 from a URL without the registry's API) raises
    :class:`RegistryUnavailableError` with a redacted message, so the batch fails and nothing is
    quarantined for a registry outage.
    """

    def __init__(self, client_config: dict[str, Any]) -> None:
        # the registry client (about 1 s to import): only for a Confluent-compatible registry
        from confluent_kafka.schema_registry import SchemaRegistryClient

        _register_url_credentials(str(client_config.get("url", "")))
        url = urlsplit(str(client_config.get("url", "")))
        self._where = url.netloc.rpartition("@")[2] or "(no url)"
        self._url = f"{url.scheme}://{self._where}{url.path}"  # as configured, without credentials
        secrets.register(client_config.get("basic.auth.user.info"))
        try:
            self._client = SchemaRegistryClient(client_config)
        except Exception as exc:
            raise RegistryUnavailableError(
                f"schema registry client cannot be created: {secrets.describe(exc)}") from None
        self._cache: dict[int, dict[str, Any]] = {}
        self._versions: dict[tuple[str, int], tuple[int, str]] = {}

    @classmethod
    def from_settings(cls, url: str, *, credentials_env: str | None,
                      secrets_file: str | os.PathLike[str] | None = None,
                      tls: TlsSpec | None = None) -> ConfluentSchemaRegistry:
        """A client for ``url`` with ``user:password`` from ``credentials_env`` (environment, then secrets
        file), trusting and presenting what ``tls`` names."""
        config: dict[str, Any] = {"url": url}
        user_info = secrets.lookup(credentials_env, secrets_file) if credentials_env else None
        if user_info:
            config["basic.auth.user.info"] = user_info
        if tls is not None:
            config.update(tls.client_settings(secrets.lookup(tls.key_password_env, secrets_file)))
        return cls(config)

    def _unreachable(self, doing: str, exc: Exception) -> RegistryUnavailableError:
        """The registry did not answer while ``doing``: its address, and the TLS reason when that is why."""
        why = verify_failure(exc)
        cause = f"TLS handshake failed: {why}" if why else secrets.describe(exc)
        return RegistryUnavailableError(secrets.redact(
            f"schema registry {self._where} unreachable while {doing}: {cause}"))

    def _refused(self, asked: str, exc: Any) -> RegistryUnavailableError:
        """The registry answered the question about ``asked`` with an error other than its "not found"."""
        if exc.http_status_code == 404:  # not the registry's 404: the URL does not lead to its API
            return RegistryUnavailableError(secrets.redact(
                f"schema registry {self._url} has no Confluent-compatible API: HTTP 404 for {asked}, without "
                "a registry's error code (source.registry.url names the API's root; Apicurio's ends in "
                "/apis/ccompat/v7)"), status=404)
        return RegistryUnavailableError(secrets.redact(
            f"schema registry refused {asked}: HTTP {exc.http_status_code} {exc.error_message}"
        ), status=exc.http_status_code)

    def get_schema(self, schema_id: int) -> dict[str, Any]:
        # the registry client (about 1 s to import): only for a Confluent-compatible registry
        from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

        if schema_id not in self._cache:
            try:
                schema = self._client.get_schema(schema_id)
            except ClientError as exc:
                if _not_found(exc):
                    raise SchemaRegistryError(f"schema id {schema_id} is not in the registry") from None
                raise self._refused(f"schema id {schema_id}", exc) from None
            except Exception as exc:  # httpx transport errors and the like: the registry is not there
                raise self._unreachable(f"fetching schema id {schema_id}", exc) from None
            try:
                self._cache[schema_id] = json.loads(schema.schema_str or "")
            except ValueError:
                raise SchemaRegistryError(
                    f"schema id {schema_id}: the registry returned a schema that is not JSON") from None
        return self._cache[schema_id]

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        # the registry client (about 1 s to import): only for a Confluent-compatible registry
        from confluent_kafka.schema_registry import Schema

        return int(self._client.register_schema(subject, Schema(json.dumps(schema), "AVRO")))

    def newest_schema(self, subject: str) -> dict[str, Any] | None:
        """The schema last registered under ``subject`` (``None``: nothing is).

        Raises:
            RegistryUnavailableError: the registry did not answer, or refused (401/403, 5xx).
        """
        # the registry client (about 1 s to import): only for a Confluent-compatible registry
        from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

        try:
            registered = self._client.get_latest_version(subject)
        except ClientError as exc:
            if _not_found(exc):
                return None
            raise self._refused(f"subject {subject}", exc) from None
        except Exception as exc:  # httpx transport errors and the like: the registry is not there
            raise self._unreachable(f"reading subject {subject}", exc) from None
        try:
            return json.loads(registered.schema.schema_str or "")
        except ValueError:
            raise SchemaRegistryError(f"subject {subject}: the registry returned a schema that is not JSON") from None

    def subject_schemas(self, subjects: Iterable[str]) -> dict[int, str]:
        """Every schema registered under ``subjects`` as ``{id: schema JSON}`` (a missing subject is empty).

        A registered version never changes, so each is fetched once per client.

        Raises:
            RegistryUnavailableError: the registry did not answer, or refused (401/403, 5xx).
        """
        # the registry client (about 1 s to import): only for a Confluent-compatible registry
        from confluent_kafka.schema_registry.error import SchemaRegistryError as ClientError

        found: dict[int, str] = {}
        for subject in subjects:
            try:
                versions = self._client.get_versions(subject)
                for version in versions:
                    key = (subject, version)
                    if key not in self._versions:
                        registered = self._client.get_version(subject, version)
                        if registered.schema_id is None:  # a registry that does not say: the worker asks by id
                            continue
                        self._versions[key] = (int(registered.schema_id), registered.schema.schema_str or "")
                    schema_id, text = self._versions[key]
                    found[schema_id] = text
            except ClientError as exc:
                if _not_found(exc):
                    continue
                raise self._refused(f"subject {subject}", exc) from None
            except Exception as exc:
                raise self._unreachable(f"listing subject {subject}", exc) from None
        return found


def _not_found(exc: Any) -> bool:
    """The registry's own "not found": HTTP 404 with a Confluent error code 404xx (40401 subject, 40402
    version, 40403 schema). A 404 without one comes from a server with no registry API at that path."""
    return exc.http_status_code == 404 and isinstance(exc.error_code, int) and exc.error_code // 100 == 404


def confluent_registry(config: IngestConfig) -> ConfluentSchemaRegistry | None:
    """The client of the configuration's Confluent-compatible registry, with the credentials and TLS its
    ``source.registry`` names (``None`` for the embedded registry).

    Raises:
        RegistryUnavailableError: the client cannot be created.
    """
    registry = config.source.registry
    if registry.kind != "confluent" or not registry.url:
        return None
    return ConfluentSchemaRegistry.from_settings(registry.url, credentials_env=registry.credentials_env,
                                                 secrets_file=config.secrets_path, tls=registry.tls)


def driver_registry(config: IngestConfig) -> ConfluentSchemaRegistry | EmbeddedSchemaRegistry:
    """The registry of an Avro source, as the driver asks it: the Confluent-compatible one the
    configuration names, else the embedded one in the workdir.

    Raises:
        RegistryUnavailableError: the client cannot be created.
    """
    return confluent_registry(config) or EmbeddedSchemaRegistry(config.registry_dir)


class PrefetchedSchemaRegistry:
    """Schemas the driver fetched, handed to a worker; an id outside them goes to ``fallback``.

    Debezium's converters register under the topic's subjects (``<topic>-key``/``-value``), so the
    driver's prefetch normally covers a batch and the executors never call the registry: they need
    neither its credentials nor a route to it. ``fallback`` (created on first miss) serves ids
    registered elsewhere (another subject name strategy) with the worker's own credentials.
    """

    def __init__(self, schemas: Iterable[tuple[int, str]], fallback: Callable[[], SchemaRegistry] | None) -> None:
        self._text = dict(schemas)
        self._parsed: dict[int, dict[str, Any]] = {}
        self._make_fallback = fallback
        self._fallback: SchemaRegistry | None = None

    def get_schema(self, schema_id: int) -> dict[str, Any]:
        if schema_id in self._parsed:
            return self._parsed[schema_id]
        text = self._text.get(schema_id)
        if text is not None:
            try:
                parsed = json.loads(text)
            except ValueError:
                raise SchemaRegistryError(
                    f"schema id {schema_id}: the registry returned a schema that is not JSON") from None
            self._parsed[schema_id] = parsed
            return parsed
        if self._make_fallback is None:
            raise SchemaRegistryError(f"schema id {schema_id} is not in the registry")
        if self._fallback is None:
            self._fallback = self._make_fallback()
        return self._fallback.get_schema(schema_id)

    def register(self, subject: str, schema: dict[str, Any]) -> int:
        raise NotImplementedError("a worker's prefetched registry is read-only")


def _register_url_credentials(url: str) -> None:
    """Credentials inside a URL are masked wherever the URL might be echoed."""
    parts = urlsplit(url)
    if parts.password:
        secrets.register(f"{parts.username}:{parts.password}")
