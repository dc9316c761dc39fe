"""Prometheus metrics of a run: per table, what it received and what became of it, its batches and
their durations, how far it trails its source, when it last committed, and whether it is stopped.

``ingest run --metrics-port N`` serves them at ``http://127.0.0.1:N/metrics`` (``--metrics-address``
binds another interface) with the Prometheus Python client, in both modes, from before the run
starts until it ends. The counters count what this process did: Prometheus' ``rate()`` and
``increase()`` take restarts in their stride. Every name starts with ``cdc_ingest_``:

* ``records_received_total{table}``; ``records_total{table,outcome}``, one series per outcome
  (inserted, updated, deleted, truncated, superseded, stale, quarantined, skipped), which add up to
  the records received, as the audit table's balance does;
* ``batches_total{table,status}``: committed, nothing-to-commit, failed;
* ``batch_duration_seconds`` and ``commit_duration_seconds{table}``: histograms;
* ``micro_batch_step_seconds{step}``: a histogram of where Spark's micro-batches spend their time,
  by the steps Spark's progress names -- ``triggerExecution`` (the whole), ``latestOffset`` (asking
  the source how far it reaches), ``walCommit`` and ``commitOffsets`` (the checkpoint's two writes),
  ``queryPlanning``, ``getBatch``, ``addBatch`` (the tables' own work) -- of every micro-batch that
  ran (a trigger that found nothing to read is left out), looked at every few seconds;
* ``lag_records{table}``: records in the topic the table's Delta log does not hold yet, from the
  source's end offsets (asked at most every few seconds, when scraped); absent while the source does
  not answer, and ``source_up`` is then 0, and for a table whose topic ends before offsets it applied
  (a recreated topic) -- never a lag of 0 that is not known;
* ``lag_seconds{table}``: at the table's last commit, its Delta commit time minus the source commit
  time of the newest change it applied;
* ``last_commit_timestamp_seconds{table}``;
* ``source_heartbeat_timestamp_seconds{topic}``: when each connector's heartbeat topic
  (``source.kafka.heartbeat_topic``) got its newest record, asked with the lag: a connector that
  stopped writes none, however quiet or busy its tables are;
* ``maintenance_failures_total{work}``: the Delta checkpoints (``checkpoint``) and packs of the
  side tables' small files (``pack``: remembered deletes, moves) done behind the batches that failed
  in this process;
  the rows are unaffected, but a lake that keeps refusing them makes reads slower;
* ``table_state{table,table_state}``: a state set -- running, or stopped and why: ``unavailable``
  (source, registry or lake did not answer; a continuous run tries again), ``quality`` (a
  ``fail``-policy expectation failed), ``schema`` (an incompatible schema change), ``conflict``
  (another writer), ``failed`` (anything else).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ingest.behind import maintenance_failures
from ingest.errors import (
    CommitConflictError,
    EnvironmentProblem,
    OffsetsConflictError,
    QualityGateError,
    SchemaIncompatibleError,
    SourceUnavailableError,
    TableLockedError,
    is_unavailability,
)
from ingest.model import ends_before
from ingest.source.catalog import newest_heartbeats

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from ingest.commit.state import TableState
    from ingest.records.audit import AuditRecord
    from ingest.source.catalog import Catalog

NAMESPACE: Final = "cdc_ingest"
#: what becomes of a received record; they add up to the records received
OUTCOMES: Final = ("inserted", "updated", "deleted", "truncated", "superseded", "stale", "quarantined", "skipped")
STATES: Final = ("running", "unavailable", "quality", "schema", "conflict", "failed")
#: seconds: a small batch on a laptop takes a fraction of one; a first catch-up, minutes
BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
#: seconds: a micro-batch's steps take from a millisecond (an idle source's offsets) up
STEP_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))
#: the source's end offsets are asked at most this often, however often Prometheus scrapes
LAG_REFRESH_SECONDS: Final = 5.0


def stop_reason(exc: BaseException) -> str:
    """The state a table stopped by ``exc`` is in (one of :data:`STATES`)."""
    if is_unavailability(exc):
        return "unavailable"
    if isinstance(exc, QualityGateError):
        return "quality"
    if isinstance(exc, SchemaIncompatibleError):
        return "schema"
    if isinstance(exc, CommitConflictError | OffsetsConflictError | TableLockedError):
        return "conflict"
    return "failed"


@dataclass(slots=True)
class _Topic:
    """A table's topic and the last offset its Delta log holds, per partition: as its state at the
    run's start has it, until the run commits a batch of the partition."""

    topic: str
    state: TableState | None = None
    applied: dict[int, int] = field(default_factory=dict)

    def last(self, partition: int) -> int:
        """The partition's last offset the Delta log holds (-1: none)."""
        if partition not in self.applied:
            found = self.state.applied_offset(self.topic, partition) if self.state is not None else None
            self.applied[partition] = -1 if found is None else found
        return self.applied[partition]


