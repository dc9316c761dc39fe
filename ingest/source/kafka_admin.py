"""A Kafka cluster's admin API: its topics and their offsets, read with librdkafka (confluent-kafka).

Every client of the cluster -- the source's own, the engine's reader (:mod:`ingest.source.kafkalog`),
Spark's Kafka source -- gets the same connection settings: ``source.kafka.bootstrap_servers``, the
``kafka.*`` options of the configuration (librdkafka takes those it shares with the Java client), and
the SASL JAAS config from the environment (``source.kafka.credentials_env``) or the secrets file.
librdkafka has no JAAS: the username and password are read out of it.
"""

from __future__ import annotations

import logging
import os
import re
import time
import weakref
from typing import Any, Final

from ingest import logs, secrets, tls
from ingest.config import KafkaSpec
from ingest.config.source import SHARED_KAFKA_OPTIONS
from ingest.errors import SourceUnavailableError

log = logging.getLogger(__name__)
_JAAS_FIELD: Final = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')
#: Seconds the admin client waits for the cluster before the source counts as unavailable.
ADMIN_TIMEOUT: Final = 15.0


def admin_config(spec: KafkaSpec, secrets_file: str | os.PathLike[str] | None) -> dict[str, Any]:
    """librdkafka settings equivalent to what Spark's Kafka source gets, with the SASL credentials and
    the TLS key's password from the environment or ``secrets_file``."""
    jaas = secrets.lookup(spec.credentials_env, secrets_file)
    conf: dict[str, Any] = {"bootstrap.servers": spec.bootstrap_servers, "logger": logging.getLogger(logs.LIBRDKAFKA)}
    if spec.tls is not None:
        conf.update(spec.tls.client_settings(secrets.lookup(spec.tls.key_password_env, secrets_file)))
    for key, value in spec.options.items():
        name = key.removeprefix("kafka.")
        if name in SHARED_KAFKA_OPTIONS:
            conf[name] = value
    # Credentials go only to a SASL connection: on a plaintext one librdkafka warns about every
    # sasl.* setting (a shell that exports them for another cluster is common).
    if jaas and str(conf.get("security.protocol", "")).upper().startswith("SASL"):
        fields = {name: re.sub(r"\\(.)", r"\1", value) for name, value in _JAAS_FIELD.findall(jaas)}
        if "username" in fields:
            conf["sasl.username"] = fields["username"]
        if "password" in fields:
            conf["sasl.password"] = fields["password"]
    return conf


