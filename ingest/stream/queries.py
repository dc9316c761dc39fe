"""The streaming loop: a few Spark Structured Streaming queries for many tables, one commit per table and batch.

The tables share a bounded number of queries (``source.queries``, one by default): a query reads all
its tables' topics, its executors decode every micro-batch once (:mod:`ingest.decode.columnar`), and
the driver applies it table by table (:mod:`ingest.apply`), each table with its own MERGE commit and
its own offsets (:mod:`ingest.stream.callback`, the ``foreachBatch`` callback). Cost follows the data, not
the number of tables.

What one query per table used to give stays:

* **A failing table stops alone.** A table whose batch fails is retried when the error is
  transient (:func:`ingest.errors.is_transient`: a registry or broker that does not answer, a
  concurrent commit) and otherwise stops; the others go on committing.
* **Every table resumes from its own Delta log.** A query starts from the offsets its tables'
  Delta logs record (``startingOffsets``), so a lost Spark checkpoint means neither duplicates nor
  gaps nor a full re-read. A checkpoint that claims more than some table applied -- a table that
  stopped while the shared query moved on -- is discarded, and the query resumes from the Delta
  logs; what the other tables already have is recognised by their app transactions and skipped.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ingest import secrets
from ingest.commit.state import load_state
from ingest.config import TableSpec
from ingest.ctrl_c import FirstCtrlC
from ingest.errors import engine_error_in, first_line, is_cancellation, is_unavailability, shortened, unavailability_in
from ingest.lake import locks
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath
from ingest.quality import QualityGate
from ingest.quality.suites import gx_context
from ingest.source.catalog import catalog_for
from ingest.source.discovery import with_discovered
from ingest.source.sources import LATEST, Offsets, read_topics
from ingest.spark.session import spark_location
from ingest.stream import checkpoint as checkpoints
from ingest.stream.callback import AllTablesStopped, ForEachBatch, ProgressFn
from ingest.stream.report import RunReport, TableRun

if TYPE_CHECKING:
    from ingest.metrics import RunMetrics
    from ingest.stream.runner import Runner

log = logging.getLogger(__name__)
_START_ATTEMPTS = 3  # restarts of a query that dies before its first batch (see StreamingRun._restart_failed)
_UNAVAILABLE_WAIT = 30.0  # at most this many seconds between starts of a continuous query whose source did not answer
_SOURCE_INIT_WAIT = 30.0  # seconds to let one query's source start before starting the next
_PROGRESS_EVERY = 5.0  # seconds between two looks at the queries' progress, for the metrics
#: seconds between two looks at the queries: a draining run ends as soon as its queries did
_LOOK_EVERY: dict[str, float] = {"continuous": 0.5, "available_now": 0.1}
Mode = Literal["available_now", "continuous"]


def query_name(specs: list[TableSpec]) -> str:
    """A query's name and checkpoint directory: its tables' names (a digest of them when they are many)."""
    names = "+".join(sorted(s.name for s in specs))
    if len(names) <= 100:
        return names
    return f"tables-{len(specs)}-{hashlib.sha1(names.encode(), usedforsecurity=False).hexdigest()[:10]}"


def query_groups(specs: list[TableSpec], queries: int) -> list[list[TableSpec]]:
    """The tables dealt to ``queries`` queries in turn (never more queries than tables)."""
    count = max(1, min(queries, len(specs)))
    return [g for g in (specs[i::count] for i in range(count)) if g]


@dataclass(slots=True)
class _Query:
    name: str
    specs: list[TableSpec]
    directory: LakePath
    handler: ForEachBatch
    starting: Offsets | None
    query: Any = None
    restarts: int = 0  # restarts since it last ran a batch
    batches_seen: int = 0  # its handler's batches at its last restart
    reported: int = -1  # the last micro-batch of ``query`` whose progress went to the metrics
    ended: bool = False  # it failed and is not started again

    def report_progress(self, metrics: RunMetrics) -> None:
        """Hand the metrics the steps' durations of the micro-batches Spark ran since the last call
        (from Spark's recent progress, which keeps the last 100 by default). A trigger that found
        nothing to read reports progress too, without ``addBatch``: it is left out."""
        for progress in self.query.recentProgress:
            if progress.batchId > self.reported and "addBatch" in progress.durationMs:
                metrics.micro_batch(progress.durationMs)
                self.reported = progress.batchId


class StreamingRun:
    """A run's streaming part: its tables' quality gates, queries and their micro-batches, for a
    :class:`~ingest.stream.runner.Runner` that found work and holds the tables' locks."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def spark_and_quality_gates(self, specs: list[TableSpec], *, spark_started: Callable[[], None]
                                ) -> dict[str, QualityGate]:
        """Start Spark and return the tables' quality gates, with Great Expectations' import and
        context (seconds) made in a thread while Spark's JVM starts (seconds): the two starts overlap
        instead of adding up. ``spark_started`` is called as soon as Spark is up."""
        with ThreadPoolExecutor(1, thread_name_prefix="gx-start") as pool:
            ready = pool.submit(gx_context) if any(spec.expectations for spec in specs) else None
            _ = self.runner.spark
            spark_started()
            if ready is not None:
                ready.result()
        return self.quality_gates(specs)

    def quality_gates(self, specs: list[TableSpec]) -> dict[str, QualityGate]:
        """Load and check every table's suite now (start-up), before any query runs."""
        gates = {}
        for spec in specs:
            spark = self.runner.spark if self.runner.config.validates_on_spark(spec) else None
            gate = QualityGate.at_start(self.runner.config, spec, spark=spark)
            if gate is not None:
                gates[spec.name] = gate
        return gates

    def run(self, specs: list[TableSpec], held: list[locks.WriterLock], *, mode: Mode, reset_checkpoints: bool,
            from_beginning: bool, progress: ProgressFn | None, stop_after: float | None, discover: bool,
            run_id: str | None = None) -> RunReport:
        """Start Spark, the quality gates and the queries, and watch the queries to their end.

        ``run_id``: the run's, when the driver began it (:mod:`ingest.stream.driver_run`); else a new
        one. Ctrl-C while the run starts lets the start finish and starts no query; cut short, the
        start printed py4j's tracebacks (and Spark's launch, its JVM left behind: see
        :mod:`ingest.ctrl_c`).
        """
        starting = FirstCtrlC("interrupted while the run starts: it ends once Spark has started, before any "
                              "micro-batch (Ctrl-C again: at once)", on_press=self.runner.stop)
        try:
            # reclaim: Ctrl-C is the start's again, not PySpark's, whose context put its handler in place
            gates = self.spark_and_quality_gates(specs, spark_started=starting.reclaim)
            return self._run(specs, gates, held, mode=mode, reset_checkpoints=reset_checkpoints,
                             from_beginning=from_beginning, progress=progress, stop_after=stop_after,
                             discover=discover, run_id=run_id, starting=starting)
        finally:
            starting.restore()

    def _run(self, specs: list[TableSpec], gates: dict[str, QualityGate], held: list[locks.WriterLock], *,
             mode: Mode, reset_checkpoints: bool, from_beginning: bool, progress: ProgressFn | None,
             stop_after: float | None, discover: bool, run_id: str | None, starting: FirstCtrlC) -> RunReport:
        run_id = run_id or uuid.uuid4().hex[:12]
        report = RunReport(run_id, {s.name: TableRun(s.name) for s in specs})
        started = time.perf_counter()
        cuts = self.runner.cuts_publisher(specs, run_id)  # one for the run: its queries share the group

        def launch(group: list[TableSpec], *, fresh: bool = False) -> _Query | None:
            if self.runner.stopping:  # interrupted while the run starts
                return None
            name = query_name(group)
            directory = self.runner.config.checkpoint_location / name
            try:  # the store may fail here too (an outage longer than storage.retry_seconds)
                for spec in group:
                    self.runner.restore_audit(spec)
                if reset_checkpoints or from_beginning or fresh:
                    checkpoints.discard(directory)
                self._check_checkpoint(group, directory)
                handler = ForEachBatch(self.runner.config, group, report, run_id, progress, gates,
                                       retry_stopped=mode == "continuous", cuts=cuts, metrics=self.runner.metrics,
                                       checkpoint=directory)
                if handler.tails is not None and mode == "available_now":
                    catalog = catalog_for(self.runner.config)
                    grouped = {g.name for g in handler.tails.cuts.group}
                    handler.tails.final_ends = {s.topic: catalog.end_offsets(s.topic) for s in group
                                                if s.name in grouped}
                q = _Query(name, group, directory, handler, None)
                q.starting = None if from_beginning else self.runner.starting_offsets(group)
                q.query = self._start(q, mode, run_id)
                return q
            except Exception as exc:
                for spec in group:
                    report.tables[spec.name].error = secrets.redact(f"could not start: {exc}")
                    report.tables[spec.name].unavailable = is_unavailability(exc)
                return None

        def pick_up() -> list[_Query]:
            """The tables of topics that appeared since the run started, in a query of their own."""
            try:
                before = {t.name for t in self.runner.config.tables}
                self.runner.config = with_discovered(self.runner.config)
                new = [t for t in self.runner.config.tables if t.name not in before]
                if not new:
                    return []
                gates.update(self.quality_gates(new))
                held.extend(locks.acquire_all(self.runner.config.tables_root, [t.name for t in new],
                                              lease_seconds=self.runner.config.target.storage.lease_seconds))
            except Exception as exc:  # the running tables go on; the next look tries again
                log.warning("looking for new topics failed: %s", secrets.describe(exc))
                return []
            log.info("new topics: starting tables %s", ", ".join(t.name for t in new))
            for spec in new:
                report.tables[spec.name] = TableRun(spec.name)
            # Its own checkpoint is from an earlier run with other tables, if any: the Delta logs know better.
            q = launch(new, fresh=True)
            return [q] if q is not None else []

        queries = [q for group in query_groups(specs, self.runner.config.source.queries) if (q := launch(group))]
        refresh = self.runner.config.discover.refresh_seconds if discover and self.runner.config.discover else None
        starting.restore()  # the watch has its own
        self._await(queries, report, mode, stop_after, run_id,
                    pick_up=pick_up if refresh is not None and mode == "continuous" else None, refresh=refresh)
        if cuts is not None:  # an END record may have come after the last batch
            report.cuts = cuts.attempt({n: t.error for n, t in report.tables.items() if t.error})
        report.seconds = time.perf_counter() - started
        return report

    def _start(self, q: _Query, mode: Mode, run_id: str) -> Any:
        """Start a query; a checkpoint Spark cannot start from is discarded and the start retried."""
        try:
            return self._start_query(q, mode, run_id)
        except Exception as exc:
            if not checkpoints.exists(q.directory):
                raise
            log.warning("query %s: Spark cannot start from checkpoint %s (%s); discarding it and resuming "
                        "from the offsets in the tables' Delta logs", q.name, q.directory, secrets.describe(exc))
            checkpoints.discard(q.directory)
            return self._start_query(q, mode, run_id)

    def _start_query(self, q: _Query, mode: Mode, run_id: str) -> Any:
        decoder = None
        if q.handler.read.source is not None:  # the reader decodes: its decoder starts with the schemas known now
            q.handler.read.prefetch_schemas(q.specs)
            decoder = q.handler.read.decoder
        starting = q.starting
        if starting is not None and q.handler.extra_topics:  # read from now on: they only wake the query
            starting = {**starting, **{t: {"0": LATEST} for t in q.handler.extra_topics}}
        stream = read_topics(self.runner.spark, self.runner.config, [s.topic for s in q.specs] + q.handler.extra_topics,
                             starting_offsets=starting, decoder=decoder)
        writer = (stream.writeStream.foreachBatch(q.handler)
                  .option("checkpointLocation", spark_location(self.runner.spark, q.directory))
                  .queryName(f"cdc_{q.name}_{run_id}"[:200]))
        writer = (writer.trigger(availableNow=True) if mode == "available_now"
                  else writer.trigger(processingTime=f"{round(self.runner.config.source.trigger_seconds * 1000)} "
                                      "milliseconds"))
        query = writer.start()
        # Start the queries one after another: each spawns a Python source runner that must connect
        # back to the JVM within 10 s, which several at once on a busy machine can miss.
        _await_sources(query, unless=lambda: self.runner.stopping)
        return query

    def _check_checkpoint(self, specs: list[TableSpec], directory: LakePath) -> None:
        """Discard a checkpoint that is damaged or claims more progress than a table has (ingest.stream.checkpoint)."""
        topics = {}
        audit_path = None
        for spec in specs:
            paths = TablePaths.of(self.runner.config, spec.name)
            state = load_state(paths.table)
            topics[spec.topic] = ((lambda p, state=state, topic=spec.topic: state.applied_offset(topic, p)),
                                  spec.name)
            audit_path = paths.audit
        group = self.runner.config.source.transactions
        others = [group.topic] if group is not None else []  # read to wake the query (ForEachBatch.extra_topics)
        verdict = checkpoints.inspect(directory, topics=topics, audit_path=audit_path, others=others)
        if not verdict.ok:
            log.warning("query %s (tables %s): Spark checkpoint %s cannot be trusted (%s); discarding it and "
                        "resuming from the offsets in the tables' Delta logs", directory.name,
                        ", ".join(s.name for s in specs), directory, verdict.problem)
            checkpoints.discard(directory)

    def _restart_failed(self, q: _Query, mode: Mode, run_id: str) -> bool:
        """Start a failed query again if it failed for a reason outside our code.

        Before its first batch, such a failure is an unusable checkpoint or a transient start failure
        (Spark gives a Python source runner 10 s to connect back, which a loaded machine can miss).
        Nothing was committed, so starting again from the Delta logs' offsets, without the
        checkpoint, is always safe; it is tried a few times. In continuous mode, a query that found
        the source, registry or lake not answering (a broker restarting), before or after its first
        batch, is started again until they answer or the run is stopped; after batches it resumes
        from its checkpoint, once the batch still being applied is done.
        """
        failure = str(q.query.exception() or "unknown error")
        if q.handler.error is not None:
            # the tables' errors say what the batch failed with; this says why the run ends with them
            log.warning("query %s: not started again: its micro-batch failed (%s), and then the query (%s)",
                        q.name, secrets.describe(q.handler.error), _short(failure))
            return False
        outside = unavailability_in(failure) if mode == "continuous" else None
        if q.handler.batches and outside is None:
            return False
        if q.handler.batches != q.batches_seen:  # it ran since its last restart: a new outage
            q.restarts, q.batches_seen = 0, q.handler.batches
        q.restarts += 1
        if q.restarts > _START_ATTEMPTS and outside is None:
            return False
        wait = min(2.0 * q.restarts, _UNAVAILABLE_WAIT)
        if outside is not None:
            log.warning("query %s: %s; starting it again in %.0f s", q.name, secrets.redact(outside), wait)
        else:
            log.warning("query %s: it failed before its first batch (%s); restarting it from the offsets in the "
                        "Delta logs, without its Spark checkpoint (attempt %d of %d)", q.name,
                        _short(failure), q.restarts, _START_ATTEMPTS)
        if self.runner.pause(wait):
            return False
        try:
            q.handler.settle()  # a batch applied in the background: it must have committed
            if not q.handler.batches:
                checkpoints.discard(q.directory)
            q.query, q.reported = self._start_query(q, mode, run_id), -1
            return True
        except Exception as exc:  # the original failure stays the tables' error (or the batch's, now)
            log.warning("query %s: the restart failed too: %s", q.name, secrets.describe(exc))
            return False

    def _watch(self, queries: list[_Query], mode: Mode, stop_after: float | None, run_id: str, *,
               pick_up: Callable[[], list[_Query]] | None, refresh: float | None) -> None:
        """Look after the queries until they end (a draining run's, once they read what was there), the
        run is stopped (Ctrl-C, SIGTERM, :meth:`Runner.stop`) or ``stop_after`` seconds passed; then
        stop them between micro-batches: the one under way commits, no Spark job of it is cancelled.

        A query that failed is started again where :meth:`_restart_failed` says so, and otherwise left
        ended. With ``pick_up`` (discovery) a continuous run goes on without any query, waiting for
        topics to appear.
        """
        metrics = self.runner.metrics
        deadline = time.monotonic() + stop_after if stop_after else None
        next_look = time.monotonic() + (refresh or 0)
        next_progress = time.monotonic() + _PROGRESS_EVERY
        ctrl_c = FirstCtrlC("interrupted: the micro-batch under way finishes, then the queries stop (Ctrl-C "
                            "again: at once, cancelling it before its commit; the next run applies it)",
                            on_press=self.runner.stop)
        at_once = False
        try:
            while True:
                restarted = False
                for q in queries:
                    if not q.ended and not q.query.isActive and q.query.exception() is not None:
                        q.ended = not self._restart_failed(q, mode, run_id)
                        restarted = restarted or not q.ended
                # A query started again may have failed already: it is looked at again.
                if pick_up is None and not restarted and not any(q.query.isActive for q in queries):
                    break
                if self.runner.stopping or (deadline and time.monotonic() > deadline):
                    break
                if pick_up is not None and refresh and time.monotonic() >= next_look:
                    queries.extend(pick_up())
                    next_look = time.monotonic() + refresh
                if metrics is not None and time.monotonic() >= next_progress:
                    for q in queries:
                        q.report_progress(metrics)
                    next_progress = time.monotonic() + _PROGRESS_EVERY
                self.runner.pause(_LOOK_EVERY[mode])
        except KeyboardInterrupt:  # a second Ctrl-C
            at_once = True
        finally:
            ctrl_c.restore()  # PySpark's, which cancels every Spark job
        if not at_once:
            try:
                for q in queries:
                    q.handler.take_no_more()
                for q in queries:  # stopped amid it, the query's source runner printed a traceback
                    _await_sources(q.query)
            except KeyboardInterrupt:
                at_once = True
        if at_once:
            log.warning("interrupted again: stopping the queries now")
        for q in queries:
            if q.query.isActive:
                q.query.stop()
            if q.handler.passed:  # the tables' Delta logs say what was applied; the next run resumes there
                checkpoints.discard_or_warn(q.directory, f"query {q.name}",
                                            "it claims a micro-batch its tables did not apply; the next run "
                                            "discards it")

    def _await(self, queries: list[_Query], report: RunReport, mode: Mode, stop_after: float | None,
               run_id: str, *, pick_up: Callable[[], list[_Query]] | None = None,
               refresh: float | None = None) -> None:
        """Watch the queries until they end or are stopped, then take in their outcomes: a failure
        goes to the report as its tables' error."""
        self._watch(queries, mode, stop_after, run_id, pick_up=pick_up, refresh=refresh)
        for q in queries:
            failure: Exception | None = None
            try:
                q.query.awaitTermination()  # ended or stopped: at once, raising what it failed with
            except Exception as exc:
                failure = exc
            if self.runner.metrics is not None:
                q.report_progress(self.runner.metrics)
            try:
                q.handler.settle()  # the last micro-batch may still be being applied
            except Exception as exc:
                failure = failure or exc
            finally:
                q.handler.close()
            if failure is None:
                continue
            real = q.handler.error
            if isinstance(real, AllTablesStopped):
                continue  # every table has its own error already
            if is_cancellation(real or failure):
                continue  # the run was stopped mid-batch (Ctrl-C): no table failed, the next run applies it
            outside = None if real else unavailability_in(str(failure))
            text = f"{type(real).__name__}: {real}" if real else (
                outside or engine_error_in(str(failure)) or _short(failure))
            for spec in q.specs:
                if not report.tables[spec.name].error:
                    report.tables[spec.name].error = secrets.redact(text)
                    report.tables[spec.name].unavailable = is_unavailability(real or failure) or outside is not None


def _await_sources(query: Any, *, unless: Callable[[], bool] = lambda: False) -> None:
    """Return once ``query`` has initialized its sources (or ended), after :data:`_SOURCE_INIT_WAIT`
    seconds at most, or as soon as ``unless()``.

    A query stopped while it initializes them is interrupted amid its exchange with the Python
    source runner, and the interrupt closes their connection: the runner, reading its next command,
    printed an ``EOFError`` traceback and a ``BrokenPipeError`` one (a Ctrl-C while the run starts).
    """
    deadline = time.monotonic() + _SOURCE_INIT_WAIT
    while (query.isActive and query.status["message"] == "Initializing sources" and time.monotonic() < deadline
           and not unless()):
        time.sleep(0.05)


def _short(exc: BaseException | str) -> str:
    return shortened(secrets.redact(first_line(exc)), 500)  # redacted whole: a cut secret would not match
