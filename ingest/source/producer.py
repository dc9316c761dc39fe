"""Records written into a source's topic: the embedded topic log, or a Kafka cluster (``ingest produce``).

A record names its partition or leaves it to the key: the embedded log hashes the key itself
(:func:`~ingest.source.topiclog.partition_for_key`); Kafka's librdkafka is told to hash as Kafka's
Java clients do (``murmur2_random``), so a record lands where Debezium's connector would have put
the same key. A missing Kafka topic is created with the partitions asked for, as the embedded log
creates one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingest import secrets
from ingest.config import IngestConfig
from ingest.errors import SourceUnavailableError
from ingest.source.kafka_admin import ADMIN_TIMEOUT, KafkaAdmin, admin_config
from ingest.source.topiclog import ProducerRecord, TopicLog, partition_for_key

#: ``(partition) -> (first offset, next offset)`` of what one call wrote.
Written = dict[int, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A record to write; ``partition`` ``None``: the key's (a record without a key: spread round-robin)."""

    partition: int | None
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


def produce(config: IngestConfig, topic: str, records: list[Outgoing], *, partitions: int) -> Written:
    """Append ``records`` to ``topic`` of the configuration's source, created with ``partitions`` if missing.

    Raises:
        SourceUnavailableError: Kafka did not take the records (the broker, the credentials, the topic).
    """
    if config.source.kind != "kafka":
        log = TopicLog(config.log_dir)
        if not log.exists(topic):
            log.create_topic(topic, partitions)
        count = log.partitions(topic)
        placed = [ProducerRecord(_partition(r, count, n), r.key, r.value, r.timestamp_ms, r.headers)
                  for n, r in enumerate(records)]
        return log.append(topic, placed)
    return _to_kafka(config, topic, records, partitions)


def _partition(record: Outgoing, count: int, n: int) -> int:
    if record.partition is not None:
        return record.partition
    return partition_for_key(record.key, count) if record.key is not None else n % count


def _to_kafka(config: IngestConfig, topic: str, records: list[Outgoing], partitions: int) -> Written:
    # librdkafka: only for a Kafka source (the CLI starts without it)
    from confluent_kafka import KafkaException, Producer

    spec = config.source.kafka
    assert spec is not None
    admin = KafkaAdmin(spec, secrets_file=str(config.secrets_path) if config.secrets_path else None)
    admin.create_topic(topic, partitions)
    where = admin.describe()
    try:
        conf = admin_config(spec, config.secrets_path)
        producer = Producer({**conf, "partitioner": "murmur2_random", "enable.idempotence": True})
    except KafkaException as exc:
        raise SourceUnavailableError(secrets.redact(f"{where}: cannot write to topic {topic!r}: {exc}")) from None
    written: Written = {}
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
            return
        first, nxt = written.get(message.partition(), (message.offset(), message.offset() + 1))
        written[message.partition()] = (min(first, message.offset()), max(nxt, message.offset() + 1))

    for record in records:
        extra: dict[str, Any] = {} if record.partition is None else {"partition": record.partition}
        producer.produce(topic, key=record.key, value=record.value, timestamp=record.timestamp_ms,
                         headers=list(record.headers) or None, on_delivery=delivered, **extra)
        producer.poll(0)
    left = producer.flush(ADMIN_TIMEOUT * 2)
    if failures or left:
        why = failures[0] if failures else f"{left} records not acknowledged in time"
        raise SourceUnavailableError(secrets.redact(f"{where}: topic {topic!r} did not take every record: {why}"))
    return written
