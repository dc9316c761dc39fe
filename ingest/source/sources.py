"""The configured source of records -- the embedded topic log or Kafka -- behind one :class:`Source`.

A source answers the questions the engine, ``ingest status``, the Dagster checks and sensors ask --
which partitions a topic has and where each ends -- and gives Spark a stream whose rows have
exactly the schema of Spark's Kafka source (key, value, topic, partition, offset, timestamp,
timestampType, headers), so everything downstream of the read is identical for both.

A source that cannot answer raises :class:`ingest.errors.SourceUnavailableError`: a lag is then
unknown, never zero.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession

from ingest.config import IngestConfig
from ingest.source.catalog import Catalog
from ingest.source.embedded import EmbeddedSource
from ingest.source.kafka import KafkaSource
from ingest.source.reader import EARLIEST, FORMAT_NAME, KAFKA_SCHEMA_DDL, LATEST, TopicLogDataSource

__all__ = ["EARLIEST", "FORMAT_NAME", "KAFKA_SCHEMA_DDL", "LATEST", "DecodingSource", "EmbeddedSource", "KafkaSource",
           "Offsets", "Source", "TopicLogDataSource", "decodes_at_read", "read_topics", "source_for"]

Offsets = dict[str, dict[str, int]]  # {topic: {"partition": next offset}} as in Kafka's JSON


class Source(Catalog, Protocol):
    """What the engine needs from a source of topics: its catalogue (:mod:`ingest.source.catalog`), and
    its records as Spark reads them."""

    def stream(self, spark: SparkSession, topics: list[str], starting: str, max_records: int,
               decoder: Any = None, *, max_per_topic: int | None = None) -> DataFrame:
        """A streaming DataFrame of ``topics`` in Spark's Kafka row shape; given a decoder, of its parts
        (only where :func:`decodes_at_read`). ``max_records`` bounds a micro-batch; ``max_per_topic``
        each topic's share of it (only the engine's own reader)."""
        ...

    def read_range(self, spark: SparkSession, topic: str, start: dict[int, int], end: dict[int, int]) -> DataFrame:
        """The records ``start[p] <= offset < end[p]`` of ``topic``'s partitions, as a batch DataFrame in
        Spark's Kafka row shape (a table catching up after it stopped reads its gap with it)."""
        ...


class DecodingSource(Source, Protocol):
    """A source read by the engine's own reader, which decodes as it reads (see :func:`decodes_at_read`)."""

    def read_arrow(self, topic: str, start: dict[int, int], end: dict[int, int]) -> Any:
        """:meth:`read_range` as an Arrow table, without Spark (to decode on the driver)."""
        ...

    def fetch(self, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
        """Raw key, value and timestamp of some messages, by their coordinates (for quarantine)."""
        ...

    def close(self) -> None:
        """Let go of what :meth:`read_arrow` keeps open between reads (a later read opens it again)."""
        ...


def decodes_at_read(config: IngestConfig) -> bool:
    """Whether the source decodes as it reads: Kafka with ``reader: python``, or the embedded log with
    its own registry.

    Then the stream's rows are the decode step's parts, and raw messages are fetched from the source
    by their coordinates. The embedded log with a registry served over HTTP is decoded by
    ``mapInArrow``: the driver hands the executors that registry's schemas batch by batch. The
    Kafka reader gets them once, in the decoder its stream starts with; a schema registered later
    its workers fetch themselves, once per worker process.
    """
    if config.source.kind == "kafka":
        return config.source.kafka is not None and config.source.kafka.reader == "python"
    return config.source.registry.kind == "embedded"


def source_for(config: IngestConfig) -> Source:
    """The configured source."""
    if config.source.kind == "kafka":
        assert config.source.kafka is not None  # validated with the configuration
        secrets_file = str(config.secrets_path) if config.secrets_path else None
        return KafkaSource(config.source.kafka, secrets_file=secrets_file)
    return EmbeddedSource(config.log_dir)


def read_topics(spark: SparkSession, config: IngestConfig, topics: list[str], *,
                starting_offsets: Offsets | None, decoder: object = None) -> DataFrame:
    """A streaming DataFrame of ``topics`` from the configured source.

    Args:
        spark: the session.
        config: source settings (embedded log or Kafka).
        topics: topics to subscribe to.
        starting_offsets: next offset per partition to read when the query has no checkpoint;
            ``None`` reads from the earliest offset. Ignored by Spark once a checkpoint exists.
        decoder: a :class:`~ingest.decode.columnar.BatchDecoder`, for a source that
            :func:`decodes_at_read`: the stream's rows are then its parts.
    """
    starting = json.dumps(starting_offsets) if starting_offsets else "earliest"
    assert decoder is None or decodes_at_read(config)
    return source_for(config).stream(spark, topics, starting, config.source.max_records_per_batch, decoder=decoder,
                                     max_per_topic=config.source.max_records_per_table)
