"""What a source holds, asked without Spark: its topics and where each partition starts and ends.

The engine, ``ingest status``, discovery and a run's caught-up check ask these questions before (or
instead of) starting Spark, so they live apart from the streams (:mod:`ingest.source`): the embedded
log answers from its files, Kafka through the admin client (:class:`ingest.source.kafka_admin.KafkaAdmin`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ingest.config import IngestConfig
from ingest.errors import SourceUnavailableError
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


def heartbeat_of(config: IngestConfig) -> Callable[[str], str | None] | None:
    """The heartbeat topic of the connector that writes a table topic (``source.kafka.heartbeat_topic``);
    ``None`` for the embedded log, which no connector writes."""
    spec = config.source.kafka
    return spec.heartbeat_topic_of if config.source.kind == "kafka" and spec is not None else None


def heartbeat_topics(config: IngestConfig) -> list[str]:
    """The heartbeat topics of the connectors that write the configured tables' topics, one per topic
    prefix; none for the embedded log."""
    of = heartbeat_of(config)
    return [] if of is None else sorted({topic for table in config.tables if (topic := of(table.topic))})


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A connector's heartbeat topic and when its newest record was written (``None``: it has none)."""

    topic: str
    written: float | None
    error: str | None = None  # why the source did not say (a topic the engine may not read)


def newest_heartbeats(catalog: Catalog, topics: Iterable[str]) -> list[Heartbeat]:
    """Each heartbeat topic's newest record, asked on its own: a topic the source does not answer for
    (one the engine may not read) says why and costs no other topic its answer."""
    out = []
    for topic in topics:
        try:
            out.append(Heartbeat(topic, catalog.newest_timestamp(topic)))
        except SourceUnavailableError as exc:
            out.append(Heartbeat(topic, None, str(exc)))
    return out


def catalog_for(config: IngestConfig) -> Catalog:
    """The configured source's catalogue."""
    if config.source.kind == "kafka":
        assert config.source.kafka is not None  # validated with the configuration
        return KafkaAdmin(config.source.kafka, secrets_file=str(config.secrets_path) if config.secrets_path else None)
    return EmbeddedCatalog(config.log_dir)
