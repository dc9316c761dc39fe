"""Continuous-mode latency on the real stack: PostgreSQL commit -> row visible in Delta, and where it goes.

Not a test: it measures. Per table set (``one``: the engine ingests ``order_items`` alone; ``shop``:
the four shop tables), per target rate (default 500 and 2,000 row changes/s) and per run (default
three), on a fresh schema (``benchlat``) and fresh tables:

1. reset the schema and its topics, write a small catalog (customers, products);
2. start ``ingest run --continuous`` on the stack (Avro through the registry's basic-auth port, or
   ``--format json``) and wait until it has caught up with the catalog; the topics then keep the
   broker's append time as their records' timestamps (``message.timestamp.type=LogAppendTime``);
3. run the load generator (:class:`harness.postgres.load.LoadGenerator`) in ``ceil(rate / per-generator)``
   processes, each with its own connection, for ``warmup + measure`` seconds, while the stack's
   connector for the other format is paused until step 4 is done (a deployment captures its tables
   once; two connectors would share the cores);
4. wait until Debezium has captured everything and the tables have applied their topics (the
   backlog, if the engine fell behind, is drained and timed), then stop the engine;
5. report the achieved source rate (changes PostgreSQL committed / load seconds), the engine's
   throughput (Kafka records the engine received per second in the measurement window, from the
   audit), and the latency p50/p95/p99 of every ``order_items`` row (inserted, never updated by the
   generator) whose source commit fell in the measurement window:
   ``commit time of the first Delta version holding the row's offset - _cdc_source_ts``
   (:mod:`harness.latency`);
6. split each of those rows' latency into stages (capture, broker, waiting for the trigger, decode,
   plan, apply + commit) from the times its change carried: the envelope's and the Kafka record's,
   read back from the topic, and the audit record of the commit that made it visible
   (:func:`harness.latency.stages_of`), and report each stage's median;
7. report where Spark's micro-batches spent their time in the window, step by step as Spark's
   progress names them (the engine's ``cdc_ingest_micro_batch_step_seconds``, scraped from its
   ``--metrics-port`` as the window opens and as it closes: each step's mean; ``-`` for an engine
   that does not serve it);
8. report the full garbage collections of the engine's driver and of its Spark Python workers in the
   window (:mod:`gc_probe`, loaded by the engine's ``PYTHONPATH``): how many a second, their mean
   time, and the share of each process's window they paused it for; and every collection of the
   stack's Kafka and Connect (:mod:`harness.stack.gclog`: each stops its server, and the changes in
   it wait), with the longest.

Each run checks the freshness goal, p50 at most the trigger interval plus the median batch time (the
``order_items`` journey's ``total_ms``), and reports p99/p50 (its goal: at most 1.5) and whether p99
is at most p50 plus the interval plus the median batch (the slowest changes waited at most one more
interval and batch than the median one). The interval
is measured: the median time between the starts of the window's consecutive batches. It is the
trigger's while a micro-batch fits in the trigger; when one outlasts it, Spark starts the next at
once, and the interval is the micro-batch's own time (the trigger is in the table beside it); its
95th percentile is shown too, and the part of it outside the tables' journey: the time from a
table's Delta commit to its next batch's start (the callback's work after the commit, Spark's own
steps between micro-batches, the next batch's read and decode). The
median batch time and the rows a batch's commit copied unchanged (copy-on-write) are also shown for
the first and the last tenth of the window's batches: a batch that costs more as its table grows
shows there. So are the batches at whose version a Delta checkpoint was written (every
``delta.checkpointInterval`` commits; inside the commit, or after it where the writer does that):
how many, and their median time beside that of their neighbours (the batches within five versions);
and alike the batches during which the table's remembered deletes were packed (a compaction of
``_cdc_tombstones/order_items`` committed between the batch's start and end).
The measured connector runs with Debezium's ``poll.interval.ms`` at 50 ms (the stack's keep
Debezium's 500 ms: see ``docs/operations.md``); ``--poll-ms 500,50`` runs each case once per value,
taking turns, and the connector is registered as the stack configures it at the end.
``--engine-cpus all,1`` runs each case once per value, taking turns: ``all`` leaves the scheduler alone;
a CPU list (``1``, ``2-3``, ``0+2``) puts the engine (its Python driver, its JVM and its Python workers) on those
CPUs and every other process of the machine -- the stack, the load generators, this script -- on the
rest, for the run; the figures then show what the changes wait for when the engine does not share its
cores with the stack and the load.
``--baseline REV`` runs each case also with the engine of an earlier commit (checked out beside, in
the work directory), taking turns with this checkout's: everything else -- the stack, the load and
the measurement -- is this checkout's. The figures go to a result file (``benchmarks/results/``) for
``docs/benchmarks.md``.

    make bench-latency
    .venv/bin/python benchmarks/bench_latency.py --tables one --rates 500 --runs 1 --measure 30
    .venv/bin/python benchmarks/bench_latency.py --rates 500 --trigger 0.25  # a short trigger
    .venv/bin/python benchmarks/bench_latency.py --tables one --rates 500 --poll-ms 500,50   # Debezium's poll
    .venv/bin/python benchmarks/bench_latency.py --rates 500 --trigger 0.25 --baseline HEAD~1  # an engine change
    .venv/bin/python benchmarks/bench_latency.py --tables one --rates 500 --engine-cpus all,1  # cores not shared
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml
from harness.cpu import cpu_shares, cpu_ticks
from harness.latency import (
    STAGES,
    CommitIndex,
    checkpoint_versions,
    compaction_times,
    latencies_of,
    measured_rows,
    nearest_rank,
    stages_of,
)
from harness.postgres.load import LoadGenerator, LoadReport
from harness.postgres.workload import WorkloadSpec, run_workload
from harness.stack.gclog import Pauses, pauses
from harness.stack_proofs.setup import engine_environment, reset_source, stack_config
from harness.torture.process import IngestProcess
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from ingest.config import IngestConfig, load_config
from ingest.decode.columnar import DecoderSpec
from ingest.lake.layout import TablePaths
from ingest.ops.verify_source import wait_for_tables
from ingest.records import audit
from ingest.source.kafkalog import KafkaLog
from ingest.verify.capture import wait_for_capture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_meter import descendants
from gc_probe import Collections, collections, environment
from record import Figure, changed_options, write_result

ROOT = Path(__file__).resolve().parent.parent
console = Console(width=170)  # the table is the result: never wrapped to a pipe's 80 columns
SCHEMA = "benchlat"
#: The table sets: the engine ingests the table measured alone, or with the other shop tables.
TABLE_SETS = {"one": ("order_items",), "shop": ("customers", "products", "orders", "order_items")}
#: The stack's PostgreSQL connector of each format (infra/stack/connectors/): the one measured; the other
#: captures the same tables in the other format.
MEASURED_CONNECTOR = {"avro": "pgavro", "json": "pgjson"}
OTHER_CONNECTOR = {"avro": MEASURED_CONNECTOR["json"], "json": MEASURED_CONNECTOR["avro"]}
#: The steps of a Spark micro-batch, in the order they come, as its progress names them.
SPARK_STEPS = ("latestOffset", "walCommit", "queryPlanning", "getBatch", "addBatch", "commitOffsets",
               "triggerExecution")
_STEP_METRIC = "cdc_ingest_micro_batch_step_seconds"
#: The stack's Java servers a change passes through, whose garbage-collection pauses the run counts.
STACK_JVMS = ("kafka", "connect")


@dataclass(frozen=True)
class Engine:
    """The engine a run starts: this checkout's, or an earlier commit's checked out at ``path``."""

    name: str
    path: Path | None = None

    @property
    def cwd(self) -> Path | None:
        """The engine's working directory (``None``: this process's): ``python -m`` puts it first on
        the module path, ahead of this checkout's editable install."""
        return self.path


