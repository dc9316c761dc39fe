"""One query's micro-batch on the driver: decode in the executors, then apply it table by table.

:class:`ForEachBatch` is the ``foreachBatch`` callback. It hands the executors the registry's
schemas, collects the decoded parts (never raw rows), and applies each table's share in its own
thread, with its own MERGE commit and offsets; a transient error is retried, any other stops that
table alone. A small micro-batch the driver reads and decodes itself, without a Spark job
(:meth:`ForEachBatch._read_here`). :class:`RunReport` is what a run did, table by table.

A stopped table, in a continuous run, is tried again when its error was transient (a registry or
broker that did not answer, a concurrent writer): after ``source.retry_stopped_seconds``, doubling
up to :data:`RETRY_MAX_SECONDS`, at the next micro-batch. It first catches up -- the records from the
offsets its own Delta log records up to the source's end, in batches of ``max_records_per_batch`` (or
``max_records_per_table``, if smaller) --
and then takes its share of the micro-batch again; what the catch-up applied is recognised there by
its offsets and skipped. Nothing is lost and nothing applied twice, although the shared query's
checkpoint moved on while the table stood still. Any other error (quality policy ``fail``, an
incompatible schema, a bad configuration) stops the table until the run is restarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from ingest import logs, secrets
from ingest.apply.batch import BatchResult
from ingest.apply.journey import apply_batch, placement_for
from ingest.behind import Behind
from ingest.commit.state import OpenTables, TableState, load_state
from ingest.commit.writers import Writers
from ingest.config import IngestConfig, TableSpec
from ingest.cuts.align import Reach, boundary, newest_mark, tail_starts, trim
from ingest.cuts.publish import Publisher
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.decode.parts import FRAME, PARTS_DDL, part_kind, read_parts
from ingest.decode.registry import ConfluentSchemaRegistry, confluent_registry
from ingest.errors import RegistryUnavailableError, is_cancellation, is_transient, is_unavailability
from ingest.heap import freeze_start_up
from ingest.lake.layout import TablePaths
from ingest.lake.location import Location
from ingest.model import SourceMark
from ingest.quality import QualityGate
from ingest.records import audit
from ingest.records.audit import AuditRecord
from ingest.rules.rereads import SuspectReads
from ingest.source.catalog import Catalog
from ingest.source.consumer_group import GroupCommitter
from ingest.source.reader import MIN_PIECE, batch_spans
from ingest.source.sources import DecodingSource, decodes_at_read, source_for
from ingest.stream import checkpoint as checkpoints
from ingest.stream.caught_up import gap_of, say_retention_gap
from ingest.stream.report import RunReport
from ingest.stream.rereads import ask_again

if TYPE_CHECKING:
    from ingest.metrics import RunMetrics

log = logging.getLogger(__name__)
_RETRIES = 3  # attempts at a table's batch when its error is transient
RETRY_MAX_SECONDS = 600.0  # longest wait before a stopped table is tried again (continuous runs)


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
        #: the query's checkpoint, whose offsets log says where a micro-batch starts and ends (:meth:`_read_here`)
        self.checkpoint = checkpoint
        #: the last micro-batch whose offsets were read there, and where it ends (where the next starts)
        self._last_end: tuple[int, dict[str, dict[int, int]]] | None = None
        #: the audit table, kept open from one micro-batch's append to the next
        self.audit = audit.AuditLog()
        self.metrics = metrics
        self.progress, self.gates = progress, gates
        #: publishes the cuts of the tables' transaction group after each micro-batch (shared by the run's queries)
        self.cuts = cuts
        #: available_now runs: where each topic ended when the run began (its last batch leaves no tail)
        self.final_ends: dict[str, dict[int, int]] | None = None
        #: per group topic and partition, the end of the tail the last batch left out
        self._tails: dict[str, dict[int, int]] = {}
        self._warned: set[str] = set()
        self.specs_by_topic = {s.topic: DecoderSpec.for_table(config, s) for s in specs}
        self.decoder = BatchDecoder(self.specs_by_topic)
        self.registry = _driver_registry(config)
        #: topics the query reads for no table: the transaction topic, whose END records trigger the
        #: micro-batch that applies a tail left out to wait for them
        self.extra_topics: list[str] = []
        if cuts is not None and config.source.transactions is not None and \
                {s.name for s in cuts.group} & {s.name for s in specs}:
            self.extra_topics = [config.source.transactions.topic]
            self.specs_by_topic[config.source.transactions.topic] = DecoderSpec.for_source(config)
            self.decoder = BatchDecoder(self.specs_by_topic)
        #: the source, when it decodes as it reads (the stream's rows are then parts)
        self.source = cast(DecodingSource, source_for(config)) if decodes_at_read(config) else None
        self.writers = Writers(config)
        kafka = config.source.kafka if config.source.kind == "kafka" else None
        #: the consumer group the applied offsets are committed to (``source.kafka.commit_group``)
        self.group = GroupCommitter(kafka, kafka.commit_group, secrets_file=config.secrets_path) \
            if kafka is not None and kafka.commit_group else None
        #: each table's Delta handles, kept open from one batch to the next
        self.opened = {s.name: OpenTables(TablePaths.of(config, s.name), s.name) for s in specs}
        self.stopped: dict[str, BaseException] = {}
        #: when each stopped table may be tried again (``time.monotonic``); only with ``retry_stopped``
        self.retry_at: dict[str, float] = {}
        self.retry_stopped = retry_stopped
        self._stops: Counter[str] = Counter()
        self.error: BaseException | None = None  # what stopped the whole query (Spark only hands back a string)
        self.batches = 0
        #: Apply a micro-batch Spark decoded in the background while Spark plans and decodes the next
        #: one (one the driver read is applied at once: :meth:`_read_here`). Only with a source that
        #: decodes as it reads: applying then needs nothing of the micro-batch's
        #: DataFrame (raw messages for quarantine are fetched from the source), which Spark may
        #: discard once the callback returns. Spark records the batch in its checkpoint before its
        #: tables commit; a crash in between leaves a checkpoint ahead of a table's Delta log, which
        #: the next run discards (``Runner._check_checkpoint``), resuming from the Delta logs.
        #: tables whose batches are assembled, reduced and planned on the executors (``target.plan_on``)
        self.on_executors = {s.name for s in specs if config.placement_of(s) == "executors"}
        self.overlap = self.source is not None and not self.on_executors  # they read the micro-batch's frame
        #: this micro-batch's decoded parts as a DataFrame, persisted, while tables read it on the executors
        self._parts_frame: DataFrame | None = None
        self._applier = Behind("apply")
        #: The micro-batches' audit rows are appended in the background, while Spark commits the batch
        #: and starts the next one, those of ``target.audit_interval_seconds`` in one commit (each
        #: table's commit already holds its row: ``reconcile`` restores rows a stop loses); the next
        #: batch's apply, :meth:`settle` and :meth:`close` await the appends under way.
        self._auditor = Behind("audit")
        #: rows waiting for their commit, when it is due (``time.monotonic``), and the timer that makes
        #: it when no micro-batch comes by then; the lock keeps the timer and the batches apart
        self._audit_rows: list[AuditRecord] = []
        self._audit_due = float("-inf")
        self._audit_timer: threading.Timer | None = None
        self._audit_lock = threading.Lock()

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        try:
            t0 = time.perf_counter()
            if self.report.startup_seconds is None:
                self.report.startup_seconds = t0 - self.report.started
            early = here = None
            if self.overlap:
                # This micro-batch is decoded while the previous one is still being applied; what
                # the tables do next depends on how that ended, so it is awaited before anything else.
                here = self._read_here(batch_id)
                early = here if here is not None else self._decoded(frame)
                self.settle()
            if self.batches:
                freeze_start_up()  # a first batch was applied: what the run holds now stays (ingest.heap)
            now = time.monotonic()
            due = [s for s in self.specs if s.name in self.stopped and self.retry_at.get(s.name, now + 1) <= now]
            active = [s for s in self.specs if s.name not in self.stopped or s in due]
            if not active:
                if self.retry_at:
                    return  # every table waits for its next try; the query goes on
                raise AllTablesStopped
            if self.source is None:  # a reader that decodes as it reads got them when its stream started
                self.prefetch_schemas(active)
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
                if self.overlap and here is None:
                    self._applier.submit(self._apply_all, active, frame, parts, batch_id, decode_ms)
                else:  # a batch the driver read took milliseconds to decode: nothing to overlap (_read_here)
                    self._apply_all(active, frame, parts, batch_id, decode_ms)
            finally:
                if self._parts_frame is not None:
                    self._parts_frame.unpersist()
                    self._parts_frame = None
        except BaseException as exc:
            self.error = exc
            raise

    def _aligned(self, active: list[TableSpec], frame: DataFrame, parts: list[Any]) -> list[Any]:
        """The micro-batch's parts with each group table ending at one transaction boundary
        (:mod:`ingest.cuts.align`): the tail the last batch left out read again, this batch's tail left out."""
        assert self.cuts is not None
        names = {s.name for s in active}
        group = [s for s in self.cuts.group if s.name in names and s.name not in self.on_executors]
        if not group:
            return parts
        try:
            transactions = self.cuts.transactions()
        except Exception as exc:  # no order to align to: the tables apply what they read (the publisher says why)
            self._warn("align", f"tables not aligned to transactions: {secrets.describe(exc)}")
            return parts
        topics = {s.topic for s in group}
        by_topic: dict[str, list[Any]] = {t: [] for t in topics}
        others: list[Any] = []
        for part in parts:
            topic = part.column("_cdc_topic")[0].as_py() if part.num_rows else None
            (by_topic[topic] if topic in topics else others).append(part)
        reaches: dict[str, Reach] = {}
        rows: dict[str, pa.Table] = {}
        stored: dict[str, SourceMark] = {}
        for spec in list(group):
            state = self.opened[spec.name].state()
            try:
                again = self._tail_again(spec, state, frame, by_topic[spec.topic])
            except Exception as exc:
                # Without its tail, the table's records would leave a hole in its offsets: it stops
                # (a transient error is tried again, catching up from its Delta log), the others go on.
                self.stop_table(spec, exc)
                by_topic[spec.topic] = []
                group.remove(spec)
                continue
            by_topic[spec.topic] = again + by_topic[spec.topic]
            stored[spec.name] = state.mark
            rows[spec.name] = _frame_rows(by_topic[spec.topic])
            reaches[spec.name] = Reach(self.cuts.collection(spec), state.mark,
                                       newest_mark(rows[spec.name], state.mark))
        reach = boundary(transactions, reaches)
        # A tail grows while another table of the group lags (each is read up to its own bound): up to a
        # micro-batch of it is read again, beyond that the table goes on without waiting.
        bound = self.config.source.max_records_per_batch
        for spec in group:
            starts = tail_starts(rows[spec.name], stored[spec.name], transactions, reach)
            final = (self.final_ends or {}).get(spec.topic)
            if final is not None:  # an available_now run's last batch of a partition: nothing reads it again
                ends = _ends(rows[spec.name])
                starts = {p: o for p, o in starts.items() if ends.get(p, 0) < final.get(p, 0)}
            kept, left_out = trim(by_topic[spec.topic], starts)
            if left_out > bound:
                self._warn(spec.name, f"table {spec.name}: a transaction larger than a micro-batch ({left_out} "
                                      f"records) is applied in parts; the next cut waits for its last part")
                continue
            by_topic[spec.topic] = kept
            if starts:
                self._tails[spec.topic] = _ends(rows[spec.name])
            else:
                self._tails.pop(spec.topic, None)
        return others + [p for t in sorted(topics) for p in by_topic[t]]

    def _tail_again(self, spec: TableSpec, state: Any, frame: DataFrame, mine: list[Any]) -> list[Any]:
        """The records between the table's Delta offsets and this batch's first: the tail the last batch
        left out (or one a restart forgot), read from the source again and decoded."""
        first: dict[int, int] = {}
        for part in mine:
            if part.num_rows:
                grouped = pa.table({"p": part["_cdc_partition"], "o": part["_cdc_offset"]}).group_by(
                    "p", use_threads=False).aggregate([("o", "min")])
                for p, o in zip(grouped["p"].to_pylist(), grouped["o_min"].to_pylist(), strict=True):
                    first[p] = min(first.get(p, o), o)
        upto = {**self._tails.get(spec.topic, {}), **first}
        start = {p: _after(state.applied_offset(spec.topic, p)) for p in upto}
        gap_end = {p: o for p, o in upto.items() if o > start[p]}
        if not gap_end:
            return []
        floor = source_for(self.config).start_offsets(spec.topic)  # what retention has kept
        lo = {p: max(start[p], floor.get(p, 0)) for p in gap_end}
        if self.source is not None:
            return list(self.decoder.decode(self.source.read_arrow(spec.topic, lo, gap_end)))
        gap = source_for(self.config).read_range(frame.sparkSession, spec.topic, lo, gap_end)
        return read_parts(gap.mapInArrow(self.decoder, PARTS_DDL).toArrow().column("part").to_pylist())

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", text)

    def settle(self) -> None:
        """Wait for the micro-batch still being applied, if any (see ``overlap``).

        Raises:
            AllTablesStopped: that batch stopped the query's last table.
            Exception: whatever else that batch failed with (the audit append, say).
        """
        try:
            self._applier.wait()
            self._settle_audit()
        except BaseException as exc:
            self.error = exc
            raise

    def _settle_audit(self) -> None:
        """Wait for the audit appends under way, if any; raises what the first that failed failed with."""
        self._auditor.wait()

    def _audit(self, records: list[AuditRecord]) -> None:
        """Have ``records`` appended to the audit table: now, when the last append is
        ``target.audit_interval_seconds`` ago, else with the rows that come until then."""
        with self._audit_lock:
            self._audit_rows += records
            wait = self._audit_due - time.monotonic()
            if wait <= 0:
                self._flush_audit_locked()
            elif self._audit_timer is None:  # no micro-batch may come by then: the rows go anyway
                self._audit_timer = threading.Timer(wait, self._flush_audit)
                self._audit_timer.daemon = True
                self._audit_timer.start()

    def _flush_audit(self) -> None:
        with self._audit_lock:
            self._flush_audit_locked()

    def _flush_audit_locked(self) -> None:
        if self._audit_timer is not None:
            self._audit_timer.cancel()
            self._audit_timer = None
        if not self._audit_rows:
            return
        rows, self._audit_rows = self._audit_rows, []
        self._audit_due = time.monotonic() + self.config.target.audit_interval_seconds
        path = TablePaths.of(self.config, rows[0].table).audit
        self._auditor.submit(self.audit.append, path, rows)

    def close(self) -> None:
        """Let the background applier and auditor go (after :meth:`settle`, and once the audit rows
        still waiting are appended), the writers' checkpoints, the tables' packing of their remembered
        deletes, the consumer group's committer, and the source's reader."""
        self._applier.close()  # what a batch there failed with reaches the query through settle
        self._flush_audit()
        failed = self._auditor.close()
        self.writers.settle()
        for opened in self.opened.values():
            opened.settle()
        if failed:
            log.warning("the last micro-batches' audit rows were not appended (%s); the next run restores them "
                        "from the tables' Delta logs", secrets.describe(failed[0]))
        if self.group is not None:
            self.group.close()
        if self.source is not None:
            self.source.close()

    def _apply_all(self, active: list[TableSpec], frame: DataFrame, parts: list[Any], batch_id: int,
                   decode_ms: int) -> None:
        self._settle_audit()  # the batch before's rows first (a failed append fails this batch)
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
                self.stop_table(spec, exc)
            elif (record := futures[spec.name].result()) is not None:
                records.append(record)
        # One audit commit for the micro-batches' tables, not one each (200 tables: 200 commits of a
        # shared table, one at a time). Each table's commit holds its row already (reconcile).
        if records:
            self._audit(records)
        if self.cuts is not None:
            self.report.cuts = self.cuts.attempt({n: secrets.describe(e) for n, e in self.stopped.items()})
        if len(self.stopped) == len(self.specs) and not self.retry_at:
            raise AllTablesStopped

    def _parts(self, frame: DataFrame) -> DataFrame:
        """The micro-batch's parts as a DataFrame: decoded as the source read them, or by ``mapInArrow``."""
        if self._parts_frame is not None:
            return self._parts_frame
        return frame if self.source is not None else frame.mapInArrow(self.decoder, PARTS_DDL)

    def _decoded(self, frame: DataFrame, exclude: set[str] | None = None) -> list[Any]:
        """The micro-batch's parts on the driver, less those of the ``exclude`` topics (left on the executors)."""
        parts = self._parts(frame)
        if exclude:
            parts = parts.mapInArrow(_without_topics(exclude), PARTS_DDL)
        return read_parts(parts.toArrow().column("part").to_pylist())

    def _read_here(self, batch_id: int) -> list[Any] | None:
        """A small micro-batch read and decoded by the driver, without a Spark job; ``None`` when the
        reader's tasks decode it instead.

        The driver reads it when its source decodes as it reads, and the query's offsets log says
        where it starts (the batch before it ends there) and ends, and it holds fewer than
        :data:`~ingest.source.reader.MIN_PIECE` records. Such a batch is one task's work in Spark
        too; the job around it (plan, schedule, a Python worker, the parts sent back) cost about
        0.1 s on two cores, several times the reading and decoding, and shared the cores with the
        batch being applied. The first batch of a checkpoint, and larger ones, are Spark's.

        A batch read here is applied before the callback returns, not beside the next micro-batch:
        there is no decoding left to overlap. Spark's next micro-batch then takes in every record
        that arrived while this one was applied; started beside it, it would have left them for the
        one after, and waited for this apply before its own.
        """
        if self.source is None or self.checkpoint is None or batch_id == 0:
            return None
        topics = list(self.specs_by_topic)  # the tables' and the transaction topic
        last, self._last_end = self._last_end, None
        start = last[1] if last is not None and last[0] == batch_id - 1 else \
            checkpoints.batch_offsets(self.checkpoint, batch_id - 1, topics)
        end = checkpoints.batch_offsets(self.checkpoint, batch_id, topics) if start is not None else None
        if start is None or end is None:
            return None
        self._last_end = batch_id, end  # where the next batch starts (an object store's read saved)
        spans = batch_spans(start, end)
        if sum(stop - begin for _, _, begin, stop in spans) >= MIN_PIECE:
            return None
        ranges: dict[str, tuple[dict[int, int], dict[int, int]]] = {}
        for topic, partition, begin, stop in spans:
            lo, hi = ranges.setdefault(topic, ({}, {}))
            lo[partition], hi[partition] = begin, stop
        return [part for topic, (lo, hi) in ranges.items()
                for part in self.decoder.decode(self.source.read_arrow(topic, lo, hi))]

    def prefetch_schemas(self, active: list[TableSpec]) -> None:
        """Hand the executors every schema of the active topics, so they need not call the registry:
        with each micro-batch's ``mapInArrow``, or, for a reader that decodes as it reads, once in
        the decoder its stream starts with (a schema registered later, the workers fetch themselves).

        A registry the driver cannot read is not an error here: the workers then try themselves, and
        a table whose schemas stay unreachable fails its batch as before (retried, then stopped).
        """
        if self.registry is None:
            return
        for spec in active:
            try:
                found = self.registry.subject_schemas([f"{spec.topic}-key", f"{spec.topic}-value"])
            except RegistryUnavailableError as exc:
                log.warning("table %s: schemas not prefetched (%s); the executors will ask the registry",
                            spec.name, secrets.describe(exc))
                continue
            known = self.specs_by_topic[spec.topic]
            self.specs_by_topic[spec.topic] = replace(known, schemas=tuple(sorted(found.items())))
        self.decoder = BatchDecoder(self.specs_by_topic)

    def _catch_up(self, spec: TableSpec, frame: DataFrame, batch_id: int) -> bool:
        """A stopped table's next try: apply what it missed, from its Delta log's offsets to the source's end.

        Returns whether it succeeded; the table is then active again. On failure it stops again (and
        waits twice as long, if the error is transient again).
        """
        paths = TablePaths.of(self.config, spec.name)
        run = self.report.tables[spec.name]
        log.warning("table %s: trying again after %s; catching up from its Delta log", spec.name, run.error)
        try:
            source = source_for(self.config)
            start, end = backlog(source, spec, load_state(paths.table))
            for lo, hi in chunks(start, end, self.config.source.table_batch_records):
                if self.source is not None:  # a source decoding as it reads: read and decoded here
                    gap, parts = None, self.decoder.decode(self.source.read_arrow(spec.topic, lo, hi))
                else:
                    gap = source.read_range(frame.sparkSession, spec.topic, lo, hi)
                    parts = self._decoded(gap)
                record = self._apply(spec, gap, parts, batch_id, 0)
                if record is not None:
                    self.audit.append(paths.audit, [record])
        except Exception as exc:
            self.stop_table(spec, exc)
            return False
        del self.stopped[spec.name]
        self.retry_at.pop(spec.name, None)
        self._stops.pop(spec.name, None)  # a later outage waits from the first step again
        run.recovered.append(run.error or "")
        run.error, run.unavailable = None, False
        if self.metrics is not None:
            self.metrics.running(spec.name)
        log.warning("table %s: caught up and running again", spec.name)
        return True

    def apply(self, spec: TableSpec, parts: list[Any], batch_id: int, decode_ms: int) -> AuditRecord | None:
        """Apply a table's batch read and decoded on the driver, outside any micro-batch
        (:mod:`ingest.stream.driver_run`); returns its audit row, for the caller to append."""
        return self._apply(spec, None, parts, batch_id, decode_ms)

    def _apply(self, spec: TableSpec, frame: DataFrame | None, parts: list[Any], batch_id: int,
               decode_ms: int) -> AuditRecord | None:
        """Apply one table's share of the micro-batch; returns its audit row, for the caller to append."""
        paths = TablePaths.of(self.config, spec.name)
        if self.source is not None and _unavailable(parts):
            # The reader's workers could not reach the registry (no route or credentials on the
            # executors): the driver, which may, decodes the table's share itself.
            log.warning("table %s: the workers could not read the schema registry; decoding batch %d on the "
                        "driver (source.kafka.reader: spark lets the driver hand them the schemas)",
                        spec.name, batch_id)
            parts = self._redecoded(spec, frame, parts)
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
                    parts = self._redecoded(spec, frame, parts)
                fetch: Any = (self.source.fetch if self.source is not None
                              else lambda coords: fetch_raw(frame, coords))  # type: ignore[arg-type]
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

    def _redecoded(self, spec: TableSpec, frame: DataFrame | None, parts: list[Any]) -> list[Any]:
        """The table's share decoded again, for a retry: by ``mapInArrow``, or, where the source decoded
        as it read and some message found the registry unavailable, here from the same offsets read
        again."""
        if self.source is None:
            if frame is None:
                return parts
            mine = frame.filter(frame.topic == spec.topic).mapInArrow(self.decoder, PARTS_DDL)
            return read_parts(mine.toArrow().column("part").to_pylist())
        if not _unavailable(parts):
            return parts  # decoded without the registry's help, or with it: reading again changes nothing
        start: dict[int, int] = {}
        end: dict[int, int] = {}
        for part in parts:
            if part.num_rows:
                for partition, offset in zip(part.column("_cdc_partition").to_pylist(),
                                             part.column("_cdc_offset").to_pylist(), strict=True):
                    start[partition] = min(start.get(partition, offset), offset)
                    end[partition] = max(end.get(partition, offset + 1), offset + 1)
        return self.decoder.decode(self.source.read_arrow(spec.topic, start, end)) if start else parts

    def stop_table(self, spec: TableSpec, exc: BaseException) -> None:
        """The table stops; its offsets stay where its Delta log has them, and the next run resumes there."""
        self.stopped[spec.name] = exc
        if is_cancellation(exc):  # the run is being stopped: not the table's failure
            self.report.tables[spec.name].interrupted = True
            logs.event(log, "table-interrupted", f"table {spec.name}: its batch was cancelled before its commit as "
                       "the run stops; the next run applies it", table=spec.name, level=logging.WARNING)
            return
        if self.metrics is not None:
            self.metrics.stopped(spec.name, exc)
        self.report.tables[spec.name].error = secrets.redact(f"{type(exc).__name__}: {exc}")
        self.report.tables[spec.name].unavailable = is_unavailability(exc)
        if self.retry_stopped and is_transient(exc):
            self._stops[spec.name] += 1
            wait = min(RETRY_MAX_SECONDS, self.config.source.retry_stopped_seconds * 2 ** (self._stops[spec.name] - 1))
            self.retry_at[spec.name] = time.monotonic() + wait
            logs.event(log, "table-stopped", f"table {spec.name} stopped: {secrets.describe(exc)}; trying again in "
                       f"{wait:.0f} s", table=spec.name, level=logging.ERROR, retry_seconds=wait)
        else:
            self.retry_at.pop(spec.name, None)
            logs.event(log, "table-stopped", f"table {spec.name} stopped: {secrets.describe(exc)}", table=spec.name,
                       level=logging.ERROR)



