"""A draining run without Spark: a backlog the driver applies sooner than Spark could start.

Spark's session and streaming query take seconds to tens of seconds to start before they read a
record (docs/benchmarks.md). A draining run whose backlog is modest ends sooner on the driver alone:
the engine's own reader reads each table's records from the offsets its Delta log records, the
driver decodes them, and every batch takes the journey a micro-batch takes (:mod:`ingest.apply.journey`),
committed with delta-rs. Progress lives in the Delta logs as always, so whatever stops the driver
run -- a backlog bigger than it looked, a crash -- leaves a state any later run, with or without
Spark, resumes from.

How long the rest would take is estimated after every batch, at the rate reached so far; when it is
more than ``source.driver_seconds``, the rest is handed to Spark (:mod:`ingest.stream.queries`),
whose queries start from the tables' Delta logs. While one batch is applied, the next ones are read
and decoded by a small pool of processes, as Spark's Python workers would; the pool starts before
Great Expectations is imported for the tables' suites, so the two overlap.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from ingest import logs
from ingest.commit.state import TableState, load_state
from ingest.config import IngestConfig, TableSpec
from ingest.ctrl_c import FirstCtrlC
from ingest.decode.columnar import BatchDecoder
from ingest.lake.layout import TablePaths
from ingest.quality import QualityGate
from ingest.records import audit
from ingest.source.sources import DecodingSource, EmbeddedSource, decodes_at_read, source_for
from ingest.stream import checkpoint as checkpoints
from ingest.stream.callback import ForEachBatch
from ingest.stream.caught_up import backlog, chunks
from ingest.stream.queries import query_groups, query_name
from ingest.stream.report import RunReport, TableRun

if TYPE_CHECKING:
    from ingest.records.audit import AuditRecord
    from ingest.stream.callback import ProgressFn
    from ingest.stream.runner import Runner

log = logging.getLogger(__name__)
#: Processes that read and decode pieces for the driver, at most (and no more than the machine's cores).
DECODERS_MAX: Final = 4
#: How often a decoding process looks whether the driver that forked it is still there.
PARENT_CHECK_SECONDS: Final = 1.0


def refusal(config: IngestConfig, spec: TableSpec) -> str | None:
    """Why the driver cannot apply the table's batches alone (``None``: it can)."""
    if not decodes_at_read(config):
        return "its records are read by Spark's Kafka source (source.kafka.reader: spark)"
    if config.writer_of(spec) != "delta-rs":
        return "it is written by delta-spark"
    if config.placement_of(spec) != "driver":
        return "it is planned on the executors"
    if config.validates_on_spark(spec):
        return "its suite validates on Spark"
    if spec.name in {s.name for s in config.consistent_tables()}:
        return "it is in a transaction group, whose batches end at transaction boundaries"
    return None


@dataclass(frozen=True, slots=True)
class _Piece:
    """One batch of a table: the offsets ``[start, end)`` per partition, and how many records that is."""

    spec: TableSpec
    start: dict[int, int]
    end: dict[int, int]
    records: int