THIS_CHECKOUT = Engine("this checkout")


def baseline_engine(rev: str, workdir: Path) -> Engine:
    """``rev`` checked out (a git worktree) in ``workdir``, where its engine's process starts."""
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.strip()
    engine = Engine(short, workdir / f"engine-{short}")
    remove_engine(engine)  # left by a run that was killed
    subprocess.run(["git", "worktree", "add", "--detach", str(engine.path), short], cwd=ROOT, check=True,
                   capture_output=True)
    return engine


def remove_engine(engine: Engine) -> None:
    """Remove ``engine``'s worktree (this checkout's: nothing)."""
    if engine.path is not None:
        subprocess.run(["git", "worktree", "remove", "--force", str(engine.path)], cwd=ROOT, capture_output=True)


@dataclass
class RateResult:
    """One run's figures at one rate."""

    tables: str
    run: int
    poll_ms: int
    engine: str
    #: the engine's CPUs (``all``: not pinned, the machine's cores shared with the stack and the load)
    engine_cpus: str
    target: float
    generators: int
    achieved: float
    per_generator: list[float]
    engine_rate: float
    p50: float | None
    p95: float | None
    p99: float | None
    rows: int
    unmatched: int
    drain_seconds: float
    caught_up: bool
    failed_transactions: int
    trigger_ms: float
    #: median time between the starts of consecutive batches in the window (see the module docstring)
    interval_ms: float | None
    batch_p50: float | None
    #: median batch time in the first and in the last tenth of the window's batches: a batch that costs
    #: more as its tables grow shows here
    batch_ends: tuple[float, float] | None
    #: median rows a batch's MERGE copied (rewrote unchanged) in the first and last tenth of the window's
    #: batches: copy-on-write that grows with the file a MERGE keeps touching shows here
    copied_ends: tuple[float, float] | None
    stages: dict[str, float | None]
    tail: dict[str, float | None]
    #: each Spark micro-batch step's mean in the window, ms (empty: the engine does not report them)
    spark_steps: dict[str, float]
    #: full garbage collections in the window, by kind of process: ``driver``, ``worker`` (:mod:`gc_probe`)
    full_collections: dict[str, Collections]
    #: 95th percentile of the time between the starts of consecutive batches, ms
    interval_p95: float | None = None
    #: median and 95th percentile, ms, of the time from a batch's Delta commit to the next batch's
    #: start: the part of the interval outside the tables' journey (:func:`commit_to_next_start`)
    between: tuple[float, float] | None = None
    #: batches in the window at whose version a Delta checkpoint was written (every
    #: ``delta.checkpointInterval`` commits), and the median batch time, ms, of those and of their neighbours
    checkpointed: tuple[int, float, float] | None = None
    #: alike, the batches during which a compaction of the table's remembered deletes was committed
    packed: tuple[int, float, float] | None = None
    #: every garbage-collection pause in the window of the stack's Kafka and Connect (``None``: the
    #: server keeps no log of them, :mod:`harness.stack.gclog`)
    stack_pauses: dict[str, Pauses | None] = field(default_factory=dict)
    #: the machine's CPU in the window: the share of the cores' time busy, and stolen by the hypervisor
    cpu: tuple[float, float] | None = None

    @property
    def fresh(self) -> bool:
        """p50 within the interval between batches plus a median batch."""
        return (self.p50 is not None and self.batch_p50 is not None and self.interval_ms is not None
                and self.p50 <= self.interval_ms + self.batch_p50)

    @property
    def tail_bounded(self) -> bool:
        """p99 within p50 plus the interval between batches plus a median batch: the slowest 1 % waited
        at most one interval and one batch longer than the median change."""
        return (self.p99 is not None and self.p50 is not None and self.batch_p50 is not None
                and self.interval_ms is not None and self.p99 <= self.p50 + self.interval_ms + self.batch_p50)


