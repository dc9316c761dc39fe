"""A Kafka cluster as a source: partitions and end offsets from its admin API, and a stream.

The admin API is :mod:`ingest.source.kafka_admin`'s. The stream is read, as ``source.kafka.reader``
says, by the engine's own reader (``python``: librdkafka in the Python workers, decoding as it
reads; :mod:`ingest.source.reader` over :mod:`ingest.source.kafkalog`) or by Spark's Java Kafka
source (``spark``), whose jars the engine puts on the classpath (:mod:`ingest.spark.jars`), with the
same connection settings.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession

from ingest import secrets
from ingest.source.kafka_admin import KafkaAdmin
from ingest.source.kafkalog import KafkaLog
from ingest.source.reader import fetch_messages, open_stream, read_ranges

#: Options Spark's Kafka source gets unless the configuration sets them. With the consumer's default
#: ``fetch.max.wait.ms`` (500 ms), each task of a micro-batch that read up to the end of its
#: partitions -- as every batch of a stream that keeps up does -- spent about 0.6 s waiting, with
#: 12-77 ms of CPU (``benchmarks/bench_compare.py --source kafka``: the last batch 3.2 s, 0.9 s with
#: a short wait). Spark polls only while a task reads, so a short wait adds no idle requests.
SPARK_DEFAULTS: Final = {"kafka.fetch.max.wait.ms": "50"}


class KafkaSource(KafkaAdmin):
    """A Kafka cluster as a source: its admin API, and its topics read as a stream or by range."""

    _reader: KafkaLog | None = None  # what read_arrow reads with, once it has

    def _options(self, reader: Any) -> Any:
        # includeHeaders: a primary-key update's new row names its old key in a header.
        reader = (reader.format("kafka").option("kafka.bootstrap.servers", self.spec.bootstrap_servers)
                  .option("failOnDataLoss", "true").option("includeHeaders", "true"))
        for key, value in {**SPARK_DEFAULTS, **self.spec.options}.items():
            reader = reader.option(key, value)
        jaas = self._jaas()
        if jaas:
            # Spark redacts option values that mention a password in its plans and logs.
            reader = reader.option("kafka.sasl.jaas.config", jaas)
        if self.spec.tls is not None:
            # the key's password is redacted as the JAAS config is: Spark hides options named like a password
            password = secrets.lookup(self.spec.tls.key_password_env, self.secrets_file)
            for key, value in self.spec.tls.java_options(password).items():
                reader = reader.option(key, value)
        return reader

    def stream(self, spark: SparkSession, topics: list[str], starting: str, max_records: int,
               decoder: Any = None, *, max_per_topic: int | None = None) -> DataFrame:
        if self.spec.reader == "python":
            location = {"kafka": self.spec.model_dump_json(), "secretsFile": self.secrets_file or ""}
            return open_stream(spark, location, topics, starting, max_records, decoder, max_per_topic=max_per_topic)
        # Spark's Kafka source bounds only the whole micro-batch (the configuration refuses a per-table bound).
        assert max_per_topic is None
        # minPartitions: a topic of one partition is still decoded by every core.
        return (self._options(spark.readStream).option("subscribe", ",".join(topics))
                .option("startingOffsets", starting).option("maxOffsetsPerTrigger", str(max_records))
                .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())

    def read_arrow(self, topic: str, start: dict[int, int], end: dict[int, int]) -> Any:
        """:meth:`read_range` as an Arrow table, read with librdkafka, without Spark, by one consumer
        kept for the source's reads until :meth:`close` (a driver reads a range every micro-batch)."""
        if self._reader is None:
            self._reader = KafkaLog(self.spec, self.secrets_file, keep_open=True)
        return read_ranges(self._reader, topic, start, end)

    def close(self) -> None:
        """Close the consumer :meth:`read_arrow` keeps, if it opened one."""
        if self._reader is not None:
            self._reader.close()

    def fetch(self, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
        """Raw key, value and timestamp of some messages, read again by their coordinates."""
        return fetch_messages(KafkaLog(self.spec, self.secrets_file), coords)

    def read_range(self, spark: SparkSession, topic: str, start: dict[int, int], end: dict[int, int]) -> DataFrame:
        def offsets(by_partition: dict[int, int]) -> str:
            return json.dumps({topic: {str(p): o for p, o in sorted(by_partition.items())}})

        return (self._options(spark.read).option("assign", json.dumps({topic: sorted(start)}))
                .option("startingOffsets", offsets(start)).option("endingOffsets", offsets(end))
                .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())
