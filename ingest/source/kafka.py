"""A Kafka cluster as a source: partitions and end offsets from its admin API, and a stream.

The admin client is confluent-kafka (librdkafka). The stream is read, as ``source.kafka.reader``
says, by the engine's own reader (``python``: librdkafka in the Python workers, decoding as it
reads; :mod:`ingest.source.reader` over :mod:`ingest.source.kafkalog`) or by Spark's Java Kafka
source (``spark``), whose jars the engine puts on the classpath (:mod:`ingest.spark.jars`). All get the
same connection settings: ``source.kafka.bootstrap_servers``, the ``kafka.*`` options of the
configuration (librdkafka takes those it shares with the Java client), and the SASL JAAS config
from the environment (``source.kafka.credentials_env``) or the secrets file. librdkafka has no
JAAS: the username and password are read out of it.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession

from ingest import secrets
from ingest.config import KafkaSpec
from ingest.config.source import SHARED_KAFKA_OPTIONS
from ingest.errors import SourceUnavailableError

log = logging.getLogger(__name__)
_JAAS_FIELD: Final = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')
#: Seconds the admin client waits for the cluster before the source counts as unavailable.
ADMIN_TIMEOUT: Final = 15.0
#: Options Spark's Kafka source gets unless the configuration sets them. With the consumer's default
#: ``fetch.max.wait.ms`` (500 ms), each task of a micro-batch that read up to the end of its
#: partitions -- as every batch of a stream that keeps up does -- spent about 0.6 s waiting, with
#: 12-77 ms of CPU (``benchmarks/bench_compare.py --source kafka``: the last batch 3.2 s, 0.9 s with
#: a short wait). Spark polls only while a task reads, so a short wait adds no idle requests.
SPARK_DEFAULTS: Final = {"kafka.fetch.max.wait.ms": "50"}


def admin_config(spec: KafkaSpec, jaas: str | None) -> dict[str, Any]:
    """librdkafka settings equivalent to what Spark's Kafka source gets."""
    conf: dict[str, Any] = {"bootstrap.servers": spec.bootstrap_servers, "logger": log}
    for key, value in spec.options.items():
        name = key.removeprefix("kafka.")
        if name in SHARED_KAFKA_OPTIONS:
            conf[name] = value
    if jaas:
        fields = {name: re.sub(r"\\(.)", r"\1", value) for name, value in _JAAS_FIELD.findall(jaas)}
        if "username" in fields:
            conf["sasl.username"] = fields["username"]
        if "password" in fields:
            conf["sasl.password"] = fields["password"]
    return conf