def _generate(dsn: str, rate: float, duration: float, seed: int, start_at: float) -> LoadReport:
    """One generator process: wait for the common start, then write ``rate`` changes/s for ``duration`` s."""
    time.sleep(max(0.0, start_at - time.time()))
    return LoadGenerator(dsn, rate=rate, duration=duration, seed=seed, schema=SCHEMA,
                         application_name=f"bench-latency-{seed}").run()


def append_time(stack: object, topics: list[str]) -> None:
    """Have the topics stamp their records with the broker's append time from now on."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers()})  # type: ignore[attr-defined]
    entry = ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)
    futures = admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, t, incremental_configs=[entry])
                                               for t in topics])
    for future in futures.values():
        future.result(timeout=30)


def arrivals(config: IngestConfig, rows: object) -> dict[tuple[str, int, int], tuple[int, int]]:
    """``(topic, partition, offset) -> (envelope ts_ms, record timestamp ms)`` of the rows' records."""
    spec = config.source.kafka
    assert spec is not None
    log, decoder = KafkaLog(spec, str(config.secrets_path) if config.secrets_path else None), \
        DecoderSpec.for_source(config)()
    spans: dict[tuple[str, int], list[int]] = {}
    columns = [rows[c].to_pylist() for c in ("_cdc_topic", "_cdc_partition", "_cdc_offset")]  # type: ignore[index]
    for topic, partition, offset in zip(*columns, strict=True):
        spans.setdefault((topic, partition), []).append(offset)
    out = {}
    for (topic, partition), offsets in spans.items():
        read = log.read(topic, partition, min(offsets), max(offsets) + 1)
        for offset, value, stamp in zip(read["offset"].to_pylist(), read["value"].to_pylist(),
                                        read["timestamp"].to_pylist(), strict=True):
            if value is not None:
                envelope, _ = decoder.read_value(value)
                out[(topic, partition, offset)] = (int(envelope["ts_ms"]), int(stamp.timestamp() * 1000))
    return out


