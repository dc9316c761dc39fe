"""Running the configured tables: a run's start, and the answer when there is nothing to do.

A run takes its tables' locks, then asks the Delta logs and the source whether any table has a
record to read (:mod:`ingest.stream.caught_up`). When none has, it ends there, having started
neither Spark nor Great Expectations. A draining run whose backlog the driver expects to apply
within ``source.driver_seconds`` applies it there, without Spark (:mod:`ingest.stream.driver_run`);
otherwise, or for the rest of a backlog bigger than it looked, its streaming part starts
(:mod:`ingest.stream.queries`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Final

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from ingest import logs, secrets, tls
from ingest.commit.state import TableState, load_state
from ingest.config import IngestConfig, TableSpec
from ingest.cuts.publish import Publisher
from ingest.errors import (
    DecodeError,
    RegistryUnavailableError,
    SchemaRegistryError,
    SourceUnavailableError,
    TopicBehindTableError,
)
from ingest.lake import locks
from ingest.lake.layout import TablePaths
from ingest.records import audit
from ingest.source.catalog import Catalog, catalog_for
from ingest.source.discovery import with_discovered
from ingest.stream.caught_up import pending, say_no_topic, warn_retention_gap
from ingest.stream.report import RunReport, TableRun

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ingest.decode.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry
    from ingest.metrics import RunMetrics
    from ingest.quality import QualityGate
    from ingest.source.sources import Offsets
    from ingest.stream.callback import ProgressFn
    from ingest.stream.queries import Mode

log = logging.getLogger(__name__)
#: The longest pause, in seconds, between a continuous run's questions to a cluster that does not answer.
KAFKA_WAIT_MAX: Final = 30.0


class Runner:
    """Ingest the configured tables with Spark."""

    def __init__(self, config: IngestConfig, *, spark: SparkSession | None = None, full_start: bool = False,
                 metrics: RunMetrics | None = None) -> None:
        """``full_start``: start Spark and the queries even when every table is caught up (benchmarks).
        ``metrics``: where the run reports its tables' figures (:mod:`ingest.metrics`)."""
        self.config = config
        self.metrics = metrics
        self._spark = spark
        self._full_start = full_start
        self._draining = False  # whether the run under way drains its topics (the JVM's JIT follows it)
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask a run to stop its Spark queries once the micro-batch under way is taken in (Ctrl-C
        asks it too: :mod:`ingest.ctrl_c`)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was asked for."""
        return self._stop.is_set()

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds``, less if :meth:`stop` is asked for meanwhile; whether it was."""
        return self._stop.wait(seconds)

    @property
    def spark_started(self) -> bool:
        """Whether this runner has a Spark session (one given to it, or one a run of it started)."""
        return self._spark is not None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from ingest.spark.session import session_for  # Spark loads when a run needs it, not before

            self._spark = session_for(self.config, draining=self._draining)
        return self._spark

    def starting_offsets(self, specs: list[TableSpec]) -> Offsets | None:
        """Next offset per topic-partition as the tables' Delta logs record them (``None``: from the start).

        Raises:
            SourceUnavailableError: the source cannot say which partitions a topic has.
        """
        states = {s.name: load_state(TablePaths.of(self.config, s.name).table) for s in specs}
        source = catalog_for(self.config)
        for spec in specs:
            warn_retention_gap(spec, states[spec.name], source)
        if all(state.table is None for state in states.values()):
            return None
        offsets: Offsets = {}
        for spec in specs:
            state = states[spec.name]
            parts = {}
            for p in sorted(source.end_offsets(spec.topic)):
                done = state.applied_offset(spec.topic, p)
                parts[str(p)] = -2 if done is None else done + 1
            if parts:
                offsets[spec.topic] = parts
        return offsets or None

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
            SourceUnavailableError: the Kafka cluster does not answer or refuses the credentials.
            RegistryUnavailableError: a table has work and the registry of its Avro records refuses the
                credentials, or its URL leads to no registry API (asked before Spark starts).
        """
        self._draining = mode != "continuous"
        discovering = not tables and self.config.discover is not None
        source = self.config.source
        secrets.prepare([source.registry.credentials_env, *([source.kafka.credentials_env] if source.kafka else [])],
                        self.config.secrets_path)
        if source.kind == "kafka" and (mode == "continuous" or not discovering):
            self._ask_kafka(mode, stop_after)  # a continuous run waits for the cluster, discovering or not
        if discovering:
            self.config = with_discovered(self.config)  # the topics the pattern matches now
        specs = [self.config.table(n) for n in tables] if tables else list(self.config.tables)
        if source.kafka is not None and source.kafka.reader == "spark" and source.kafka.tls is not None:
            tls.check_java_key(source.kafka.tls)  # a key Spark's Java client cannot read: refused before it starts
        # One writer per table: a second run on any of these tables fails here, before Spark starts.
        held = locks.acquire_all(self.config.tables_root, [s.name for s in specs],
                                 lease_seconds=self.config.target.storage.lease_seconds)
        logs.event(log, "run-started", f"run ({mode}) of tables {', '.join(s.name for s in specs)}", mode=mode,
                   tables=[s.name for s in specs])
        try:
            started = time.perf_counter()
            states = {s.name: load_state(TablePaths.of(self.config, s.name).table) for s in specs}
            if self.metrics is not None:
                for spec in specs:
                    self.metrics.track(spec.name, spec.topic, states[spec.name])
            catalog = catalog_for(self.config)  # one client for the topics' ends and the caught-up count
            behind = self._topics_behind(specs, states, catalog)
            specs = [s for s in specs if s.name not in behind]
            report, on_driver = None, None
            if not specs:
                report = RunReport(uuid.uuid4().hex[:12], {})
            elif mode == "available_now" and not (reset_checkpoints or from_beginning or self._full_start):
                work = pending(self.config, specs, catalog, states)
                if not any(work.values()):
                    report = self._caught_up(specs, started)
                else:
                    self._ask_registry(specs)
                    # The journey loads only when some table has work (Spark's session and Great
                    # Expectations only when the driver does not apply it alone).
                    from ingest.stream.driver_run import DriverRun

                    on_driver = DriverRun(self, specs, progress) if DriverRun.wanted(self.config, specs, work) else None
                    if on_driver is not None and on_driver.run():
                        report = on_driver.report
            else:
                self._ask_registry(specs)
                self._say_missing_topics(specs)
            if report is None:
                from ingest.stream.queries import StreamingRun  # Spark and GX: only for a run that needs them

                report = StreamingRun(self).run(specs, held, mode=mode, reset_checkpoints=reset_checkpoints,
                                                from_beginning=from_beginning, progress=progress,
                                                stop_after=stop_after, discover=discovering,
                                                run_id=on_driver.report.run_id if on_driver else None)
                if on_driver is not None:  # what the driver applied before it handed the rest to Spark
                    report.add_before(on_driver.report)
            for name, error in behind.items():
                report.tables[name] = TableRun(name, error=secrets.redact(f"{type(error).__name__}: {error}"))
            report.seconds = report.seconds or time.perf_counter() - started
        finally:
            locks.release_all(held)
        received = sum(t.total("received") for t in report.tables.values())
        logs.event(log, "run-finished", f"run {report.run_id} finished in {report.seconds:.1f} s: {received} records "
                   f"received, {len(report.failed)} table(s) failed", level=logging.WARNING if report.failed
                   else logging.INFO, run=report.run_id, seconds=round(report.seconds, 3), received=received,
                   batches=sum(len(t.batches) for t in report.tables.values()), caught_up=report.caught_up,
                   failed=sorted(report.failed))
        return report

    def _topics_behind(self, specs: list[TableSpec], states: dict[str, TableState], catalog: Catalog
                       ) -> dict[str, TopicBehindTableError]:
        """The tables whose topic ends before offsets they applied (:class:`TopicBehindTableError`): each stops at
        the start, in one line, and the others run. A source that does not answer is left to the run,
        which meets it as it always has."""
        behind = {}
        for spec in specs:
            state = states[spec.name]
            if state.table is None:
                continue
            try:
                ends = catalog.end_offsets(spec.topic)
            except SourceUnavailableError:
                break
            if ends_before := state.ends_before(spec.topic, ends):
                behind[spec.name] = error = TopicBehindTableError(spec.name, spec.topic, ends_before)
                if self.metrics is not None:
                    self.metrics.stopped(spec.name, error)
                logs.event(log, "table-stopped", f"table {spec.name} stopped: {error}", table=spec.name,
                           level=logging.ERROR)
        return behind

    def _ask_kafka(self, mode: Mode, stop_after: float | None = None) -> None:
        """One question to the cluster before Spark starts (a draining run's discovery asks it instead): a refused
        login or TLS handshake fails here in seconds with librdkafka's reason, not after Spark's Kafka
        source has waited out its own timeouts and the query's restarts. So does a cluster that does
        not answer a run that drains (a scheduler starts the next one); a continuous run waits for
        it instead, as it rides out an outage once running (docs/operations.md), saying so now and then,
        for ``stop_after`` seconds at most (``None``: until the cluster answers or the run is stopped).

        Raises:
            SourceUnavailableError: the cluster refused the run, did not answer a draining run, or did
                not answer a continuous run within ``stop_after``.
        """
        catalog = catalog_for(self.config)
        if mode != "continuous":
            catalog.topics()
            return

        def warn(state: RetryCallState) -> None:  # at first, then at every longest pause
            if state.attempt_number == 1 or (state.next_action and state.next_action.sleep >= KAFKA_WAIT_MAX):
                failure = state.outcome.exception() if state.outcome else None
                log.warning("%s; the continuous run waits for the cluster (asking every %.0f s at most)",
                            failure, KAFKA_WAIT_MAX)

        def pause(seconds: float) -> None:  # ``stop()`` ends it at once, and the wait after one more question
            self.pause(seconds)

        Retrying(stop=lambda state: self.stopping or (stop_after is not None and state.idle_for >= stop_after),
                 wait=wait_exponential(max=KAFKA_WAIT_MAX), sleep=pause, before_sleep=warn, reraise=True,
                 retry=retry_if_exception(lambda exc: isinstance(exc, SourceUnavailableError) and not exc.refused),
                 )(catalog.topics)

    def _ask_registry(self, specs: list[TableSpec]) -> None:
        """A question to the registry of Avro records before Spark starts: a refused login, or a URL
        without the registry's API, fails the run here, in a second, with the registry's answer,
        instead of after the session's start and the first batch's retries. A registry that does not
        answer (or answers 5xx) is an outage, which the run rides out as any other
        (docs/operations.md): it goes on, with a warning. The question is the newest schema of each
        table that names columns, and a column it lacks is said at once (:func:`_say_missing_columns`).

        Raises:
            RegistryUnavailableError: the registry refused the credentials (HTTP 401 or 403), or its URL
                leads to no registry API (HTTP 404 without the registry's error code).
        """
        if self.config.source.value_format != "avro" or not specs:
            return
        from ingest.decode.registry import driver_registry  # its client: only for a run with work

        # each table that names columns is asked about them; without one, the first table (a subject
        # not registered yet is an answer too)
        asked = [spec for spec in specs if spec.named_columns()] or specs[:1]
        try:
            registry = driver_registry(self.config)
            for spec in asked:
                _say_missing_columns(spec, registry)
        except RegistryUnavailableError as exc:
            if exc.refused:
                raise
            log.warning("the schema registry did not answer at the start (%s); the run goes on and its tables "
                        "wait for it", secrets.describe(exc))

    def _say_missing_topics(self, specs: list[TableSpec]) -> None:
        """Warn about each table whose topic does not exist (a source that does not answer just now is
        left to the stream, which waits for it)."""
        try:
            topics = set(catalog_for(self.config).topics())
        except SourceUnavailableError:
            return
        for spec in specs:
            if spec.topic not in topics:
                say_no_topic(spec)

    def _caught_up(self, specs: list[TableSpec], started: float) -> RunReport:
        """The report of a run whose tables hold every record of their topics: nothing started, nothing
        read; only audit rows a crash left unwritten are restored, as any run's start does, and a cut
        that an END record read since allows is published."""
        for spec in specs:
            self.restore_audit(spec)
        report = RunReport(uuid.uuid4().hex[:12], {s.name: TableRun(s.name) for s in specs}, caught_up=True)
        cuts = self.cuts_publisher(specs, report.run_id)
        if cuts is not None:
            report.cuts = cuts.attempt()
        report.seconds = time.perf_counter() - started
        return report

    def cuts_publisher(self, specs: list[TableSpec], run_id: str) -> Publisher | None:
        """The publisher of the configuration's cuts, if it has a transaction group and this run holds
        every table of it (a run of some of them leaves cuts to a run of all)."""
        group = {s.name for s in self.config.consistent_tables()}
        if not group or not group <= {s.name for s in specs}:
            return None
        return Publisher(self.config, run_id)

    def restore_audit(self, spec: TableSpec) -> None:
        """Write the audit rows a crash left unwritten, from the table's commit info (every run's start)."""
        paths = TablePaths.of(self.config, spec.name)
        restored = audit.reconcile(paths.audit, spec.name, paths.table)
        if restored:
            log.warning("table %s: restored %d audit rows from the Delta commit info", spec.name, restored)

    def quality_gates(self, specs: list[TableSpec]) -> dict[str, QualityGate]:
        """Load and check every table's suite now (start-up), before any query runs."""
        from ingest.stream.queries import StreamingRun  # Great Expectations: loaded when asked for

        return StreamingRun(self).quality_gates(specs)


def _say_missing_columns(spec: TableSpec, registry: ConfluentSchemaRegistry | EmbeddedSchemaRegistry) -> None:
    """Warn when ``spec`` names a column the newest Avro schema of its topic lacks (as ``ingest check``
    finds it): a misspelled key sends every change to quarantine. A schema that is not a change's is
    left to the table's batches; JSON topics are ``ingest check``'s only (their columns are in the records).

    Raises:
        RegistryUnavailableError: the registry did not answer, or refused.
    """
    from ingest.decode.avro import newest_row_columns  # fastavro: only for a run with work

    try:
        columns = newest_row_columns(registry, spec.topic)
    except (DecodeError, SchemaRegistryError):
        return
    if columns is not None and (missing := spec.not_in(columns)):
        then = ("; a change without its key columns goes to quarantine" if spec.primary_key
                and any(c not in columns for c in spec.primary_key) else "")
        log.warning("table %s: %s, not in the newest schema under %s-value (its columns: %s)%s (see "
                    "ingest check)", spec.name, "; ".join(missing), spec.topic, ", ".join(columns), then)