class RunMetrics:
    """The metrics of one run, in a registry of their own (two runs in one process do not mix)."""

    def __init__(self, catalog: Catalog | None = None, *, heartbeat_of: Callable[[str], str | None] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        """``catalog``: where the source's end offsets are asked (without one, no lag in records);
        ``heartbeat_of``: the heartbeat topic of the connector that writes a table's topic
        (:meth:`~ingest.config.KafkaSpec.heartbeat_topic_of`), whose newest record's time is served."""
        self.registry = registry or CollectorRegistry()
        self._catalog = catalog
        self._heartbeat_of = heartbeat_of
        self._heartbeat_topics: set[str] = set()
        self._beats: dict[str, float] = {}
        self._tables: dict[str, _Topic] = {}
        self._lock = threading.Lock()  # tables report from the applier's threads; scrapes from the server's
        self._asking = threading.Lock()
        self._ends: dict[str, dict[int, int]] | None = None
        self._ends_at = float("-inf")
        self._server: WSGIServer | None = None
        labels = ["table"]
        r, ns = self.registry, NAMESPACE
        self.received = Counter("records_received", "Records the table's batches received.", labels,
                                namespace=ns, registry=r)
        self.records = Counter("records", "What became of the records received (the outcomes add up to them).",
                               [*labels, "outcome"], namespace=ns, registry=r)
        self.batches = Counter("batches", "Table batches, by how they ended.", [*labels, "status"],
                               namespace=ns, registry=r)
        self.suspect_reads = Counter("suspect_reads", "Incremental snapshot reads that contradicted the change "
                                     "streamed before them (rows to read again).", labels, namespace=ns, registry=r)
        self.batch_seconds = Histogram("batch_duration_seconds", "A table batch's time, decode to audit row.",
                                       labels, namespace=ns, registry=r, buckets=BUCKETS)
        self.commit_seconds = Histogram("commit_duration_seconds", "A table batch's Delta commit (the MERGE).",
                                        labels, namespace=ns, registry=r, buckets=BUCKETS)
        self.micro_batch_steps = Histogram("micro_batch_step_seconds", "Spark's micro-batches: each step's "
                                           "time, as Spark's progress reports it (triggerExecution: the whole).",
                                           ["step"], namespace=ns, registry=r, buckets=STEP_BUCKETS)
        self.lag_seconds = Gauge("lag_seconds", "At the table's last commit: its Delta commit time minus the "
                                 "source commit time of the newest change it applied.", labels, namespace=ns,
                                 registry=r)
        self.last_commit = Gauge("last_commit_timestamp_seconds", "When the table last committed to Delta.",
                                 labels, namespace=ns, registry=r)
        self.state = Enum("table_state", "Running, or stopped and why.", labels, states=list(STATES),
                          namespace=ns, registry=r)
        r.register(_Source(self))
        r.register(_Maintenance())

    def track(self, table: str, topic: str, state: TableState) -> None:
        """Report on ``table`` from now on, whose Delta log is at ``state``."""
        with self._lock:
            self._tables[table] = _Topic(topic, state)
            if self._heartbeat_of is not None and (heartbeat := self._heartbeat_of(topic)) is not None:
                self._heartbeat_topics.add(heartbeat)
        self.state.labels(table).state("running")
        if state.table is not None:  # until the run commits: the table's latest commit, not none
            latest = state.table.history(1)
            if latest and latest[0].get("timestamp"):
                self.last_commit.labels(table).set(latest[0]["timestamp"] / 1000)
        self.received.labels(table)  # every series exists from the start, at 0
        self.suspect_reads.labels(table)
        for outcome in OUTCOMES:
            self.records.labels(table, outcome)

    def batch(self, record: AuditRecord) -> None:
        """A table batch ended with ``record`` (its audit row)."""
        table = record.table
        self.received.labels(table).inc(record.received)
        for outcome, count in zip(OUTCOMES, (record.inserted, record.updated, record.deleted, record.truncates,
                                             record.superseded, record.stale, record.quarantined, record.skipped),
                                  strict=True):
            if count:
                self.records.labels(table, outcome).inc(count)
        self.batches.labels(table, record.status).inc()
        if record.suspect_reads:
            self.suspect_reads.labels(table).inc(record.suspect_reads)
        self.batch_seconds.labels(table).observe(record.total_ms / 1000)
        if record.status != "committed":
            return
        self.commit_seconds.labels(table).observe(record.apply_ms / 1000)
        if record.finished_at is not None:
            self.last_commit.labels(table).set(record.finished_at.timestamp())
            if record.source_committed_at is not None:
                trailed = (record.finished_at - record.source_committed_at).total_seconds()
                self.lag_seconds.labels(table).set(max(0.0, trailed))
        with self._lock:
            tracked = self._tables.get(table)
            if tracked is not None:
                for partition, last in record.last_offsets(tracked.topic).items():
                    tracked.applied[partition] = max(last, tracked.last(partition))

    def micro_batch(self, durations_ms: Mapping[str, int]) -> None:
        """One Spark micro-batch's steps, in milliseconds by the names Spark's progress gives them."""
        for step, ms in durations_ms.items():
            self.micro_batch_steps.labels(step).observe(ms / 1000)

    def stopped(self, table: str, exc: BaseException) -> None:
        """``table`` stopped on ``exc``: a failed batch."""
        self.batches.labels(table, "failed").inc()
        self.state.labels(table).state(stop_reason(exc))

    def running(self, table: str) -> None:
        """``table`` runs again (a stopped table caught up)."""
        self.state.labels(table).state("running")

    def serve(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``address:port`` (port 0: a free one); returns the port.

        Raises:
            EnvironmentProblem: the port cannot be bound (in use, not allowed).
        """
        try:
            self._server, _ = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise EnvironmentProblem(f"metrics: cannot listen on {address}:{port} ({exc.strerror or exc})") from None
        return int(self._server.server_port)

    def close(self) -> None:
        """Stop serving (a run's end)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def heartbeats(self) -> dict[str, float]:
        """When each heartbeat topic's newest record was written, as last asked (at most every
        :data:`LAG_REFRESH_SECONDS`); a topic that does not exist or holds none is left out."""
        if self._catalog is None or self._heartbeat_of is None:
            return {}
        self._ask(self._catalog)
        with self._lock:
            return dict(self._beats)

    def _ask(self, catalog: Catalog) -> None:
        """Ask the source for its topics' end offsets and its heartbeats, unless it was asked less than
        :data:`LAG_REFRESH_SECONDS` ago."""
        with self._asking:  # one question at a time, and the tables' reports never wait for it
            if time.monotonic() - self._ends_at < LAG_REFRESH_SECONDS:
                return
            with self._lock:
                topics = sorted({t.topic for t in self._tables.values()})
                watched = sorted(self._heartbeat_topics)
            ends: dict[str, dict[int, int]] | None
            try:
                ends = {topic: catalog.end_offsets(topic) for topic in topics}
            except SourceUnavailableError:
                ends = None
            # a topic the engine may not read loses only its own sample; the lag stays
            beats = {} if ends is None else {beat.topic: beat.written for beat in newest_heartbeats(catalog, watched)
                                             if beat.written is not None}
            with self._lock:
                self._ends, self._beats = ends, beats
            self._ends_at = time.monotonic()

    def lag(self) -> tuple[dict[str, int], bool]:
        """Records each table's Delta log lacks, and whether the source answered (at most every
        :data:`LAG_REFRESH_SECONDS`; the last answer in between). A table whose topic ends before an
        offset it applied (:class:`~ingest.errors.TopicBehindTableError`) has none."""
        if self._catalog is None:
            return {}, False
        self._ask(self._catalog)
        with self._lock:
            if self._ends is None:
                return {}, False
            lags = {}
            for name, t in self._tables.items():
                ends = self._ends.get(t.topic, {})
                if ends_before(ends, t.last):
                    continue  # a topic that ends before the table is not the one it read: no lag is known
                lags[name] = sum(end - (t.last(p) + 1) for p, end in ends.items())
            return lags, True


class _Source(Collector):
    """``lag_records``, ``source_up`` and ``source_heartbeat_timestamp_seconds``, asked of the source
    when Prometheus scrapes."""

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[GaugeMetricFamily]:
        behind, answered = self.metrics.lag()
        records = GaugeMetricFamily(f"{NAMESPACE}_lag_records", "Records in the table's topic that its Delta log "
                                    "does not hold yet (absent while the source does not answer).", labels=["table"])
        for table, count in sorted(behind.items()):
            records.add_metric([table], count)
        up = GaugeMetricFamily(f"{NAMESPACE}_source_up", "Whether the source answered the last question about "
                               "its end offsets.", value=1 if answered else 0)
        beats = GaugeMetricFamily(f"{NAMESPACE}_source_heartbeat_timestamp_seconds", "When the connector wrote "
                                  "its newest heartbeat (absent: no heartbeat topic, or the source does not "
                                  "answer).", labels=["topic"])
        for topic, written in sorted(self.metrics.heartbeats().items()):
            beats.add_metric([topic], written)
        return [records, up, beats]


class _Maintenance(Collector):
    """``maintenance_failures_total{work}``: the process's background checkpoints and packs that failed
    (:func:`ingest.behind.maintenance_failed`), every kind from 0."""

    def collect(self) -> Iterable[CounterMetricFamily]:
        failures = CounterMetricFamily(f"{NAMESPACE}_maintenance_failures", "Maintenance done behind the "
                                       "batches that failed (the rows are unaffected; the next batch tries "
                                       "again): Delta checkpoints, packs of the side tables' small files.",
                                       labels=["work"])
        for work, count in maintenance_failures().items():
            failures.add_metric([work], count)
        return [failures]