def measure(stack: object, tables: str, rate: float, run: int, args: argparse.Namespace,
            poll_ms: int, engine: Engine = THIS_CHECKOUT, engine_cpus: str = "all") -> RateResult:
    """One run at one rate with one table set (see the module docstring), with Debezium's
    ``poll.interval.ms`` at ``poll_ms``, of ``engine``, on ``engine_cpus`` (a CPU list, or ``all``)."""
    dsn = stack.pg_dsn()  # type: ignore[attr-defined]
    workdir = (args.workdir / f"{tables}-rate-{int(rate)}-run-{run}" / f"poll-{poll_ms}"
               / engine.name.replace(" ", "-") / f"cpus-{engine_cpus}")
    poll(stack, args.format, poll_ms)
    shutil.rmtree(workdir, ignore_errors=True)
    reset_source(stack, SCHEMA, say=console.print)
    run_workload(dsn, WorkloadSpec(seed=5, scale=0.05, schema=SCHEMA))
    config_path = stack_config(stack, workdir, value_format=args.format, schema=SCHEMA, tables=TABLE_SETS[tables])
    if args.trigger is not None:
        raw = yaml.safe_load(config_path.read_text())
        raw["source"]["trigger_seconds"] = args.trigger
        config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    port = _free_port()
    probe = workdir / "gc-probe"
    process = IngestProcess(config_path, workdir / "logs", engine_environment(stack, **environment(probe)),
                            cwd=engine.cwd, args=("--metrics-port", str(port)))
    cores = CoreSplit.of(engine_cpus)
    cores.others()  # the engine's process starts from this one: on the other CPUs, until it is moved
    try:
        process.start()
        assert process.pid is not None
        cores.engine(process.pid)
        # the catalog's topics exist once Debezium has captured it: before, they have no end offsets to wait for
        wait_for_capture(dsn, timeout=600, say=console.print)
        catch_up = wait_for_tables(config, list(config.tables), wait=600, say=console.print)
        if not catch_up.ok:
            raise SystemExit(f"the engine did not catch up with the catalog: {catch_up.problem}\n{process.tail()}")
        append_time(stack, [spec.topic for spec in config.tables])
        generators = max(1, math.ceil(rate / args.per_generator))
        duration = args.warmup + args.measure
        start_at = time.time() + 3.0
        steps = StepScrapes(port, (start_at + args.warmup, start_at + duration))
        console.print(f"{tables}, rate {rate:.0f}/s, run {run}: {generators} generator process(es) for "
                      f"{duration:.0f} s")
        # The stack captures the schema twice, in Avro and in JSON; a deployment has one connector, so
        # the other one waits until the measured one and the engine have drained the load: its catch-up
        # would otherwise share the cores with the window's last rows.
        other = OTHER_CONNECTOR[args.format]
        with stack.connectors_paused([other]):  # type: ignore[attr-defined]
            with ProcessPoolExecutor(generators, mp_context=get_context("spawn")) as pool:
                futures = [pool.submit(_generate, dsn, rate / generators, duration, 100 + i, start_at)
                           for i in range(generators)]
                reports = [f.result() for f in futures]
            load_end = time.time()
            slot = stack.connector_template(MEASURED_CONNECTOR[args.format])["slot.name"]  # type: ignore[attr-defined]
            capture = wait_for_capture(dsn, timeout=600, say=console.print, slots=[slot])
            drained = wait_for_tables(config, list(config.tables), wait=900, say=console.print)
            drain_seconds = time.time() - load_end
        if not (rest := wait_for_capture(dsn, timeout=600, say=console.print)).ok:  # before the next reset
            raise SystemExit(f"the {other} connector did not catch up after the load: {rest.problem}")
    finally:
        process.stop(timeout=60)
        cores.release()
    since = datetime.fromtimestamp(start_at + args.warmup, UTC)
    until = datetime.fromtimestamp(start_at + duration, UTC)
    items = config.table_path("order_items")
    index = CommitIndex.of_table(items)
    rows = measured_rows(items)
    if rows is None:
        raise SystemExit(f"order_items has no table at {items}")
    lat = latencies_of(rows, index, since=since, until=until)
    audited = audit.read(config.tables_root / config.target.audit_table).to_pylist()  # every table's batches
    in_window = [row for row in audited if row["finished_at"] is not None and since <= row["finished_at"] < until]
    batches = {row["delta_version"]: row for row in audited
               if row["table"] == "order_items" and row["delta_version"] is not None}
    stages = stages_of(rows, index, arrivals(config, rows), batches, since=since, until=until)
    in_time = [b for b in batches.values() if b["finished_at"] and since <= b["finished_at"] < until]
    timed = sorted((b["finished_at"], float(b["total_ms"])) for b in in_time)
    totals = [total for _, total in timed]
    starts = [b["started_at"] for b in in_time if b["started_at"]]
    gaps = intervals(starts)
    received = sum(row["received"] for row in in_window)
    committed = sum(r.committed_changes for r in reports)
    seconds = max(r.seconds for r in reports)
    return RateResult(
        tables=tables, run=run, poll_ms=poll_ms, engine=engine.name, engine_cpus=engine_cpus, target=rate,
        generators=generators,
        achieved=committed / seconds,
        per_generator=[r.rate for r in reports], engine_rate=received / args.measure,
        p50=lat.percentile(50), p95=lat.percentile(95), p99=lat.percentile(99), rows=len(lat.values),
        unmatched=lat.unmatched, drain_seconds=drain_seconds, caught_up=capture.ok and drained.ok,
        failed_transactions=sum(r.failed_transactions for r in reports),
        trigger_ms=config.source.trigger_seconds * 1000,
        interval_ms=median_interval(starts), interval_p95=nearest_rank(gaps, 0.95) if gaps else None,
        between=_median_p95(commit_to_next_start(in_time, index.times)),
        checkpointed=marked_batches(in_time, checkpoint_versions(items.local)),
        packed=marked_batches(in_time, batches_during(in_time, compaction_times(
            TablePaths.of(config, "order_items").tombstones))),
        batch_p50=statistics.median(totals) if totals else None,
        batch_ends=first_and_last(totals),
        copied_ends=first_and_last([copied_rows(b) for b in sorted(in_time, key=lambda b: b["finished_at"])]),
        stages={stage: statistics.median(v) if v else None for stage, v in stages.items()},
        tail=slowest_stages(stages), spark_steps=step_means(*steps.taken()), cpu=steps.cpu_window(),
        full_collections=collections(probe, start_at + args.warmup, start_at + duration),
        stack_pauses={server: pauses(stack.component(server).dir,  # type: ignore[attr-defined]
                                     start_at + args.warmup, start_at + duration) for server in STACK_JVMS})


