"""Who writes a table's Delta commits: ``target.writer``, or the table's own ``writer``."""

from __future__ import annotations

import threading

from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.writer import Writer
from ingest.config import IngestConfig, TableSpec, WriterName


class Writers:
    """The writers of one configuration, each built when a table first needs it (delta-spark needs Spark)."""

    def __init__(self, config: IngestConfig) -> None:
        self.config = config
        self._built: dict[WriterName, Writer] = {}
        self._lock = threading.Lock()

    def for_table(self, spec: TableSpec) -> Writer:
        name = self.config.writer_of(spec)
        with self._lock:  # tables are applied from several threads
            if name not in self._built:
                self._built[name] = build(name, self.config)
            return self._built[name]

    def settle(self) -> None:
        """Return once the writers built so far have finished what they do after their commits."""
        with self._lock:
            built = list(self._built.values())
        for writer in built:
            writer.settle()


def build(name: WriterName, config: IngestConfig) -> Writer:
    """A new writer of kind ``name`` with the configuration's target settings."""
    size = config.target.target_file_size_mb * 1024 * 1024
    if name == "delta-rs":
        return DeltaRsWriter(target_file_size=size, change_data_feed=config.target.change_data_feed)
    # Spark: started only when a table is written by delta-spark
    from ingest.commit.delta_spark import DeltaSparkWriter
    from ingest.spark.session import session_for

    return DeltaSparkWriter(session_for(config), deletion_vectors=config.target.deletion_vectors,
                            change_data_feed=config.target.change_data_feed,
                            driver_lookup_rows=config.target.driver_lookup_rows)