class KafkaAdmin:
    """A Kafka cluster's topics and offsets, through its admin API."""

    def __init__(self, spec: KafkaSpec, *, secrets_file: str | None = None, timeout: float = ADMIN_TIMEOUT) -> None:
        self.spec = spec
        self.secrets_file = secrets_file
        self.timeout = timeout
        self._admin: Any = None
        self._client_error: str | None = None  # what librdkafka last reported (an auth failure says so only here)

    def describe(self) -> str:
        return f"Kafka at {self.spec.bootstrap_servers}"

    def _jaas(self) -> str | None:
        return secrets.lookup(self.spec.credentials_env, self.secrets_file)

    def _client(self) -> Any:
        """The admin client, made on first use.

        Raises:
            SourceUnavailableError: librdkafka refused the settings (for example SASL without credentials).
        """
        if self._admin is None:
            # librdkafka: only for a Kafka source (the CLI starts without it)
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient

            # The callback holds this object weakly: a client holding its owner through a bound method
            # is a cycle the collector never frees (librdkafka's handle is not one of its objects), so a
            # dropped KafkaAdmin kept its client's threads and sockets -- a new one every failed trigger
            # of a stream while the broker is away (the reader asks with a new client).
            conf: dict[str, Any] = {**admin_config(self.spec, self.secrets_file), "error_cb": _error_callback(self)}
            try:
                self._admin = AdminClient(conf)
            except KafkaException as exc:
                hint = (f": set the SASL credentials in {self.spec.credentials_env} (a JAAS config) or the secrets file"
                        if "sasl" in str(exc).lower() else "")
                raise SourceUnavailableError(secrets.redact(
                    f"{self.describe()}: the client cannot start ({_reason(exc)}){hint}")) from None
        return self._admin

    def _on_error(self, error: Any) -> None:
        # A refused SASL login surfaces in requests only as a transport failure; its cause comes here.
        # Served by poll(); a refused login is the most telling error, so a later generic one keeps it.
        if self._client_error is None or not self._client_error.startswith("_AUTHENTICATION"):
            self._client_error = secrets.redact(f"{error.name()}: {error.str()}")

    def _why(self, exc: Exception) -> str:
        if self._admin is not None:
            self._admin.poll(0)  # runs error_cb for what the client saw while the request failed
        reason = _reason(exc)
        if self._client_error and self._client_error not in reason:
            reason += f" ({self._client_error})"
        if tls.is_tls_failure(reason):
            return self._tls_reason() or reason
        return _plain(reason)

    def _tls_reason(self) -> str | None:
        """Why the TLS handshake with the first bootstrap server fails, as Python's ``ssl`` sees it."""
        address = self.spec.bootstrap_servers.split(",")[0].strip()
        password = secrets.lookup(self.spec.tls.key_password_env, self.secrets_file) if self.spec.tls else None
        why = tls.diagnose(address, self.spec.tls, password)
        if why is None:
            return None
        ca = self.spec.tls.ca_file if self.spec.tls is not None else None
        trusted = f"the CA in {ca}" if ca else "the system's CAs (source.kafka.tls.ca_file unset)"
        return f"TLS handshake with {address} failed: {why}; trusting {trusted}"

    def set_group_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> list[Any]:
        """Set consumer group ``group``'s next offsets of ``topic`` (partition -> offset) without waiting:
        the futures of Kafka's answers. The group must have no member (one that only the engine writes).

        Raises:
            SourceUnavailableError: librdkafka refused the settings.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])
        return list(self._client().alter_consumer_group_offsets([request], request_timeout=30).values())

    def topics(self) -> list[str]:
        """Every topic of the cluster, sorted, without the internal ones (``__consumer_offsets`` ...).

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import KafkaException

        try:
            metadata = self._metadata()
        except KafkaException as exc:
            raise SourceUnavailableError(secrets.redact(
                f"{self.describe()} did not list its topics: {self._why(exc)}"), refused=self._refused()) from None
        return sorted(t for t in metadata.topics if not t.startswith("__"))

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` unless the cluster has it.

        Raises:
            SourceUnavailableError: the cluster did not answer, refused the credentials or the topic.
        """
        if topic in self.topics():
            return
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        try:
            self._client().create_topics([NewTopic(topic, partitions)], request_timeout=self.timeout)[topic].result()
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                return  # another client created it meanwhile
            raise SourceUnavailableError(secrets.redact(
                f"{self.describe()} did not create topic {topic!r}: {self._why(exc)}"),
                refused=self._refused()) from None

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset of every partition of ``topic`` (``{}`` if the topic does not exist yet).

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka.admin import OffsetSpec

        return self._offsets(topic, OffsetSpec.latest())

    def start_offsets(self, topic: str) -> dict[int, int]:
        """First offset the cluster still holds of every partition of ``topic`` (``{}`` if it does not exist).

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka.admin import OffsetSpec

        return self._offsets(topic, OffsetSpec.earliest())

    def newest_timestamp(self, topic: str) -> float | None:
        """When the newest record of ``topic`` was written, by its Kafka timestamp (seconds since the
        epoch); ``None`` when the topic does not exist or holds none.

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka.admin import OffsetSpec

        found = [i.timestamp for i in self._listed(topic, OffsetSpec.max_timestamp()).values()
                 if i.offset >= 0 and i.timestamp >= 0]
        return max(found) / 1000 if found else None

    def _metadata(self, topic: str | None = None) -> Any:
        """The cluster's metadata; a refused login fails at once rather than after the whole timeout.

        librdkafka reports a refused SASL login to ``error_cb`` only, while the request itself waits
        out its timeout: ask in one-second steps and stop as soon as the login was refused.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import KafkaException

        admin, deadline = self._client(), time.monotonic() + self.timeout
        while True:
            step = max(0.1, min(1.0, deadline - time.monotonic()))
            try:
                return admin.list_topics(topic, timeout=step)
            except KafkaException:
                admin.poll(0)
                if self._refused() or time.monotonic() >= deadline:
                    raise

    def _refused(self) -> bool:
        """Whether the cluster refused the login or the TLS handshake (as ``error_cb`` heard it)."""
        error = self._client_error or ""
        return error.startswith("_AUTHENTICATION") or tls.is_tls_failure(error)

    def _offsets(self, topic: str, which: Any) -> dict[int, int]:
        return {partition: info.offset for partition, info in self._listed(topic, which).items()}

    def _listed(self, topic: str, which: Any) -> dict[int, Any]:
        """Each partition's ``ListOffsetsResultInfo`` (offset, timestamp) for the ``OffsetSpec`` ``which``."""
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        admin = self._client()
        try:
            metadata = self._metadata(topic)
            info = metadata.topics.get(topic)
            if info is None or (info.error is not None and info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                return {}
            if info.error is not None:
                raise KafkaException(info.error)
            wanted = {TopicPartition(topic, p): which for p in info.partitions}
            futures = admin.list_offsets(wanted, request_timeout=self.timeout, isolation_level=self._isolation())
            return {tp.partition: future.result() for tp, future in futures.items()}
        except KafkaException as exc:
            raise SourceUnavailableError(secrets.redact(
                f"{self.describe()} did not answer for topic {topic!r}: {self._why(exc)}"),
                refused=self._refused()) from None

    def _isolation(self) -> Any:
        """The consumers' isolation level: a read_committed stream ends at the last stable offset."""
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import IsolationLevel

        committed = self.spec.options.get("kafka.isolation.level") == "read_committed"
        return IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED


def _error_callback(owner: KafkaAdmin) -> Any:
    """``error_cb`` for ``owner``'s client, without a reference to ``owner`` (see :meth:`KafkaAdmin._client`)."""
    held = weakref.ref(owner)

    def on_error(error: Any) -> None:
        if (alive := held()) is not None:
            alive._on_error(error)

    return on_error


#: What librdkafka says when no connection could be made, after a request's generic "_TRANSPORT: Failed
#: to get metadata": the address and the system's own words, without its codes and connection states.
_NO_CONNECTION: Final = (
    (re.compile(r"Connect to (?:ipv[46]#)?(?P<at>\S+) failed: (?P<why>.+?) \(after "), "{at}: {why}"),
    (re.compile(r"Failed to resolve '(?P<at>[^']+)': (?P<why>.+?) \(after "),
     "{at}: the name does not resolve ({why})"),
)


def _plain(reason: str) -> str:
    """``reason`` as a person reads it when the cause is that nothing answered at an address; else as it is."""
    if "Broker transport failure" in reason or reason.startswith("_TRANSPORT"):
        for pattern, say in _NO_CONNECTION:
            if found := pattern.search(reason):
                return say.format(**found.groupdict())
    return reason


def _reason(exc: Exception) -> str:
    error: Any = exc.args[0] if exc.args else None
    if hasattr(error, "str") and hasattr(error, "name"):
        return f"{error.name()}: {error.str()}"
    return str(exc)