@dataclass(frozen=True)
class CoreSplit:
    """The machine's CPUs split between the engine and everything else, for one run (``--engine-cpus``).

    Affinity is set per thread (every task of a process); a thread or process started later takes its
    parent's, so the engine's JVM and Python workers follow its driver.
    """

    #: the engine's CPUs (empty: nothing is pinned)
    mine: frozenset[int]

    @staticmethod
    def of(spec: str) -> CoreSplit:
        if spec == "all":
            return CoreSplit(frozenset())
        cpus: set[int] = set()
        for part in spec.split("+"):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
        if not cpus < os.sched_getaffinity(0):
            raise SystemExit(f"--engine-cpus {spec}: leave at least one of CPUs "
                             f"{sorted(os.sched_getaffinity(0))} to the stack and the load")
        return CoreSplit(frozenset(cpus))

    def others(self) -> None:
        """Every process of the machine onto the CPUs the engine does not take."""
        if self.mine:
            _pin(_every_pid(), _all_cpus() - self.mine)

    def engine(self, pid: int) -> None:
        """The engine's process and its children onto its CPUs."""
        if self.mine:
            _pin(descendants(pid), set(self.mine))

    def release(self) -> None:
        """Every process of the machine onto every CPU again."""
        if self.mine:
            _pin(_every_pid(), _all_cpus())


def _all_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def _every_pid() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _pin(pids: list[int], cpus: set[int]) -> None:
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:  # a kernel thread, or a thread that ended meanwhile
                continue


def poll(stack: object, value_format: str, poll_ms: int | None) -> None:
    """Register the measured connector with ``poll.interval.ms`` at ``poll_ms`` (``None``: as the stack
    configures it) and wait until it runs."""
    name = MEASURED_CONNECTOR[value_format]
    config = stack.connector_template(name)  # type: ignore[attr-defined]
    if poll_ms is not None:
        config["poll.interval.ms"] = str(poll_ms)
    stack.register_connector(name, config)  # type: ignore[attr-defined]
    stack.wait_connectors([name])  # type: ignore[attr-defined]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def step_totals(text: str) -> dict[str, tuple[float, float]]:
    """``step -> (seconds, micro-batches)`` of a scrape's ``cdc_ingest_micro_batch_step_seconds``."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            step = sample.labels.get("step")
            if step is not None and sample.name == f"{_STEP_METRIC}_sum":
                sums[step] = sample.value
            elif step is not None and sample.name == f"{_STEP_METRIC}_count":
                counts[step] = sample.value
    return {step: (sums[step], counts[step]) for step in sums if step in counts}


def step_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each step's mean, in ms, over the micro-batches between two scrapes (:func:`step_totals`); a
    step no micro-batch between them reported is left out."""
    out = {}
    for step, (seconds, count) in after.items():
        was_seconds, was_count = before.get(step, (0.0, 0.0))
        if count > was_count:
            out[step] = (seconds - was_seconds) / (count - was_count) * 1000
    return out


