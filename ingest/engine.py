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
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from ingest import audit, locks, secrets
from ingest import checkpoint as checkpoints
from ingest.audit import AuditRecord
from ingest.batch import DECODED_DDL, BatchResult, DecodeStep, TablePaths, process_batch
from ingest.config import IngestConfig, TableSpec
from ingest.quality import QualityGate
from ingest.source import Offsets, read_topics, source_for
from ingest.spark import session_for
from ingest.tablestate import load_state

log = logging.getLogger(__name__)
_START_ATTEMPTS = 3  # restarts of a query that dies before its first batch (see Engine._restart_failed)
_SOURCE_INIT_WAIT = 30.0  # seconds to let one query's source start before starting the next
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
                 progress: ProgressFn | None, gate: QualityGate | None = None) -> None:
        self.spec, self.paths, self.run, self.run_id, self.progress = spec, paths, run, run_id, progress
        self.gate = gate
        self.error: BaseException | None = None

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        try:
            t0 = time.perf_counter()
            rows = frame.toArrow()
            decode_ms = int((time.perf_counter() - t0) * 1000)
            result = process_batch(self.spec, self.paths, rows, batch_id=batch_id, run_id=self.run_id,
                                   decode_ms=decode_ms, gate=self.gate)
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
        self._restarts: dict[str, int] = {}

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = session_for(self.config)
        return self._spark

    def starting_offsets(self, spec: TableSpec) -> Offsets | None:
        """Next offset per partition as the table's Delta log records it (``None``: from the start).

        Raises:
            SourceUnavailableError: the source cannot say which partitions the topic has.
        """
        state = load_state(TablePaths.of(self.config, spec.name).table)
        if state.table is None:
            return None
        offsets = {}
        for p in sorted(source_for(self.config).end_offsets(spec.topic)):
            done = state.applied_offset(spec.topic, p)
            offsets[str(p)] = -2 if done is None else done + 1
        return {spec.topic: offsets}

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

        Raises:
            SuiteError: a table's expectations suite cannot be loaded or does not fit the table.
            TableLockedError: another process is writing one of the tables.
        """
        specs = [self.config.table(n) for n in tables] if tables else list(self.config.tables)
        gates = self.quality_gates(specs)
        source = self.config.source
        secrets.prepare([source.registry.credentials_env, *([source.kafka.credentials_env] if source.kafka else [])],
                        self.config.secrets_path)
        # One writer per table: a second run on any of these tables fails here, before Spark starts.
        held = locks.acquire_all(self.config.tables_root, [s.name for s in specs])
        try:
            return self._run(specs, gates, mode=mode, reset_checkpoints=reset_checkpoints,
                             from_beginning=from_beginning, progress=progress, stop_after=stop_after)
        finally:
            locks.release_all(held)

    def _run(self, specs: list[TableSpec], gates: dict[str, QualityGate], *, mode: Mode, reset_checkpoints: bool,
             from_beginning: bool, progress: ProgressFn | None, stop_after: float | None) -> RunReport:
        run_id = uuid.uuid4().hex[:12]
        self._restarts = {}
        report = RunReport(run_id, {s.name: TableRun(s.name) for s in specs})
        started = time.perf_counter()
        _ = self.spark  # start Spark (about 5 s) before the per-table set-up
        handlers: dict[str, _BatchHandler] = {}
        queries: dict[str, Any] = {}
        restarts: dict[str, Callable[[], Any]] = {}
        for spec in specs:
            paths = TablePaths.of(self.config, spec.name)
            restored = audit.reconcile(paths.audit, spec.name, paths.table)
            if restored:
                log.warning("table %s: restored %d audit rows from the Delta commit info", spec.name, restored)
            checkpoint = self.config.checkpoint_root / spec.name
            if reset_checkpoints or from_beginning:
                shutil.rmtree(checkpoint, ignore_errors=True)
            self._check_checkpoint(spec, checkpoint)
            try:
                starting = None if from_beginning else self.starting_offsets(spec)
                handler = _BatchHandler(spec, paths, report.tables[spec.name], run_id, progress, gates.get(spec.name))
                queries[spec.name] = self._start(spec, handler, checkpoint, starting, mode, run_id)
                handlers[spec.name] = handler
                restarts[spec.name] = self._restart_without_checkpoint(spec, handler, checkpoint, starting, mode,
                                                                       run_id)
            except Exception as exc:
                report.tables[spec.name].error = secrets.redact(f"could not start: {exc}")
        self._await(queries, handlers, report, mode, stop_after, restarts)
        report.seconds = time.perf_counter() - started
        return report

    def quality_gates(self, specs: list[TableSpec]) -> dict[str, QualityGate]:
        """Load and check every table's suite now (start-up), before any query runs."""
        gates = {}
        for spec in specs:
            gate = QualityGate.for_table(self.config, spec)
            if gate is not None:
                gates[spec.name] = gate
        return gates

    def _start(self, spec: TableSpec, handler: _BatchHandler, directory: Path, starting: Offsets | None,
               mode: Mode, run_id: str) -> Any:
        """Start one table's query; a checkpoint Spark cannot start from is discarded and the start retried."""
        try:
            return self._start_query(spec, handler, directory, starting, mode, run_id)
        except Exception as exc:
            if not directory.exists():
                raise
            log.warning("table %s: Spark cannot start from checkpoint %s (%s); discarding it and resuming "
                        "from the offsets in the table's Delta log", spec.name, directory, secrets.describe(exc))
            checkpoints.discard(directory)
            return self._start_query(spec, handler, directory, starting, mode, run_id)

    def _start_query(self, spec: TableSpec, handler: _BatchHandler, directory: Path, starting: Offsets | None,
                     mode: Mode, run_id: str) -> Any:
        stream = read_topics(self.spark, self.config, [spec.topic], starting_offsets=starting)
        decoded = stream.mapInArrow(self._decode_step(spec), DECODED_DDL)
        writer = (decoded.writeStream.foreachBatch(handler)
                  .option("checkpointLocation", str(directory))
                  .queryName(f"cdc_{spec.name}_{run_id}"))
        writer = (writer.trigger(availableNow=True) if mode == "available_now"
                  else writer.trigger(processingTime="2 seconds"))
        query = writer.start()
        # Start the queries one after another: each spawns a Python source runner that must connect
        # back to the JVM within 10 s, which several at once on a busy machine can miss.
        deadline = time.monotonic() + _SOURCE_INIT_WAIT
        while query.isActive and query.status["message"] == "Initializing sources" and time.monotonic() < deadline:
            time.sleep(0.2)
        return query

    def _restart_without_checkpoint(self, spec: TableSpec, handler: _BatchHandler, directory: Path,
                                    starting: Offsets | None, mode: Mode, run_id: str) -> Callable[[], Any]:
        """What to do if the query dies before its first batch: an unusable checkpoint or a transient start failure.

        ``starting`` still holds: nothing was committed since it was read from the Delta log.
        """
        def restart() -> Any:
            checkpoints.discard(directory)
            return self._start_query(spec, handler, directory, starting, mode, run_id)
        return restart

    def _check_checkpoint(self, spec: TableSpec, directory: Path) -> None:
        """Discard a checkpoint that is damaged or claims more progress than the table has (ingest.checkpoint)."""
        paths = TablePaths.of(self.config, spec.name)
        state = load_state(paths.table)
        verdict = checkpoints.inspect(directory, topic=spec.topic,
                                     applied=lambda p: state.applied_offset(spec.topic, p),
                                     audit_path=paths.audit, table=spec.name)
        if not verdict.ok:
            log.warning("table %s: Spark checkpoint %s cannot be trusted (%s); discarding it and resuming from "
                        "the offsets in the table's Delta log", spec.name, directory, verdict.problem)
            checkpoints.discard(directory)

    def _restart_failed(self, name: str, query: Any, handler: _BatchHandler, run: TableRun,
                        restarts: dict[str, Callable[[], Any]]) -> Any | None:
        """A new query if this one died before its first batch for a reason outside our code, else None.

        Such a death is an unusable checkpoint or a transient start failure (Spark gives a Python
        source runner 10 s to connect back, which a loaded machine can miss). Nothing was committed,
        so starting again from the Delta log's offsets is always safe; it is tried a few times.
        """
        if handler.error is not None or run.batches or run.already_applied or name not in restarts:
            return None
        self._restarts[name] = attempt = self._restarts.get(name, 0) + 1
        if attempt > _START_ATTEMPTS:
            return None
        log.warning("table %s: the query failed before its first batch (%s); restarting it from the offsets in "
                    "the Delta log, without its Spark checkpoint (attempt %d of %d)", name,
                    _short(query.exception() or "unknown error"), attempt, _START_ATTEMPTS)
        time.sleep(2 * attempt)
        try:
            return restarts[name]()
        except Exception as exc:  # the original failure stays the table's error
            log.warning("table %s: the restart failed too: %s", name, secrets.describe(exc))
            return None

    def _await(self, queries: dict[str, Any], handlers: dict[str, _BatchHandler], report: RunReport,
               mode: Mode, stop_after: float | None, restarts: dict[str, Callable[[], Any]] | None = None) -> None:
        restarts = restarts if restarts is not None else {}
        if mode == "continuous":
            deadline = time.monotonic() + stop_after if stop_after else None
            try:
                while True:
                    for name, q in list(queries.items()):
                        if not q.isActive and q.exception() is not None:
                            fresh = self._restart_failed(name, q, handlers[name], report.tables[name], restarts)
                            queries[name] = fresh if fresh is not None else q
                    if not any(q.isActive for q in queries.values()):
                        break
                    if deadline and time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
            except KeyboardInterrupt:
                log.warning("interrupted: stopping queries after their current batch")
            for q in queries.values():
                if q.isActive:
                    q.stop()
        for name, query in queries.items():
            while True:
                try:
                    query.awaitTermination()
                    break
                except Exception as exc:
                    fresh = (self._restart_failed(name, query, handlers[name], report.tables[name], restarts)
                             if mode == "available_now" else None)
                    if fresh is not None:
                        query = fresh
                        continue
                    real = handlers[name].error
                    text = f"{type(real).__name__}: {real}" if real else _short(exc)
                    report.tables[name].error = secrets.redact(text)
                    break

    def _decode_step(self, spec: TableSpec) -> DecodeStep:
        return DecodeStep.for_table(self.config, spec)


def _short(exc: BaseException | str) -> str:
    text = str(exc).strip().splitlines()
    return secrets.redact(text[0][:500]) if text else type(exc).__name__