class DriverRun:
    """Apply the tables' backlog on the driver, for a :class:`~ingest.stream.runner.Runner` holding their locks."""

    def __init__(self, runner: Runner, specs: list[TableSpec], progress: ProgressFn | None) -> None:
        self.runner, self.specs, self.progress = runner, specs, progress
        self.report = RunReport(uuid.uuid4().hex[:12], {s.name: TableRun(s.name) for s in specs}, on_driver=True)

    @staticmethod
    def wanted(config: IngestConfig, specs: list[TableSpec], work: dict[str, int]) -> bool:
        """Whether a draining run of ``specs``, with ``work`` records pending per table, starts on the
        driver: it is allowed to (``source.driver_seconds``), and every table with work can."""
        if config.source.driver_seconds <= 0:
            return False
        busy = [s for s in specs if work.get(s.name)]
        refused = {s.name: why for s in busy if (why := refusal(config, s)) is not None}
        if refused:
            log.info("the run starts Spark: %s", "; ".join(f"table {n}: {why}" for n, why in refused.items()))
        return bool(busy) and not refused

    def run(self) -> bool:
        """Apply every table's backlog, up to where the source ended when the run began, unless the
        rest looks slower than ``source.driver_seconds``. Returns whether it is done (applied all of it,
        or was interrupted); if not, the run goes on with Spark. Once the driver applied a batch, the
        Spark checkpoints of the tables' queries are behind their Delta logs, and are discarded.

        Raises:
            SuiteError: a table's expectations suite cannot be loaded or does not fit the table.
        """
        config = self.runner.config
        for spec in self.specs:
            self.runner.restore_audit(spec)
        gates: dict[str, QualityGate] = {}  # filled below, while the first pieces are decoded
        handler = ForEachBatch(config, self.specs, self.report, self.report.run_id, self.progress, gates,
                               metrics=self.runner.metrics)
        decoded, ctrl_c = None, None
        try:
            try:
                handler.read.prefetch_schemas(self.specs)
                states = {spec.name: load_state(TablePaths.of(config, spec.name).table) for spec in self.specs}
                pieces = self._pieces(handler, states)
                logs.event(log, "driver-run", f"run {self.report.run_id}: {sum(p.records for p in pieces)} "
                           f"records to apply on the driver, without Spark", run=self.report.run_id,
                           records=sum(p.records for p in pieces))
                decoded = _DecodedPieces(config, handler, pieces)
                for spec in self.specs:  # Great Expectations' import: seconds, beside the decoders
                    gate = QualityGate.for_table(config, spec, table_columns=states[spec.name].columns)
                    if gate is not None:
                        gates[spec.name] = gate
                ctrl_c = FirstCtrlC("interrupted: the batch under way finishes, then the run ends (Ctrl-C again: "
                                    "at once)")
                finished = self._apply(handler, pieces, decoded, ctrl_c)
            finally:
                if decoded is not None:
                    decoded.close()
                handler.close()
            if any(t.batches for t in self.report.tables.values()):
                self._discard_checkpoints()
            # A press while the rest is handed to Spark (the decoders closing, the checkpoints going)
            # ends the run here, as one during a batch does: Spark does not start.
            if not finished and ctrl_c.pressed:
                self._interrupted()
                finished = True
        finally:
            if ctrl_c is not None:
                ctrl_c.restore()
        self.report.seconds = time.perf_counter() - self.report.started
        return finished

    def _pieces(self, handler: ForEachBatch, states: dict[str, TableState]) -> list[_Piece]:
        """Every table's backlog in batches, as the Spark run's reader would bound them (``states``: the
        tables' Delta logs, read once for the run)."""
        config = self.runner.config
        limit = config.source.table_batch_records
        assert handler.read.source is not None
        pieces = []
        for spec in self.specs:
            start, end = backlog(handler.read.source, spec, states[spec.name])
            pieces += [_Piece(spec, lo, hi, sum(hi[p] - lo[p] for p in hi)) for lo, hi in chunks(start, end, limit)]
        return pieces

    def _apply(self, handler: ForEachBatch, pieces: list[_Piece], decoded: _DecodedPieces, ctrl_c: FirstCtrlC
               ) -> bool:
        """Apply the pieces in order, the next ones read and decoded while one is applied; ``False``
        when the rest was left to Spark. A press of ``ctrl_c`` ends it after the batch under way."""
        budget = self.runner.config.source.driver_seconds
        total, done, batch_id = sum(p.records for p in pieces), 0, 0
        records: list[AuditRecord] = []
        began = time.perf_counter()
        warm: tuple[int, float] | None = None  # records done and time when the first batch ended
        try:
            for piece, parts, decode_ms in decoded:
                if piece.spec.name not in handler.stops:
                    try:
                        if isinstance(parts, BaseException):
                            raise parts
                        record = handler.apply(piece.spec, parts, batch_id, decode_ms)
                        if record is not None:
                            records.append(record)
                    except Exception as exc:
                        handler.stops.stop(piece.spec, exc)
                if ctrl_c.pressed:
                    raise KeyboardInterrupt
                batch_id += 1
                done += piece.records
                now, left = time.perf_counter(), total - done
                if warm is None:
                    # The first batch also opens the tables and warms the libraries up: its rate is
                    # only trusted to say that the rest is far out of reach.
                    warm, rate, allowed = (done, now), done / max(now - began, 1e-3), 2 * budget
                else:
                    rate, allowed = (done - warm[0]) / max(now - warm[1], 1e-3), budget
                if left and left / max(rate, 1e-3) > allowed:
                    log.info("run %s: %d records left, about %.0f s on the driver (source.driver_seconds: %g); "
                             "Spark takes the rest", self.report.run_id, left, left / max(rate, 1e-3), budget)
                    return False
            return True
        except KeyboardInterrupt:  # Ctrl-C: the run ends with its report, as a Spark run's does
            self._interrupted()
            return True
        finally:
            if records:  # one audit commit for the run's batches (each table's commit holds its row already)
                audit.append(TablePaths.of(self.runner.config, records[0].table).audit, records)

    def _interrupted(self) -> None:
        logs.event(log, "run-interrupted", f"run {self.report.run_id} interrupted: the batch under way either "
                   "committed or left nothing, and the next run applies the rest", run=self.report.run_id,
                   level=logging.WARNING)

    def _discard_checkpoints(self) -> None:
        """The Spark checkpoints of these tables' queries are behind their Delta logs now: the queries
        would read again what the driver applied (and skip it). Without them they start from the logs.
        A store that refuses the deletion costs that re-read only: the run does not fail for it."""
        config = self.runner.config
        for group in query_groups(self.specs, config.source.queries):
            checkpoints.discard_or_warn(config.checkpoint_location / query_name(group), f"run {self.report.run_id}",
                                        "the next Spark run reads again what this run applied, and skips it")


