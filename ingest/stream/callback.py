"""One query's micro-batch on the driver: decode in the executors, then apply it table by table.

:class:`ForEachBatch` is the ``foreachBatch`` callback. It hands the executors the registry's
schemas, collects the decoded parts (never raw rows: :mod:`ingest.stream.decoding`, which also reads
a small micro-batch on the driver, without a Spark job), and applies each table's share in its own
thread, with its own MERGE commit and offsets; a transient error is retried, any other stops that
table alone. :class:`RunReport` is what a run did, table by table.

A table whose batch fails stops alone (:mod:`ingest.stream.stops`). In a continuous run, one that
stopped on a transient error is tried again at a later micro-batch. It first catches up -- the
records from the offsets its own Delta log records up to the source's end, in batches of
``max_records_per_batch`` (or ``max_records_per_table``, if smaller) -- and then takes its share of
the micro-batch again; what the catch-up applied is recognised there by its offsets and skipped.
Nothing is lost and nothing applied twice, although the shared query's checkpoint moved on while the
table stood still.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from ingest import logs, secrets
from ingest.apply.batch import BatchResult
from ingest.apply.journey import apply_batch, placement_for
from ingest.behind import Behind
from ingest.commit.state import OpenTables, load_state
from ingest.commit.writers import Writers
from ingest.config import IngestConfig, TableSpec
from ingest.cuts.publish import Publisher
from ingest.decode.columnar import DecoderSpec
from ingest.errors import is_transient
from ingest.heap import freeze_start_up
from ingest.lake.layout import TablePaths
from ingest.lake.location import Location
from ingest.quality import QualityGate
from ingest.records.audit import AuditRecord
from ingest.rules.rereads import SuspectReads
from ingest.source.consumer_group import GroupCommitter
from ingest.source.sources import source_for
from ingest.stream.audit_rows import AuditRows
from ingest.stream.caught_up import backlog, chunks
from ingest.stream.decoding import Decoding, unavailable
from ingest.stream.report import RunReport
from ingest.stream.rereads import ask_again
from ingest.stream.stops import Stops
from ingest.stream.tails import Tails

if TYPE_CHECKING:
    from ingest.metrics import RunMetrics

log = logging.getLogger(__name__)
_RETRIES = 3  # attempts at a table's batch when its error is transient


ProgressFn = Callable[[str, AuditRecord | None, BatchResult], None]


class AllTablesStopped(Exception):
    """Every table of the query has stopped: the query ends (their errors are in the report)."""


class ForEachBatch:
    """``foreachBatch`` callback of one query: decode in the executors, apply each table on the driver."""

    def __init__(self, config: IngestConfig, specs: list[TableSpec], report: RunReport, run_id: str,
                 progress: ProgressFn | None, gates: dict[str, QualityGate], *, retry_stopped: bool = False,
                 cuts: Publisher | None = None, metrics: RunMetrics | None = None,
                 checkpoint: Location | None = None) -> None:
        self.config, self.specs, self.report, self.run_id = config, specs, report, run_id
        #: how the micro-batches' parts reach the driver
        self.read = Decoding(config, specs, checkpoint)
        #: the micro-batches' audit rows, appended behind them (those of an interval in one commit)
        self.audit = AuditRows(config)
        self.metrics = metrics
        self.progress, self.gates = progress, gates
        #: publishes the cuts of the tables' transaction group after each micro-batch (shared by the run's queries)
        self.cuts = cuts
        #: topics the query reads for no table: the transaction topic, whose END records trigger the
        #: micro-batch that applies a tail left out to wait for them
        self.extra_topics: list[str] = []
        if cuts is not None and config.source.transactions is not None and \
                {s.name for s in cuts.group} & {s.name for s in specs}:
            self.extra_topics = [config.source.transactions.topic]
            self.read.also(config.source.transactions.topic, DecoderSpec.for_source(config))
        #: what the transaction group's tables left out of their last micro-batch, to read again with the next
        self.tails = Tails(config, cuts, self.read.source) if cuts is not None else None
        self.writers = Writers(config)
        kafka = config.source.kafka if config.source.kind == "kafka" else None
        #: the consumer group the applied offsets are committed to (``source.kafka.commit_group``)
        self.group = GroupCommitter(kafka, kafka.commit_group, secrets_file=config.secrets_path) \
            if kafka is not None and kafka.commit_group else None
        #: each table's Delta handles, kept open from one batch to the next
        self.opened = {s.name: OpenTables(TablePaths.of(config, s.name), s.name) for s in specs}
        self.stops = Stops(config, report, metrics, retry_stopped=retry_stopped)
        self.error: BaseException | None = None  # what stopped the whole query (Spark only hands back a string)
        self.batches = 0
        #: tables whose batches are assembled, reduced and planned on the executors (``target.plan_on``)
        self.on_executors = {s.name for s in specs if config.placement_of(s) == "executors"}
        #: Apply a micro-batch Spark decoded in the background while Spark plans and decodes the next
        #: one (one the driver read is applied at once: ``Decoding.read_here``). Only with a source that
        #: decodes as it reads, and no table planned on the executors: applying then needs nothing of
        #: the micro-batch's DataFrame (raw messages for quarantine are fetched from the source), which
        #: Spark may discard once the callback returns. Spark records the batch in its checkpoint before
        #: its tables commit; a crash in between leaves a checkpoint ahead of a table's Delta log, which
        #: the next run discards (``Runner._check_checkpoint``), resuming from the Delta logs.
        self.overlap = self.read.source is not None and not self.on_executors
        #: this micro-batch's decoded parts as a DataFrame, persisted, while tables read it on the executors
        self._parts_frame: DataFrame | None = None
        self._applier = Behind("apply")
        #: held while a micro-batch is taken in; once :meth:`take_no_more` closed it, micro-batches pass
        self._taking = threading.Lock()
        self._closed = False
        #: a micro-batch went by untouched after :meth:`take_no_more`: Spark's checkpoint claims it
        self.passed = False

    def take_no_more(self) -> None:
        """Return once the micro-batch being taken in is handed on (see :meth:`settle`); any later
        one passes untouched, so the query can be stopped without cancelling a batch's Spark job."""
        with self._taking:
            self._closed = True

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        with self._taking:
            if self._closed:
                self.passed = True
            else:
                self._take(frame, batch_id)

    def _take(self, frame: DataFrame, batch_id: int) -> None:
        try:
            t0 = time.perf_counter()
            if self.report.startup_seconds is None:
                self.report.startup_seconds = t0 - self.report.started
            early, behind = None, False
            if self.overlap:
                # This micro-batch is decoded while the previous one is still being applied; what
                # the tables do next depends on how that ended, so it is awaited before anything else.
                # It is applied behind the callback too, unless the driver read it: that took
                # milliseconds, and leaves nothing to overlap (Decoding.read_here).
                here = self.read.read_here(batch_id)
                early, behind = (here, False) if here is not None else (self._decoded(frame), True)
                self.settle()
            if self.batches:
                freeze_start_up()  # a first batch was applied: what the run holds now stays (ingest.heap)
            due = self.stops.due(self.specs)
            active = [s for s in self.specs if s.name not in self.stops or s in due]
            if not active:
                if self.stops.waiting:
                    return  # every table waits for its next try; the query goes on
                raise AllTablesStopped
            if self.read.source is None:  # a reader that decodes as it reads got them when its stream started
                self.read.prefetch_schemas(active)
            active = [s for s in active if s not in due or self._catch_up(s, frame, batch_id)]
            # The executors decode the Kafka rows into typed columnar parts; the driver gets those only
            # (of the tables it plans: the others read them where they are).
            if any(s.name in self.on_executors for s in active):
                self._parts_frame = self._parts(frame).persist()
            try:
                parts = early if early is not None else self._decoded(
                    frame, exclude={s.topic for s in active if s.name in self.on_executors})
                if self.cuts is not None:
                    parts = self._aligned(active, frame, parts)
                decode_ms = int((time.perf_counter() - t0) * 1000)
                self.batches += 1
                if behind:
                    self._applier.submit(self._apply_all, active, frame, parts, batch_id, decode_ms)
                else:
                    self._apply_all(active, frame, parts, batch_id, decode_ms)
            finally:
                if self._parts_frame is not None:
                    self._parts_frame.unpersist()
                    self._parts_frame = None
        except BaseException as exc:
            self.error = exc
            raise

    def _aligned(self, active: list[TableSpec], frame: DataFrame, parts: list[Any]) -> list[Any]:
        """The micro-batch's parts with each group table that the driver plans ending at one transaction
        boundary (:class:`~ingest.stream.tails.Tails`)."""
        assert self.tails is not None
        names = {s.name for s in active}
        group = [s for s in self.tails.cuts.group if s.name in names and s.name not in self.on_executors]
        if not group:
            return parts
        return self.tails.aligned(group, self.opened, frame, parts, self.read.decoder, self.stops.stop)

    def settle(self) -> None:
        """Wait for the micro-batch still being applied, if any (see ``overlap``).

        Raises:
            AllTablesStopped: that batch stopped the query's last table.
            Exception: whatever else that batch failed with (the audit append, say).
        """
        try:
            self._applier.wait()
            self.audit.wait()
        except BaseException as exc:
            self.error = exc
            raise

    def close(self) -> None:
        """Let the background applier and auditor go (after :meth:`settle`, and once the audit rows
        still waiting are appended), the writers' checkpoints, the tables' packing of their remembered
        deletes, the consumer group's committer, and the source's reader."""
        self._applier.close()  # what a batch there failed with reaches the query through settle
        failed = self.audit.close()
        self.writers.settle()
        for opened in self.opened.values():
            opened.settle()
        if failed:
            log.warning("the last micro-batches' audit rows were not appended (%s); the next run restores them "
                        "from the tables' Delta logs", secrets.describe(failed[0]))
        if self.group is not None:
            self.group.close()
        self.read.close()

    def _apply_all(self, active: list[TableSpec], frame: DataFrame, parts: list[Any], batch_id: int,
                   decode_ms: int) -> None:
        self.audit.wait()  # the batch before's rows first (a failed append fails this batch)
        by_topic: dict[str, list[Any]] = {}
        for part in parts:
            if part.num_rows:
                by_topic.setdefault(part.column("_cdc_topic")[0].as_py(), []).append(part)
        planned_there = self.on_executors if self._parts_frame is not None else set()
        work = [s for s in active if s.topic in by_topic or s.name in planned_there]
        # Tables apply side by side: delta-rs and DuckDB work outside the GIL.
        with ThreadPoolExecutor(max_workers=max(1, min(len(work), 4))) as pool:
            futures = {s.name: pool.submit(self._apply, s, frame, by_topic.get(s.topic, []), batch_id, decode_ms)
                       for s in work}
        records = []
        for spec in work:
            exc = futures[spec.name].exception()
            if exc is not None:
                self.stops.stop(spec, exc)
            elif (record := futures[spec.name].result()) is not None:
                records.append(record)
        # One audit commit for the micro-batches' tables, not one each (200 tables: 200 commits of a
        # shared table, one at a time). Each table's commit holds its row already (reconcile).
        if records:
            self.audit.add(records)
        if self.cuts is not None:
            self.report.cuts = self.cuts.attempt({n: secrets.describe(e) for n, e in self.stops.errors.items()})
        if self.stops.all_for_good(self.specs):
            raise AllTablesStopped

    def _parts(self, frame: DataFrame) -> DataFrame:
        """The micro-batch's parts as a DataFrame: persisted for the executors' tables, or as decoded."""
        return self._parts_frame if self._parts_frame is not None else self.read.parts(frame)

    def _decoded(self, frame: DataFrame, exclude: set[str] | None = None) -> list[Any]:
        """The micro-batch's parts on the driver, less those of the ``exclude`` topics (left on the executors)."""
        return self.read.collect(self._parts(frame), exclude)

    def _catch_up(self, spec: TableSpec, frame: DataFrame, batch_id: int) -> bool:
        """A stopped table's next try: apply what it missed, from its Delta log's offsets to the source's end.

        Returns whether it succeeded; the table is then active again. On failure it stops again (and
        waits twice as long, if the error is transient again).
        """
        paths = TablePaths.of(self.config, spec.name)
        log.warning("table %s: trying again after %s; catching up from its Delta log", spec.name,
                    self.report.tables[spec.name].error)
        try:
            source = source_for(self.config)
            start, end = backlog(source, spec, load_state(paths.table))
            for lo, hi in chunks(start, end, self.config.source.table_batch_records):
                if self.read.source is not None:  # a source decoding as it reads: read and decoded here
                    gap, parts = None, self.read.decoder.decode(self.read.source.read_arrow(spec.topic, lo, hi))
                else:
                    gap = source.read_range(frame.sparkSession, spec.topic, lo, hi)
                    parts = self._decoded(gap)
                record = self._apply(spec, gap, parts, batch_id, 0)
                if record is not None:
                    self.audit.table.append(paths.audit, [record])
        except Exception as exc:
            self.stops.stop(spec, exc)
            return False
        self.stops.running_again(spec)
        return True

    def apply(self, spec: TableSpec, parts: list[Any], batch_id: int, decode_ms: int) -> AuditRecord | None:
        """Apply a table's batch read and decoded on the driver, outside any micro-batch
        (:mod:`ingest.stream.driver_run`); returns its audit row, for the caller to append."""
        return self._apply(spec, None, parts, batch_id, decode_ms)

    def _apply(self, spec: TableSpec, frame: DataFrame | None, parts: list[Any], batch_id: int,
               decode_ms: int) -> AuditRecord | None:
        """Apply one table's share of the micro-batch; returns its audit row, for the caller to append."""
        paths = TablePaths.of(self.config, spec.name)
        if self.read.source is not None and unavailable(parts):
            # The reader's workers could not reach the registry (no route or credentials on the
            # executors): the driver, which may, decodes the table's share itself.
            log.warning("table %s: the workers could not read the schema registry; decoding batch %d on the "
                        "driver (source.kafka.reader: spark lets the driver hand them the schemas)",
                        spec.name, batch_id)
            parts = self.read.redecoded(spec, frame, parts)
        asked: list[bool] = []

        def ask(suspects: SuspectReads) -> None:  # before the commit; once, however often the batch is retried
            if not asked:
                asked.append(ask_again(self.config, spec, suspects, batch=batch_id))

        for attempt in Retrying(stop=stop_after_attempt(_RETRIES), wait=wait_exponential(multiplier=1, max=15),
                                retry=retry_if_exception(is_transient), reraise=True,
                                before_sleep=lambda state: log.warning(
                                    "table %s: batch %d failed (%s); retrying", spec.name, batch_id,
                                    _failure(state))):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    # decode the table's records again (the registry may answer now)
                    parts = self.read.redecoded(spec, frame, parts)
                fetch = self.read.raw_fetch(frame)
                writer = self.writers.for_table(spec)
                on_executors = spec.name in self.on_executors and self._parts_frame is not None
                result = apply_batch(spec, paths, self._parts_frame if on_executors else parts,
                                     placement=placement_for("executors" if on_executors else "driver", writer,
                                                             paths.table),
                                     writer=writer, opened=self.opened[spec.name], batch_id=batch_id,
                                     run_id=self.run_id, decode_ms=decode_ms, gate=self.gates.get(spec.name),
                                     defer_audit=True, fetch_raw=fetch, on_suspect_reads=ask)
        run = self.report.tables[spec.name]
        run.already_applied += result.already_applied
        if result.record is not None:
            run.batches.append(result.record)
            r = result.record
            if self.group is not None and r.status == "committed":
                self.group.commit(spec.name, spec.topic, r.last_offsets(spec.topic))
            if self.metrics is not None:
                self.metrics.batch(r)
            logs.event(log, "batch", f"table {spec.name}: batch {batch_id} {r.status}, {r.received} received, "
                       f"{r.inserted} inserted, {r.updated} updated, {r.deleted} deleted", table=spec.name,
                       batch=batch_id, status=r.status, received=r.received, inserted=r.inserted, updated=r.updated,
                       deleted=r.deleted, stale=r.stale, superseded=r.superseded, quarantined=r.quarantined,
                       skipped=r.skipped, toast_unknown=r.toast_unknown, delta_version=r.delta_version,
                       total_ms=r.total_ms, apply_ms=r.apply_ms)
        if self.progress is not None:
            self.progress(spec.name, result.record, result)
        return result.record


def _failure(state: Any) -> str:
    """What a tenacity attempt failed with, for the retry's log line."""
    exc = state.outcome.exception() if state.outcome is not None else None
    return secrets.describe(exc) if exc is not None else "no exception"

