"""The streaming loop: one Spark Structured Streaming query per table, each micro-batch one commit.

One query per table keeps a failing table from holding the others back (its query stops; theirs
go on) and lets each table resume from its own Delta log. A query starts from the offsets its
table's Delta log records (``startingOffsets``), so a lost Spark checkpoint means neither
duplicates nor gaps nor a full re-read; with a checkpoint, anything Spark replays that the table
already has is recognised by the table's app transactions and skipped.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from ingest import audit
from ingest.audit import AuditRecord
from ingest.batch import DECODED_DDL, BatchResult, DecodeStep, TablePaths, process_batch
from ingest.config import IngestConfig, TableSpec
from ingest.errors import IngestError
from ingest.source import Offsets, read_topics
from ingest.spark import session_for
from ingest.tablestate import load_state
from ingest.topiclog import TopicLog

log = logging.getLogger(__name__)
Mode = Literal["available_now", "continuous"]


@dataclass(slots=True)
class TableRun:
    """What one table did during a run."""

    table: str
    batches: list[AuditRecord] = field(default_factory=list)
    already_applied: int = 0
    error: str | None = None

    def total(self, attr: str) -> int:
        return sum(getattr(b, attr) for b in self.batches)


@dataclass(slots=True)
class RunReport:
    run_id: str
    tables: dict[str, TableRun]
    seconds: float = 0.0

    @property
    def failed(self) -> list[str]:
        return [name for name, t in self.tables.items() if t.error]


ProgressFn = Callable[[str, AuditRecord | None, BatchResult], None]


class _BatchHandler:
    """``foreachBatch`` callback of one table's query."""

    def __init__(self, spec: TableSpec, paths: TablePaths, run: TableRun, run_id: str,
                 progress: ProgressFn | None) -> None:
        self.spec, self.paths, self.run, self.run_id, self.progress = spec, paths, run, run_id, progress
        self.error: BaseException | None = None

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        try:
            t0 = time.perf_counter()
            rows = frame.toArrow()
            decode_ms = int((time.perf_counter() - t0) * 1000)
            result = process_batch(self.spec, self.paths, rows, batch_id=batch_id, run_id=self.run_id,
                                   decode_ms=decode_ms)
        except BaseException as exc:
            # Keep the real exception: Spark only hands back a stringified copy. Re-raising stops
            # this table's query before its checkpoint records the batch.
            self.error = exc
            raise
        self.run.already_applied += result.already_applied
        if result.record is not None:
            self.run.batches.append(result.record)
        if self.progress is not None:
            self.progress(self.spec.name, result.record, result)


class Engine:
    """Ingest the configured tables with Spark."""

    def __init__(self, config: IngestConfig, *, spark: SparkSession | None = None) -> None:
        self.config = config
        self._spark = spark

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = session_for(self.config.spark)
        return self._spark

    def starting_offsets(self, spec: TableSpec) -> Offsets | None:
        """Next offset per partition as the table's Delta log records it (``None``: from the start)."""
        state = load_state(TablePaths.of(self.config, spec.name).table)
        if state.table is None:
            return None
        partitions = self._partitions(spec.topic)
        offsets = {}
        for p in range(partitions):
            done = state.applied_offset(spec.topic, p)
            offsets[str(p)] = -2 if done is None else done + 1
        return {spec.topic: offsets}

    def _partitions(self, topic: str) -> int:
        if self.config.source.kind == "embedded":
            log_ = TopicLog(self.config.log_dir)
            return log_.partitions(topic) if log_.exists(topic) else 0
        return _kafka_partitions(self.config, topic)

    def run(self, *, tables: list[str] | None = None, mode: Mode = "available_now",
            reset_checkpoints: bool = False, from_beginning: bool = False,
            progress: ProgressFn | None = None, stop_after: float | None = None) -> RunReport:
        """Run until every table is caught up (``available_now``) or until stopped (``continuous``).

        Args:
            tables: names to run (default: all configured tables).
            mode: ``available_now`` drains what is in the topics now; ``continuous`` keeps polling.
            reset_checkpoints: delete Spark checkpoints first (progress then comes from Delta).
            from_beginning: re-read every topic from offset 0 (a deliberate replay; already
                applied records are recognised and skipped).
            progress: called after every table batch.
            stop_after: continuous mode only: stop after this many seconds.
        """
        specs = [self.config.table(n) for n in tables] if tables else list(self.config.tables)
        run_id = uuid.uuid4().hex[:12]
        report = RunReport(run_id, {s.name: TableRun(s.name) for s in specs})
        started = time.perf_counter()
        spark = self.spark
        handlers: dict[str, _BatchHandler] = {}
        queries: dict[str, Any] = {}
        for spec in specs:
            paths = TablePaths.of(self.config, spec.name)
            restored = audit.reconcile(paths.audit, spec.name, paths.table)
            if restored:
                log.warning("table %s: restored %d audit rows from the Delta commit info", spec.name, restored)
            checkpoint = self.config.checkpoint_root / spec.name
            if reset_checkpoints or from_beginning:
                shutil.rmtree(checkpoint, ignore_errors=True)
            starting = None if from_beginning else self.starting_offsets(spec)
            try:
                stream = read_topics(spark, self.config, [spec.topic], starting_offsets=starting)
                decoded = stream.mapInArrow(self._decode_step(spec), DECODED_DDL)
                handler = _BatchHandler(spec, paths, report.tables[spec.name], run_id, progress)
                writer = (decoded.writeStream.foreachBatch(handler)
                          .option("checkpointLocation", str(checkpoint))
                          .queryName(f"cdc_{spec.name}_{run_id}"))
                writer = (writer.trigger(availableNow=True) if mode == "available_now"
                          else writer.trigger(processingTime="2 seconds"))
                queries[spec.name] = writer.start()
                handlers[spec.name] = handler
            except Exception as exc:
                report.tables[spec.name].error = f"could not start: {exc}"
        self._await(queries, handlers, report, mode, stop_after)
        report.seconds = time.perf_counter() - started
        return report

    def _await(self, queries: dict[str, Any], handlers: dict[str, _BatchHandler], report: RunReport,
               mode: Mode, stop_after: float | None) -> None:
        if mode == "continuous":
            deadline = time.monotonic() + stop_after if stop_after else None
            try:
                while any(q.isActive for q in queries.values()):
                    if deadline and time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
            except KeyboardInterrupt:
                log.warning("interrupted: stopping queries after their current batch")
            for q in queries.values():
                if q.isActive:
                    q.stop()
        for name, query in queries.items():
            try:
                query.awaitTermination()
            except Exception as exc:
                real = handlers[name].error
                report.tables[name].error = f"{type(real).__name__}: {real}" if real else _short(exc)

    def _decode_step(self, spec: TableSpec) -> DecodeStep:
        source = self.config.source
        return DecodeStep(
            value_format=source.value_format,
            registry_dir=str(self.config.registry_dir) if source.registry.kind == "embedded" else None,
            registry_url=source.registry.url if source.registry.kind == "confluent" else None,
            key_columns=spec.primary_key,
        )


def _kafka_partitions(config: IngestConfig, topic: str) -> int:
    """Partition count of a Kafka topic, from the cluster's metadata."""
    from confluent_kafka.admin import AdminClient

    assert config.source.kafka is not None
    admin = AdminClient({"bootstrap.servers": config.source.kafka.bootstrap_servers})
    metadata = admin.list_topics(topic, timeout=30)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        raise IngestError(f"Kafka topic {topic!r} is not available: {info.error if info else 'unknown topic'}")
    return len(info.partitions)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__