def _without_topics(topics: set[str]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function that drops the parts of ``topics``."""

    def keep(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            blobs = [b for b in batch.column(0).to_pylist()
                     if not any(p.num_rows and p.column("_cdc_topic")[0].as_py() in topics for p in read_parts([b]))]
            yield pa.RecordBatch.from_pydict({"part": blobs}, schema=pa.schema([("part", pa.binary())]))
    return keep


def _unavailable(parts: list[Any]) -> bool:
    """Whether some message of the parts could not be decoded because the registry did not answer."""
    return any(part.num_rows and part_kind(part.schema) == "meta"
               and pc.any(pc.equal(part.column("_cdc_kind"), "unavailable")).as_py() for part in parts)


def _driver_registry(config: IngestConfig) -> ConfluentSchemaRegistry | None:
    """The driver's client of a Confluent-compatible registry (None for the embedded one)."""
    try:
        return confluent_registry(config)
    except RegistryUnavailableError as exc:
        log.warning("schema registry client not created on the driver (%s); the executors will ask it",
                    secrets.describe(exc))
        return None


def _failure(state: Any) -> str:
    """What a tenacity attempt failed with, for the retry's log line."""
    exc = state.outcome.exception() if state.outcome is not None else None
    return secrets.describe(exc) if exc is not None else "no exception"


def _frame_rows(parts: list[Any]) -> pa.Table:
    """The framework columns the alignment reads, of every row of ``parts``."""
    names = ["_cdc_partition", "_cdc_offset", "_cdc_position", "_cdc_txn", "_cdc_txn_order"]
    tables = [pa.Table.from_batches([part]).select(names) for part in parts if part.num_rows]
    return pa.concat_tables(tables) if tables else pa.table({n: pa.array([], FRAME.field(n).type) for n in names})


def _ends(rows: pa.Table) -> dict[int, int]:
    """Per partition, the offset after the last of ``rows``."""
    if not rows.num_rows:
        return {}
    grouped = pa.table({"p": rows["_cdc_partition"], "o": rows["_cdc_offset"]}).group_by(
        "p", use_threads=False).aggregate([("o", "max")])
    return {p: o + 1 for p, o in zip(grouped["p"].to_pylist(), grouped["o_max"].to_pylist(), strict=True)}


def _after(applied: int | None) -> int:
    return 0 if applied is None else applied + 1


def backlog(source: Catalog, spec: TableSpec, state: TableState) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition, where the table's records not applied yet start and where they end, as the source
    holds them now; the records retention took before the table applied them are said once."""
    end = source.end_offsets(spec.topic)
    first = source.start_offsets(spec.topic)
    say_retention_gap(spec, gap_of(spec.topic, state, first))
    return {p: max(first.get(p, 0), _after(state.applied_offset(spec.topic, p))) for p in end}, end


def chunks(start: dict[int, int], end: dict[int, int], limit: int) -> Iterator[tuple[dict[int, int], dict[int, int]]]:
    """``[start, end)`` per partition in pieces of about ``limit`` records, the partitions side by side."""
    pos = {p: o for p, o in start.items() if p in end}
    while live := [p for p in sorted(pos) if pos[p] < end[p]]:
        share = max(1, limit // len(live))
        stop = {p: min(end[p], pos[p] + share) for p in live}
        yield {p: pos[p] for p in live}, stop
        pos.update(stop)


def fetch_raw(frame: DataFrame, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
    """Raw key, value and timestamp of some messages of a micro-batch, read again from the source."""

    by_topic_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in coords:
        by_topic_partition.setdefault((topic, partition), []).append(offset)
    condition: Any = None
    for (topic, partition), offsets in by_topic_partition.items():
        clause = (F.col("topic") == topic) & (F.col("partition") == partition) & F.col("offset").isin(offsets)
        condition = clause if condition is None else condition | clause
    rows = frame.filter(condition).select("topic", "partition", "offset", "key", "value", "timestamp").toArrow()
    return {(t, p, o): (k, v, ts) for t, p, o, k, v, ts in zip(*(rows[c].to_pylist() for c in rows.column_names),
                                                               strict=True)}
