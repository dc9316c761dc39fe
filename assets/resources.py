"""The ingestion engine as the Dagster definitions see it: one interface, two implementations.

:class:`IngestPipeline` reads a table's state straight from the topic log and the Delta log (no
Spark needed, so sensors and checks stay cheap). How a table is drained is up to the
implementation: :class:`SparkIngestPipeline` runs the real Spark Structured Streaming engine in the
run's process; :class:`StubIngestPipeline` returns prepared results, for tests of the asset's
metadata and checks without Spark.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from dataclasses import Field as Field_
from types import SimpleNamespace
from typing import Any

import dagster as dg
from pydantic import Field

from ingest.config import IngestConfig, TableSpec, load_config
from ingest.lake.layout import TablePaths
from ingest.ops.status import TableStatus, table_status
from ingest.records.audit import AuditRecord
from ingest.source.discovery import with_discovered
from ingest.stream.report import TableRun
from ingest.stream.runner import Runner


class IngestPipeline(dg.ConfigurableResource):
    """Interface: drain a table's available changes and read its state.

    Reads (:meth:`config`, :meth:`status`, :meth:`paths`) are shared; :meth:`drain` is what an
    implementation provides.
    """

    config_path: str = Field(description="Path of the ingestion configuration file (YAML).")
    workdir: str | None = Field(
        default=None,
        description="Overrides the configuration's workdir (where topics, schemas and tables live); "
        "default: the file's own workdir.",
    )

    def config(self) -> IngestConfig:
        """The validated configuration (raises ``ConfigError`` naming the field)."""
        return with_discovered(load_config(self.config_path, workdir=self.workdir), strict=False)

    def spec(self, table: str) -> TableSpec:
        return self.config().table(table)

    def paths(self, table: str) -> TablePaths:
        return TablePaths.of(self.config(), table)

    def status(self, table: str) -> TableStatus:
        """Applied and end offsets, lag, Delta version, live rows and last batch of one table."""
        config = self.config()
        only = config.model_copy(update={"tables": (config.table(table),)})
        return table_status(only)[0]

    def statuses(self, tables: list[str]) -> dict[str, TableStatus]:
        """:meth:`status` of several tables, with one configuration load and one source connection."""
        config = self.config()
        wanted = set(tables)  # a table whose topic is gone (discovered tables) is left out
        only = config.model_copy(update={"tables": tuple(t for t in config.tables if t.name in wanted)})
        return {s.table: s for s in table_status(only)}

    def drain(self, table: str) -> TableRun:
        """Apply every change available now for ``table`` and return what the run did."""
        raise NotImplementedError(f"{type(self).__name__} does not drain tables")


class SparkIngestPipeline(IngestPipeline):
    """The real engine: Spark Structured Streaming with ``availableNow``, in the run's process.

    One SparkSession per process (``ingest.spark.session.get_spark``); under ``dagster dev``'s multiprocess
    executor every step is a process of its own, so each drained table starts one.
    """

    def drain(self, table: str) -> TableRun:
        report = Runner(self.config()).run(tables=[table], mode="available_now")
        return report.tables[table]


class StubIngestPipeline(IngestPipeline):
    """A stand-in for tests: ``drain`` returns prepared results and ingests nothing.

    Reads still come from the configured workdir, so a test controls both what a run reports and
    what the tables hold.
    """

    runs_json: str = Field(
        default="{}",
        description='JSON {table: {"batches": [audit record fields...], "error": str | null}} that drain returns.',
    )

    def drain(self, table: str) -> TableRun:
        prepared = json.loads(self.runs_json).get(table, {})
        run = TableRun(table, error=prepared.get("error"))
        run.batches.extend(_record(table, b) for b in prepared.get("batches", []))  # type: ignore[misc]
        return run


def _record(table: str, values: dict[str, Any]) -> Any:
    """An audit record with the given fields, also fields this engine version does not know yet."""
    base: dict[str, Any] = {f.name: _default(f) for f in fields(AuditRecord)}
    base.update(table=table, run_id="stub", batch_id=0)
    base.update(values)
    record = SimpleNamespace(**base)
    record.applied = record.inserted + record.updated + record.deleted + record.truncates
    record.balanced = record.received == (record.applied + record.superseded + record.stale + record.quarantined
                                          + record.skipped)
    return record


def _default(f: Field_) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None
