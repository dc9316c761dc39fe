"""The embedded topic log as a source: its partitions and end offsets, and a Spark stream over it.

The stream is the engine's own reader (:mod:`ingest.source.reader`) over the log's files, which
decodes as it reads.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ingest.source.catalog import EmbeddedCatalog
from ingest.source.reader import fetch_messages, open_stream, read_ranges
from ingest.source.topiclog import TopicLog


class EmbeddedSource(EmbeddedCatalog):
    """The embedded topic log under ``log_dir``: its catalogue, and its records read by Spark or as Arrow."""

    def read_arrow(self, topic: str, start: dict[int, int], end: dict[int, int]) -> Any:
        """:meth:`read_range` as an Arrow table, without Spark."""

        return read_ranges(TopicLog(self.log_dir), topic, start, end)

    def close(self) -> None:
        """Nothing is kept open between reads of the log."""

    def read_range(self, spark: SparkSession, topic: str, start: dict[int, int], end: dict[int, int]) -> DataFrame:
        return spark.createDataFrame(self.read_arrow(topic, start, end))

    def stream(self, spark: SparkSession, topics: list[str], starting: str, max_records: int,
               decoder: Any = None, *, max_per_topic: int | None = None) -> DataFrame:
        return open_stream(spark, {"path": str(self.log_dir)}, topics, starting, max_records, decoder,
                           max_per_topic=max_per_topic)

    def fetch(self, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
        """Raw key, value and timestamp of some messages, read again from the log by their coordinates."""

        return fetch_messages(TopicLog(self.log_dir), coords)
