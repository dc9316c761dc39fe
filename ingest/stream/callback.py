"""One query's micro-batch on the driver: decode in the executors, then apply it table by table.

:class:`ForEachBatch` is the ``foreachBatch`` callback. It hands the executors the registry's
schemas, collects the decoded parts (never raw rows), and applies each table's share in its own
thread, with its own MERGE commit and offsets; a transient error is retried, any other stops that
table alone. A small micro-batch the driver reads and decodes itself, without a Spark job
(:meth:`ForEachBatch._read_here`). :class:`RunReport` is what a run did, table by table.

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
import time
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
from ingest.commit.state import OpenTables, load_state
from ingest.commit.writers import Writers
from ingest.config import IngestConfig, TableSpec
from ingest.cuts.publish import Publisher
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.decode.parts import PARTS_DDL, part_kind, read_parts
from ingest.decode.registry import ConfluentSchemaRegistry, confluent_registry
from ingest.errors import RegistryUnavailableError, is_transient
from ingest.heap import freeze_start_up
from ingest.lake.layout import TablePaths
from ingest.lake.location import Location
from ingest.quality import QualityGate
from ingest.records.audit import AuditRecord
from ingest.rules.rereads import SuspectReads
from ingest.source.consumer_group import GroupCommitter
from ingest.source.reader import MIN_PIECE, batch_spans
from ingest.source.sources import DecodingSource, decodes_at_read, source_for
from ingest.stream import checkpoint as checkpoints
from ingest.stream.audit_rows import AuditRows
from ingest.stream.caught_up import backlog, chunks
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
        #: the query's checkpoint, whose offsets log says where a micro-batch starts and ends (:meth:`_read_here`)
        self.checkpoint = checkpoint
        #: the last micro-batch whose offsets were read there, and where it ends (where the next starts)
        self._last_end: tuple[int, dict[str, dict[int, int]]] | None = None
        #: the micro-batches' audit rows, appended behind them (those of an interval in one commit)
        self.audit = AuditRows(config)
        self.metrics = metrics
        self.progress, self.gates = progress, gates
        #: publishes the cuts of the tables' transaction group after each micro-batch (shared by the run's queries)
        self.cuts = cuts
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
        #: what the transaction group's tables left out of their last micro-batch, to read again with the next
        self.tails = Tails(config, cuts, self.source) if cuts is not None else None
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

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        try:
            t0 = time.perf_counter()
            if self.report.startup_seconds is None:
                self.report.startup_seconds = t0 - self.report.started
            early, behind = None, False
            if self.overlap:
                # This micro-batch is decoded while the previous one is still being applied; what
                # the tables do next depends on how that ended, so it is awaited before anything else.
                # It is applied behind the callback too, unless the driver read it: that took
                # milliseconds, and leaves nothing to overlap (_read_here).
                here = self._read_here(batch_id)
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
        return self.tails.aligned(group, self.opened, frame, parts, self.decoder, self.stops.stop)

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
        if self.source is not None:
            self.source.close()

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
        log.warning("table %s: trying again after %s; catching up from its Delta log", spec.name,
                    self.report.tables[spec.name].error)
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