class _DecodedPieces:
    """The pieces with their decoded parts (or what reading or decoding them raised) and the
    milliseconds that took, in order.

    The embedded log's pieces are read and decoded by a pool of processes, which starts at once and
    keeps a few pieces ahead of the one being applied. Kafka's are read and decoded as they are
    asked for, one after another: librdkafka and a registry client's connections do not survive a
    fork. So is a single piece.
    """

    def __init__(self, config: IngestConfig, handler: ForEachBatch, pieces: list[_Piece]) -> None:
        assert handler.read.source is not None  # refusal() lets only a source that decodes as it reads through
        self.handler, self.source, self.pieces = handler, handler.read.source, pieces
        self.pool: ProcessPoolExecutor | None = None
        self.size = max(1, min(os.cpu_count() or 1, DECODERS_MAX, len(pieces)))
        self._todo = iter(pieces)
        self._window: deque[tuple[_Piece, Future[tuple[list[Any], int]]]] = deque()
        if len(pieces) > 1 and isinstance(self.source, EmbeddedSource):
            # Forked, as PySpark's daemon forks its Python workers: a spawned process would import
            # the caller's main module again, which a script without a __main__ guard cannot
            # survive. The children only read files and decode (no Delta table, whose runtime's
            # threads are not theirs, and not Great Expectations, which loads after the fork).
            self.pool = ProcessPoolExecutor(self.size, mp_context=multiprocessing.get_context("fork"),
                                            initializer=_start_decoder, initargs=(config, handler.read.decoder))
            self._top_up()

    def _top_up(self) -> None:
        assert self.pool is not None
        while len(self._window) <= self.size and (piece := next(self._todo, None)) is not None:
            self._window.append((piece, self.pool.submit(_read_decoded, piece.spec.topic, piece.start, piece.end)))

    def __iter__(self) -> Iterator[tuple[_Piece, Any, int]]:
        stopped = self.handler.stops
        if self.pool is None:
            for piece in self.pieces:
                if piece.spec.name in stopped:
                    continue
                began = time.perf_counter()
                try:
                    parts: Any = self.handler.read.decoder.decode(
                        self.source.read_arrow(piece.spec.topic, piece.start, piece.end))
                except Exception as exc:  # the table stops; the others go on
                    parts = exc
                yield piece, parts, int((time.perf_counter() - began) * 1000)
            return
        while self._window:
            piece, future = self._window.popleft()
            self._top_up()
            if piece.spec.name in stopped:
                future.cancel()
                continue
            try:
                parts, decode_ms = future.result()
            except Exception as exc:
                parts, decode_ms = exc, 0
            yield piece, parts, decode_ms

    def close(self) -> None:
        """The rest handed to Spark, or the run interrupted: what has not started never will."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


_worker: tuple[DecodingSource, BatchDecoder] | None = None  # a decoding process's source and decoder


def _start_decoder(config: IngestConfig, decoder: BatchDecoder) -> None:
    global _worker
    _worker = (cast(DecodingSource, source_for(config)), decoder)
    # Ctrl-C reaches the terminal's whole process group, and a service manager's SIGTERM may reach every
    # process of the service: the driver stops the pool, and a decoder finishing its piece is no failure
    # to print a traceback for.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A driver killed outright (SIGKILL, the OOM killer) cannot shut its pool down, and a forked
    # decoder holds its own copy of the pipe it waits on, so it would wait forever: it leaves when
    # its parent is gone.
    parent = os.getppid()

    def leave_with_the_driver() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=leave_with_the_driver, name="decoder-watch", daemon=True).start()


def _read_decoded(topic: str, start: dict[int, int], end: dict[int, int]) -> tuple[list[Any], int]:
    """In a decoding process: the parts of ``[start, end)`` of ``topic``, and the milliseconds they took."""
    assert _worker is not None
    source, decoder = _worker
    began = time.perf_counter()
    parts = decoder.decode(source.read_arrow(topic, start, end))
    return parts, int((time.perf_counter() - began) * 1000)