class KafkaSource:
    """A Kafka cluster."""

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
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            conf: dict[str, Any] = {**admin_config(self.spec, self._jaas()), "error_cb": self._on_error}
            self._admin = AdminClient(conf)
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
        return reason

    def topics(self) -> list[str]:
        """Every topic of the cluster, sorted, without the internal ones (``__consumer_offsets`` ...).

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        from confluent_kafka import KafkaException

        try:
            metadata = self._metadata()
        except KafkaException as exc:
            raise SourceUnavailableError(secrets.redact(
                f"{self.describe()} did not list its topics: {self._why(exc)}")) from None
        return sorted(t for t in metadata.topics if not t.startswith("__"))

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset of every partition of ``topic`` (``{}`` if the topic does not exist yet).

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        from confluent_kafka.admin import OffsetSpec

        return self._offsets(topic, OffsetSpec.latest())

    def start_offsets(self, topic: str) -> dict[int, int]:
        """First offset the cluster still holds of every partition of ``topic`` (``{}`` if it does not exist).

        Raises:
            SourceUnavailableError: the cluster did not answer, or refused the credentials.
        """
        from confluent_kafka.admin import OffsetSpec

        return self._offsets(topic, OffsetSpec.earliest())

    def _metadata(self, topic: str | None = None) -> Any:
        """The cluster's metadata; a refused login fails at once rather than after the whole timeout.

        librdkafka reports a refused SASL login to ``error_cb`` only, while the request itself waits
        out its timeout: ask in one-second steps and stop as soon as the login was refused.
        """
        from confluent_kafka import KafkaException

        admin, deadline = self._client(), time.monotonic() + self.timeout
        while True:
            step = max(0.1, min(1.0, deadline - time.monotonic()))
            try:
                return admin.list_topics(topic, timeout=step)
            except KafkaException:
                admin.poll(0)
                refused = (self._client_error or "").startswith("_AUTHENTICATION")
                if refused or time.monotonic() >= deadline:
                    raise

    def _offsets(self, topic: str, which: Any) -> dict[int, int]:
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
            return {tp.partition: future.result().offset for tp, future in futures.items()}
        except KafkaException as exc:
            raise SourceUnavailableError(secrets.redact(
                f"{self.describe()} did not answer for topic {topic!r}: {self._why(exc)}")) from None

    def _isolation(self) -> Any:
        """The consumers' isolation level: a read_committed stream ends at the last stable offset."""
        from confluent_kafka import IsolationLevel

        committed = self.spec.options.get("kafka.isolation.level") == "read_committed"
        return IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED

    def _options(self, reader: Any) -> Any:
        reader = (reader.format("kafka").option("kafka.bootstrap.servers", self.spec.bootstrap_servers)
                  .option("failOnDataLoss", "true"))
        for key, value in {**SPARK_DEFAULTS, **self.spec.options}.items():
            reader = reader.option(key, value)
        jaas = self._jaas()
        if jaas:
            # Spark redacts option values that mention a password in its plans and logs.
            reader = reader.option("kafka.sasl.jaas.config", jaas)
        return reader

    def stream(self, spark: SparkSession, topics: list[str], starting: str, max_records: int,
               decoder: Any = None, *, max_per_topic: int | None = None) -> DataFrame:
        if self.spec.reader == "python":
            from ingest.source.reader import open_stream

            location = {"kafka": self.spec.model_dump_json(), "secretsFile": self.secrets_file or ""}
            return open_stream(spark, location, topics, starting, max_records, decoder, max_per_topic=max_per_topic)
        # Spark's Kafka source bounds only the whole micro-batch (the configuration refuses a per-table bound).
        assert max_per_topic is None
        # minPartitions: a topic of one partition is still decoded by every core.
        return (self._options(spark.readStream).option("subscribe", ",".join(topics))
                .option("startingOffsets", starting).option("maxOffsetsPerTrigger", str(max_records))
                .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())

    def read_arrow(self, topic: str, start: dict[int, int], end: dict[int, int]) -> Any:
        """:meth:`read_range` as an Arrow table, read with librdkafka, without Spark."""
        from ingest.source.kafkalog import KafkaLog
        from ingest.source.reader import read_ranges

        return read_ranges(KafkaLog(self.spec, self.secrets_file), topic, start, end)

    def fetch(self, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
        """Raw key, value and timestamp of some messages, read again by their coordinates."""
        from ingest.source.kafkalog import KafkaLog
        from ingest.source.reader import fetch_messages

        return fetch_messages(KafkaLog(self.spec, self.secrets_file), coords)

    def read_range(self, spark: SparkSession, topic: str, start: dict[int, int], end: dict[int, int]) -> DataFrame:
        def offsets(by_partition: dict[int, int]) -> str:
            return json.dumps({topic: {str(p): o for p, o in sorted(by_partition.items())}})

        return (self._options(spark.read).option("assign", json.dumps({topic: sorted(start)}))
                .option("startingOffsets", offsets(start)).option("endingOffsets", offsets(end))
                .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())


def _reason(exc: Exception) -> str:
    error: Any = exc.args[0] if exc.args else None
    if hasattr(error, "str") and hasattr(error, "name"):
        return f"{error.name()}: {error.str()}"
    return str(exc)