class StepScrapes:
    """The engine's micro-batch steps scraped at two moments, in a thread (the load runs meanwhile), and
    the machine's CPU time at each (:func:`cpu_ticks`)."""

    def __init__(self, port: int, moments: tuple[float, float]) -> None:
        self.port, self.moments = port, moments
        self.scrapes: list[dict[str, tuple[float, float]]] = []
        self.cpu: list[tuple[int, int, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for moment in self.moments:
            time.sleep(max(0.0, moment - time.time()))
            self.cpu.append(cpu_ticks())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as answer:
                    self.scrapes.append(step_totals(answer.read().decode()))
            except OSError as exc:
                console.print(f"  the engine's metrics did not answer ({exc}): no micro-batch steps")
                return

    def taken(self) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
        """The two scrapes (empty ones if a scrape failed)."""
        self._thread.join()
        return (self.scrapes[0], self.scrapes[1]) if len(self.scrapes) == 2 else ({}, {})

    def cpu_window(self) -> tuple[float, float] | None:
        """:func:`cpu_shares` between the two moments."""
        self._thread.join()
        return cpu_shares(self.cpu[0], self.cpu[1]) if len(self.cpu) == 2 else None


def first_and_last(times: list[float], share: float = 0.1) -> tuple[float, float] | None:
    """The median of the first ``share`` of ``times`` (in the order they came) and of the last
    (``None``: no times)."""
    if not times:
        return None
    n = max(1, int(len(times) * share))
    return statistics.median(times[:n]), statistics.median(times[-n:])


def copied_rows(batch: dict) -> float:
    """Rows the batch's commit copied unchanged into new files (its MERGE's
    ``num_target_rows_copied``, delta-rs's or delta-spark's name; an append copies none)."""
    metrics = json.loads(batch.get("merge_metrics") or "{}")
    return float(metrics.get("num_target_rows_copied", metrics.get("numTargetRowsCopied", 0)))


def intervals(starts: list[datetime]) -> list[float]:
    """The times, in ms, between consecutive ``starts`` (given in any order)."""
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(sorted(starts))]


def median_interval(starts: list[datetime]) -> float | None:
    """The median time, in ms, between consecutive ``starts`` (``None``: fewer than two)."""
    gaps = intervals(starts)
    return statistics.median(gaps) if gaps else None


def commit_to_next_start(batches: list[dict[str, Any]], commit_times: dict[int, int]) -> list[float]:
    """For each batch whose table's previous version is an engine commit, the time in ms from that
    commit to the batch's start (its audit row's ``started_at``): the callback's work after the
    commit (the audit append), Spark's own steps between micro-batches, and the next batch's read
    and decode."""
    return [b["started_at"].timestamp() * 1000 - commit_times[b["delta_version"] - 1] for b in batches
            if b.get("started_at") and b.get("delta_version") is not None and b["delta_version"] - 1 in commit_times]


def marked_batches(batches: list[dict[str, Any]], versions: set[int], near: int = 5
                   ) -> tuple[int, float, float] | None:
    """How many ``batches`` are marked (their ``delta_version`` is in ``versions``: they reached a Delta
    checkpoint with their commit, say), the median time, ms, of those batches, and that of the batches
    within ``near`` versions of one that are not (the neighbours: a table's batches grow slower as it
    grows, so the window's median would not compare like with like); ``None``: none is, or none has
    a neighbour."""
    times = {b["delta_version"]: float(b["total_ms"]) for b in batches
             if b.get("delta_version") is not None and b.get("total_ms") is not None}
    wrote = sorted(v for v in times if v in versions)
    neighbours = {v for c in wrote for v in range(c - near, c + near + 1) if v in times and v not in versions}
    if not wrote or not neighbours:
        return None
    return len(wrote), statistics.median(times[v] for v in wrote), statistics.median(times[v] for v in neighbours)


def batches_during(batches: list[dict[str, Any]], times: list[datetime]) -> set[int]:
    """The versions of the ``batches`` that were under way (started, not yet finished) at one of ``times``."""
    return {b["delta_version"] for b in batches
            if b.get("delta_version") is not None and b.get("started_at") and b.get("finished_at")
            and any(b["started_at"] <= t <= b["finished_at"] for t in times)}


def _marked(marked: tuple[int, float, float] | None) -> str | None:
    """:func:`marked_batches`' figures as the table shows them."""
    return None if marked is None else f"{marked[0]}: {marked[1] / 1000:.2f} / {marked[2] / 1000:.2f}"


def _median_p95(values: list[float]) -> tuple[float, float] | None:
    return (statistics.median(values), nearest_rank(values, 0.95)) if values else None


def slowest_stages(stages: dict[str, list[float]], share: float = 0.05) -> dict[str, float | None]:
    """Each stage's median over the slowest ``share`` of the rows (a row's latency is its stages' sum):
    where the tail's time goes, beside where the typical row's goes."""
    per_row = list(zip(*stages.values(), strict=True))
    slowest = sorted(per_row, key=sum)[-max(1, math.ceil(share * len(per_row))):] if per_row else []
    return {stage: statistics.median(row[i] for row in slowest) if slowest else None
            for i, stage in enumerate(stages)}


def _pauses(seen: Collections | None, seconds: float, longest: float | None = None) -> str:
    """Collections of one kind of process in a window of ``seconds``, as the table shows them (with
    the longest, when given)."""
    if seen is None or not seen.count:
        return "none"
    share = seen.milliseconds / 1000 / seconds / seen.processes
    most = "" if longest is None else f" (longest {longest:.0f})"
    return f"{seen.count / seconds:.2f}/s, {seen.milliseconds / seen.count:.0f} ms{most}, {share:.0%}"


def _stack_pauses(seen: Pauses | None, seconds: float) -> str:
    """A stack server's pauses in a window of ``seconds``, as :func:`_pauses` shows them, with the
    longest, which is what a change that waits for one sees."""
    if seen is None:
        return "not logged"
    return _pauses(Collections(seen.count, seen.milliseconds, 1), seconds, seen.longest)


def _cpus(spec: str) -> str:
    return "cores shared" if spec == "all" else f"engine on CPU {spec}, the rest on the others"


def _poll(ms: int) -> str:
    return f"{ms} ms"


def _s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,2000", help="target row changes per second, comma separated")
    parser.add_argument("--tables", default="one,shop", help="table sets, comma separated: one, shop")
    parser.add_argument("--runs", type=int, default=3, help="runs of each table set and rate")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the window")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds of the measurement window")
    parser.add_argument("--per-generator", type=float, default=600.0,
                        help="target changes/s per generator process (one connection each)")
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--trigger", type=float, default=None,
                        help="source.trigger_seconds of the engine (default: the configuration's default)")
    parser.add_argument("--poll-ms", default="50",
                        help="Debezium's poll.interval.ms for the measured connector, comma separated to compare "
                             "settings run by run (the stack's connectors keep Debezium's 500)")
    parser.add_argument("--engine-cpus", default="all",
                        help="the engine's CPUs for a run (1, 2-3 or 0+2; all: not pinned), comma "
                             "separated to compare settings run by run; the stack, the load and this script "
                             "take the others")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run the engine of this git revision, taking turns with this checkout's")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work/latency"))
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()
    sets = args.tables.split(",")
    if unknown := [t for t in sets if t not in TABLE_SETS]:
        parser.error(f"unknown table set {unknown[0]!r}: {', '.join(TABLE_SETS)}")

    from harness.stack import CDC_COMPONENTS, Stack

    stack = Stack.from_env()
    stack.up(CDC_COMPONENTS)
    stack.wait_connectors()
    os.environ.update(stack.engine_env())
    polls = [int(p) for p in args.poll_ms.split(",")]
    splits = args.engine_cpus.split(",")
    for split in splits:
        CoreSplit.of(split)  # refuses a bad list before the first run
    engines = [baseline_engine(args.baseline, args.workdir), THIS_CHECKOUT] if args.baseline else [THIS_CHECKOUT]
    try:
        results = [measure(stack, tables, float(rate), run, args, poll_ms, engine, cpus)
                   for tables in sets for rate in args.rates.split(",") for run in range(1, args.runs + 1)
                   for poll_ms in polls for engine in engines for cpus in splits]
    finally:
        poll(stack, args.format, None)
        for engine in engines:
            remove_engine(engine)

    several = {"poll": len(polls) > 1, "engine from": len(engines) > 1, "engine CPUs": len(splits) > 1}
    keys = ["tables", "target rate", "run", *(k for k, shown in several.items() if shown)]

    def key(r: RateResult) -> list[str]:
        shown = {"poll": _poll(r.poll_ms), "engine from": r.engine, "engine CPUs": _cpus(r.engine_cpus)}
        return [r.tables, f"{r.target:,.0f}/s", str(r.run), *(v for k, v in shown.items() if several[k])]

    def table(title: str, columns: tuple[str, ...]) -> Table:
        out = Table(title=title)
        for col in (*keys, *columns):
            out.add_column(col, justify="right")
        return out

    latency = table(f"Continuous mode on the stack ({args.format}): PostgreSQL commit -> visible in Delta, "
                    f"order_items rows committed in a {args.measure:.0f} s window after {args.warmup:.0f} s warm-up",
                    ("achieved source rate", "engine records/s", "p50", "p95", "p99", "p99/p50", "rows measured",
                     "drain", "failed tx"))
    batches = table("Batches: the interval between their starts (the trigger's, or the batch's own when it "
                    "outlasts the trigger) and their time",
                    ("trigger", "interval", "interval p95", "commit to next start (median / p95)", "median batch",
                     "batch first / last tenth",
                     "rows copied first / last tenth", "batches with a Delta checkpoint: n, median / neighbours'",
                     "batches during a pack of remembered deletes: n, median / neighbours'",
                     "p50 <= interval + batch", "p99 <= p50 + interval + batch"))
    stages = table("Where the time goes: each stage's median, over all the rows measured and over the slowest 5 %",
                   ("rows", *STAGES))
    spark = table("Spark's micro-batches in the window: each step's mean (addBatch: the tables' work; "
                  "triggerExecution: the whole)", SPARK_STEPS)
    pauses = table("Garbage collections in the window (each pauses its process): count per second, mean time, "
                   "and the share of the window they took (per process); the engine's full collections, and every "
                   "collection of the stack's Kafka and Connect; and the machine's CPU, busy / stolen by the "
                   "hypervisor", ("driver", "Python workers", "Kafka", "Connect", "CPU"))
    figures = []
    for r in results:
        name = f"{r.tables}, {r.target:,.0f}/s, " + (f"poll {r.poll_ms} ms, " if several["poll"] else "") + \
            (f"engine {r.engine}, " if several["engine from"] else "") + \
            (f"{_cpus(r.engine_cpus)}, " if several["engine CPUs"] else "") + \
            f"run {r.run}"
        ratio = r.p99 / r.p50 if r.p50 and r.p99 is not None else None
        ends = None if r.batch_ends is None else f"{r.batch_ends[0] / 1000:.2f} / {r.batch_ends[1] / 1000:.2f}"
        latency.add_row(*key(r), f"{r.achieved:,.0f}/s", f"{r.engine_rate:,.0f}/s",
                        _s(r.p50), _s(r.p95), _s(r.p99), "-" if ratio is None else f"{ratio:.2f}",
                        f"{r.rows:,}" + (f" ({r.unmatched} unmatched)" if r.unmatched else ""),
                        f"{r.drain_seconds:.0f} s" + ("" if r.caught_up else " (NOT caught up)"),
                        str(r.failed_transactions))
        copied = None if r.copied_ends is None else f"{r.copied_ends[0]:,.0f} / {r.copied_ends[1]:,.0f}"
        between = None if r.between is None else f"{r.between[0] / 1000:.2f} / {r.between[1] / 1000:.2f}"
        checkpointed, packed = (_marked(marked) for marked in (r.checkpointed, r.packed))
        batches.add_row(*key(r), _s(r.trigger_ms), _s(r.interval_ms), _s(r.interval_p95),
                        "-" if between is None else f"{between} s", _s(r.batch_p50),
                        "-" if ends is None else f"{ends} s", copied or "-",
                        "-" if checkpointed is None else f"{checkpointed} s", "-" if packed is None else f"{packed} s",
                        "yes" if r.fresh else "NO", "yes" if r.tail_bounded else "NO")
        stages.add_row(*key(r), "all", *(_s(r.stages[stage]) for stage in STAGES))
        stages.add_row(*key(r), "slowest 5 %", *(_s(r.tail[stage]) for stage in STAGES), end_section=True)
        spark.add_row(*key(r), *(_s(r.spark_steps.get(step)) for step in SPARK_STEPS))
        pauses.add_row(*key(r), *(_pauses(r.full_collections.get(kind), args.measure) for kind in ("driver", "worker")),
                       *(_stack_pauses(r.stack_pauses.get(server), args.measure) for server in STACK_JVMS),
                       "-" if r.cpu is None else f"{r.cpu[0]:.0%} / {r.cpu[1]:.1%}")
        figures += [Figure(f"{name}: achieved source rate", round(r.achieved), "/s"),
                    *(Figure(f"{name}: latency {p}", None if v is None else round(v / 1000, 2), "s")
                      for p, v in (("p50", r.p50), ("p95", r.p95), ("p99", r.p99))),
                    Figure(f"{name}: p99 / p50", None if ratio is None else round(ratio, 2), "x"),
                    Figure(f"{name}: interval between batches (median)",
                           None if r.interval_ms is None else round(r.interval_ms / 1000, 2), "s"),
                    Figure(f"{name}: interval between batches (p95)",
                           None if r.interval_p95 is None else round(r.interval_p95 / 1000, 2), "s"),
                    Figure(f"{name}: a commit to the next batch's start (median / p95)", between, "s"),
                    Figure(f"{name}: median batch", None if r.batch_p50 is None else round(r.batch_p50 / 1000, 2), "s"),
                    Figure(f"{name}: median batch, first / last tenth of the window", ends, "s"),
                    Figure(f"{name}: median rows copied by a batch's commit, first / last tenth of the window", copied,
                           "rows"),
                    Figure(f"{name}: batches whose commit wrote a Delta checkpoint: count, median batch / their "
                           "neighbours' (5 versions either side)", checkpointed, "s"),
                    Figure(f"{name}: batches during a pack of the remembered deletes: count, median batch / "
                           "their neighbours' (5 versions either side)", packed, "s"),
                    Figure(f"{name}: p50 within interval + median batch", r.fresh),
                    Figure(f"{name}: p99 within p50 + interval + median batch", r.tail_bounded),
                    Figure(f"{name}: stages (median, s)", " / ".join(
                        f"{stage} {'-' if r.stages[stage] is None else f'{r.stages[stage] / 1000:.2f}'}"
                        for stage in STAGES)),
                    Figure(f"{name}: stages of the slowest 5 % (median, s)", " / ".join(
                        f"{stage} {'-' if r.tail[stage] is None else f'{r.tail[stage] / 1000:.2f}'}"
                        for stage in STAGES)),
                    Figure(f"{name}: Spark micro-batch steps (mean, s)", " / ".join(
                        f"{step} {r.spark_steps[step] / 1000:.3f}" for step in SPARK_STEPS if step in r.spark_steps)
                        or None),
                    *(Figure(f"{name}: full garbage collections, {label}",
                             _pauses(r.full_collections.get(kind), args.measure))
                      for kind, label in (("driver", "driver"), ("worker", "Python workers"))),
                    *(Figure(f"{name}: garbage collections of the stack's {label}",
                             _stack_pauses(r.stack_pauses.get(server), args.measure))
                      for server, label in zip(STACK_JVMS, ("Kafka", "Connect"), strict=True)),
                    Figure(f"{name}: the machine's CPU in the window: busy / stolen by the hypervisor",
                           None if r.cpu is None else f"{r.cpu[0]:.0%} / {r.cpu[1]:.1%}"),
                    Figure(f"{name}: caught up after the load", r.caught_up)]
    for out in (latency, batches, stages, spark, pauses):
        console.print(out)
    console.print(f"trigger {results[0].trigger_ms / 1000:g} s; load average at the end: "
                  f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    variant = changed_options(parser, args, ignore=("workdir",))
    console.print(f"result: {write_result('bench_latency', variant, figures)}")


if __name__ == "__main__":
    main()
