"""What a source holds, asked without Spark: its topics and where each partition starts and ends.

The engine, ``ingest status``, discovery and a run's caught-up check ask these questions before (or
instead of) starting Spark, so they live apart from the streams (:mod:`ingest.source`): the embedded
log answers from its files, Kafka through the admin client (:class:`ingest.source.kafka_admin.KafkaAdmin`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ingest.config import IngestConfig
from ingest.source.kafka_admin import KafkaAdmin
from ingest.source.topiclog import TopicLog


class Catalog(Protocol):
    """The questions every source answers about its topics."""

    def describe(self) -> str:
        """Where it is, for messages (no credentials)."""
        ...

    def topics(self) -> list[str]:
        """Every topic there is now, sorted (Kafka's internal ``__`` topics left out).

        Raises:
            SourceUnavailableError: the source cannot answer.
        """
        ...

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset per partition of ``topic``; ``{}`` when the topic does not exist yet.

        Raises:
            SourceUnavailableError: the source cannot answer.
        """
        ...

    def start_offsets(self, topic: str) -> dict[int, int]:
        """First offset still held per partition of ``topic`` (after retention); ``{}`` when it does not exist.

        Raises:
            SourceUnavailableError: the source cannot answer.
        """
        ...

    def newest_timestamp(self, topic: str) -> float | None:
        """When the newest record of ``topic`` was written (seconds since the epoch); ``None`` when the
        topic does not exist or holds none.

        Raises:
            SourceUnavailableError: the source cannot answer.
        """
        ...


class EmbeddedCatalog:
    """The embedded topic log under ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)

    def describe(self) -> str:
        return f"embedded topic log {self.log_dir}"

    def topics(self) -> list[str]:
        return TopicLog(self.log_dir).topics()

    def end_offsets(self, topic: str) -> dict[int, int]:
        log = TopicLog(self.log_dir)
        return log.end_offsets(topic) if log.exists(topic) else {}

    def start_offsets(self, topic: str) -> dict[int, int]:
        return dict.fromkeys(self.end_offsets(topic), 0)  # the embedded log keeps every record

    def newest_timestamp(self, topic: str) -> float | None:
        return None  # no connector writes here: nothing to watch


def heartbeat_topics(config: IngestConfig) -> list[str]:
    """The heartbeat topics of the connectors that write the configured tables' topics
    (``source.kafka.heartbeat_topic``), one per topic prefix; none for the embedded log."""
    spec = config.source.kafka
    if config.source.kind != "kafka" or spec is None:
        return []
    return sorted({topic for table in config.tables if (topic := spec.heartbeat_topic_of(table.topic))})


def catalog_for(config: IngestConfig) -> Catalog:
    """The configured source's catalogue."""
    if config.source.kind == "kafka":
        assert config.source.kafka is not None  # validated with the configuration
        return KafkaAdmin(config.source.kafka, secrets_file=str(config.secrets_path) if config.secrets_path else None)
    return EmbeddedCatalog(config.log_dir)
