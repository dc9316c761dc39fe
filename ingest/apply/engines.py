"""Which apply engine commits a table's batches: ``target.engine``, or the table's own ``engine``."""

from __future__ import annotations

import threading

from ingest.apply.commit import ApplyEngine
from ingest.apply.delta_rs import DeltaRsEngine
from ingest.config import EngineName, IngestConfig, TableSpec


class Engines:
    """The engines of one configuration, each built when a table first needs it (delta-spark needs Spark)."""

    def __init__(self, config: IngestConfig) -> None:
        self.config = config
        self._built: dict[EngineName, ApplyEngine] = {}
        self._lock = threading.Lock()

    def for_table(self, spec: TableSpec) -> ApplyEngine:
        name = self.config.engine_of(spec)
        with self._lock:  # tables are applied from several threads
            if name not in self._built:
                self._built[name] = build(name, self.config)
            return self._built[name]


def build(name: EngineName, config: IngestConfig) -> ApplyEngine:
    """A new engine of kind ``name`` with the configuration's target settings."""
    size = config.target.target_file_size_mb * 1024 * 1024
    if name == "delta-rs":
        return DeltaRsEngine(target_file_size=size, change_data_feed=config.target.change_data_feed)
    from ingest.apply.delta_spark import DeltaSparkEngine
    from ingest.spark import session_for

    return DeltaSparkEngine(session_for(config), deletion_vectors=config.target.deletion_vectors,
                            change_data_feed=config.target.change_data_feed,
                            driver_lookup_rows=config.target.driver_lookup_rows)
