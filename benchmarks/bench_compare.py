"""The engine against a bare single-process script, side by side on the same records (not a test).

Generates one simulated workload (snapshot, updates, deletes, duplicates, cross-partition
reordering, a truncate, an added and a widened column, TOAST placeholders), applies it with the bare
baseline (``benchmarks/bare.py``: json or fastavro + Arrow + delta-rs MERGE, no Spark) and with the
engine (``ingest.stream.runner.Runner``, no quality suites, as the bare script has none), verifies both
against the simulator's truth, and prints a table. The engine's one-time Spark session start and
the start of its streaming queries are excluded (and shown); every batch, the first included,
counts. The last line is
``ratio engine/bare: X.XX`` (the engine's throughput divided by the baseline's).

    .venv/bin/python benchmarks/bench_compare.py --format json --events 200000 --batch 20000
    .venv/bin/python benchmarks/bench_compare.py --format avro --busy-core   # a CPU hog beside the engine
    .venv/bin/python benchmarks/bench_compare.py --skip-bare --quality       # what the demo's suites cost
    .venv/bin/python benchmarks/bench_compare.py --engine delta-spark --batch 200000  # MERGE as Spark jobs
    .venv/bin/python benchmarks/bench_compare.py --queries 3   # one streaming query per table
    .venv/bin/python benchmarks/bench_compare.py --source kafka   # the engine reads a real broker
    .venv/bin/python benchmarks/bench_compare.py --jit full   # the driver JVM's C2 compiler on (spark.jit)
    .venv/bin/python benchmarks/bench_compare.py --engine delta-spark --jobs   # Spark's jobs by kind
    .venv/bin/python benchmarks/bench_compare.py --engine delta-spark --bare-spark   # bare, delta-spark MERGE
    .venv/bin/python benchmarks/bench_compare.py --engine delta-spark --plan-on executors --skip-bare
    .venv/bin/python benchmarks/bench_compare.py --spark-conf spark.sql.adaptive.enabled=false   # a setting
    .venv/bin/python benchmarks/bench_compare.py --driver-seconds 30   # a backlog applied without Spark

``--source kafka`` starts the project's Kafka broker and registry (``harness.stack``; stopped again
if this started them), copies the generated topics there (``benchmarks/kafka_copy.py``: same
partitions, offsets, keys, values and timestamps; Avro ids mapped to the registry's; the copy is
not timed) and runs the engine on the broker with the configuration's Kafka reader (``--kafka-reader``
picks one). The bare script then reads the same topics from the broker with librdkafka
(``confluent_kafka``), as a user without Spark would.

Batches: the bare script applies a table's records in batches of at most ``--batch``; the engine
reads with ``source.max_records_per_table`` set to ``--batch`` (and ``max_records_per_batch`` to that
times the tables), so every table's MERGE takes at most as many records as the bare script's.
With ``--kafka-reader spark`` (Spark's Kafka source bounds only the whole micro-batch), the engine's
micro-batch is bounded to ``--batch`` records, all tables together.

``--engine`` picks the engine's apply engine for every table (``target.engine``); the bare script
always merges with delta-rs on one core, as a user without Spark would. ``--bare-spark`` also runs
the bare script with delta-spark's MERGE instead (``bare.py --spark``: the same decode, reduce and
guards, deletion vectors on), in a process and JVM of its own, as a user with Spark but without
this framework would, and prints the engine's ratio to it too: what delta-spark itself costs on
these batches, apart from what the engine adds. ``--jobs`` writes Spark's event log and prints the
engine's Spark jobs by kind (``spark_jobs.py``); ``--spark-conf KEY=VALUE`` adds a Spark setting
to the engine's session.

``--driver-seconds`` sets ``source.driver_seconds`` (0 here unless given: the engine's Spark path,
whatever the configuration's default): a backlog the driver expects to apply within that
long is applied there, without Spark (:mod:`ingest.stream.driver_run`); Spark's session is then not
started before the run, and starts inside it only if the driver hands the rest over. The line
``ratio counting the session and query start`` is what a user waits for, from nothing started to
every table caught up: run it once with and once without the switch.

``--quality`` then runs the engine on the same records with the demo's expectation suites
(``configs/demo.yaml``) into tables of their own, and once more without them (both warm), and
reports what validation adds to the engine's time end to end (``--validate-on driver
--validate-on spark``: one run with suites per side, in that order); loading the suites (GX's import,
once per process) is excluded and shown. ``benchmarks/bench_quality.py`` measures the driver path
alone.

Driver memory: the Python driver's peak RSS (``ru_maxrss``) and the Spark JVM's (``VmHWM``).

CPU (``benchmarks/cpu_meter.py``, Linux): the CPU seconds of the bare script's run, and of the
engine's batches (query start excluded) by process -- the Python driver, Spark's JVM (its JIT
compiler threads apart), the Python workers, and a broker or registry this started.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bare
import spark_jobs
from cpu_meter import KINDS, CpuMeter
from harness.demo import prepare_workload, truth_dir, verify_all
from harness.latency import nearest_rank
from harness.simulator import Truth
from kafka_copy import KafkaLog, kafka_config
from record import Figure, changed_options, write_result

from ingest.config import IngestConfig, load_config
from ingest.source.topiclog import TopicLog
from ingest.stream.runner import Runner
from ingest.verify.compare import verify_table

console = Console()


def workload(root: Path, value_format: str, events: int, batch: int,
             engine: str = "delta-rs", queries: int = 1, jit: str = "auto",
             spark_conf: dict[str, str] | None = None, plan_on: str = "driver",
             driver_seconds: float = 0.0) -> tuple[IngestConfig, IngestConfig]:
    """The workload's config (no expectations suites), generated once per format and size, and the
    same with the demo's suites writing to tables, checkpoints and results of their own."""
    workdir = (root / f"{value_format}-{events}").resolve()
    raw = yaml.safe_load(Path("configs/demo.yaml").read_text())
    raw["workdir"] = str(workdir)
    raw["quality"]["expectations_dir"] = str(Path("expectations").resolve())
    raw["source"]["value_format"] = value_format
    # Like the bare script's batches: at most ``batch`` records of a table per micro-batch (and MERGE).
    raw["source"]["max_records_per_batch"] = batch * len(raw["tables"])
    raw["source"]["max_records_per_table"] = batch
    raw["source"]["queries"] = queries
    raw["target"]["writer"] = engine
    raw["target"]["plan_on"] = plan_on
    raw["spark"]["jit"] = jit
    raw["source"]["driver_seconds"] = driver_seconds
    if spark_conf:
        raw["spark"]["conf"] = {**(raw["spark"].get("conf") or {}), **spark_conf}
    workdir.mkdir(parents=True, exist_ok=True)
    checked = workdir / "bench-quality.yaml"
    raw_checked = yaml.safe_load(yaml.safe_dump(raw))
    raw_checked["target"] |= {"root": "tables-quality", "checkpoint_dir": "checkpoints-quality"}
    raw_checked["quality"]["results_dir"] = "quality-results"
    checked.write_text(yaml.safe_dump(raw_checked))
    for table in raw["tables"]:
        for key in ("expectations", "quality_policy", "expectation_policies"):
            table.pop(key, None)
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(raw))
    config, config_checked = load_config(path), load_config(checked)
    prepare_workload(config, events=events, seed=11, malformed_fraction=0.0)
    for leftover in (config.tables_root, config.checkpoint_root, workdir / "bare-tables",
                     config_checked.tables_root, config_checked.checkpoint_root, config_checked.quality_results_dir):
        shutil.rmtree(leftover, ignore_errors=True)
    return config, config_checked


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def jvm_peak_mb(engine: Runner) -> float | None:
    if not engine.spark_started:  # the run stayed on the driver: no JVM
        return None
    proc = getattr(engine.spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return None
    status = Path(f"/proc/{proc.pid}/status")
    for line in status.read_text().splitlines() if status.exists() else []:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


@dataclass
class EngineRun:
    """One engine run over the workload: wall times (s), batch times (s), verdict."""

    run_s: float
    query_start_s: float
    batches: list[float]
    firsts: list[float]
    failed: int
    ok: bool
    quarantined: int
    suites_s: float  # loading the suites (GX's import and context, once per process): excluded
    #: the driver applied every record alone (``source.driver_seconds``): Spark was not started
    on_driver: bool = False
    #: ``time.perf_counter()`` when the first batch began and when the run ended (the CPU meter's stretch)
    span: tuple[float, float] = (0.0, 0.0)
    #: one query only: seconds spent reading and decoding (Spark) and applying the tables (driver),
    #: summed over the micro-batches; a micro-batch is applied while the next one is decoded, so the
    #: two overlap, and their sum may exceed the batches' wall time
    phases: tuple[float, float] | None = None

    @property
    def engine_s(self) -> float:
        # Starting the streaming queries (the source's Python runner, the first plan) is a one-time
        # cost like the session start: excluded, and shown. Every batch, the first included, counts.
        return self.run_s - self.query_start_s


def run_engine(engine: Runner, *, busy_core: bool) -> EngineRun:
    hog = None
    if busy_core:
        hog = multiprocessing.Process(target=_burn, args=(time.time() + 3600,), daemon=True)
        hog.start()
    t0 = time.perf_counter()
    engine.quality_gates(list(engine.config.tables))  # run() loads them again, from GX's cache
    suites_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = engine.run(progress=lambda table, record, result: console.print(
        f"  {table}: batch {record.batch_id} {record.received} records {record.total_ms} ms"
        f" (decode {record.decode_ms}, apply {record.apply_ms}, quality {record.quality_status})")
        if record else None)
    ended = time.perf_counter()
    run_s = ended - t0
    if hog is not None:
        hog.terminate()
    records = [b for t in report.tables.values() for b in t.batches]
    quarantined = sum(b.quarantined for b in records)
    # Rows a suite holds back are not in the table: the tables are compared only without them.
    ok = not report.failed and (quarantined > 0 or all(v.ok for v in verify_all(engine.config)))
    phases = None
    if engine.config.source.queries == 1:
        # Every table of the query sees the same micro-batch: its decode once, its tables side by side.
        by_batch: dict[int, tuple[int, int]] = {}
        for b in records:
            _, applying = by_batch.get(b.batch_id, (0, 0))
            by_batch[b.batch_id] = (b.decode_ms, max(applying, b.total_ms - b.decode_ms))
        decode_s = sum(d for d, _ in by_batch.values()) / 1000
        apply_s = sum(a for _, a in by_batch.values()) / 1000
        phases = (decode_s, apply_s)
    return EngineRun(run_s=run_s, query_start_s=report.startup_seconds or 0.0, phases=phases,
                     batches=[b.total_ms / 1000 for b in records],
                     firsts=[t.batches[0].total_ms / 1000 for t in report.tables.values() if t.batches],
                     failed=len(report.failed), ok=ok, quarantined=quarantined,
                     suites_s=suites_s, span=(report.started + (report.startup_seconds or 0.0), ended),
                     on_driver=report.on_driver)


def cpu_rows(row: Any, meter: CpuMeter, bare_span: tuple[float, float] | None, run: EngineRun, *,
             busy_core: bool) -> None:
    """Where the CPU went: the bare script's run, and the engine's batches (its query start excluded)."""
    if not meter.samples:
        return
    engine_cpu = meter.between(*run.span)
    bare_cpu = meter.between(*bare_span) if bare_span else None

    def spent(cpu: dict[str, float] | None, wall: float) -> str:
        return f"{sum(cpu[k] for k in KINDS):.1f} s ({sum(cpu[k] for k in KINDS) / wall:.2f} cores)" if cpu else "-"

    for kind in KINDS:
        row(f"CPU: {kind}" + (" (JIT compiler threads)" if kind == "Spark JVM" else ""),
            f"{bare_cpu[kind]:.1f} s" if bare_cpu else "-",
            f"{engine_cpu[kind]:.1f} s" + (f" ({engine_cpu['JIT']:.1f} s)" if kind == "Spark JVM" else ""))
    row("CPU in all" + (" (the busy core's burner not counted)" if busy_core else ""),
        spent(bare_cpu, bare_span[1] - bare_span[0]) if bare_span else "-",
        spent(engine_cpu, run.span[1] - run.span[0]))


def p50_p95(batches: list[float]) -> str:
    return f"{statistics.median(batches):.2f} / {nearest_rank(batches, .95):.2f} s" if batches else "-"


@dataclass
class Baselines:
    """What the bare scripts measured (each ``None`` or empty when not run)."""

    seconds: float | None = None
    ok: bool | None = None
    batches: list[float] = field(default_factory=list)
    span: tuple[float, float] | None = None
    spark_seconds: float | None = None  # bare.py --spark: the bare script with delta-spark's MERGE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="max records per micro-batch and table")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work"))
    parser.add_argument("--engine", choices=["delta-rs", "delta-spark"], default="delta-rs",
                        help="the apply engine of every table (target.engine)")
    parser.add_argument("--plan-on", choices=["driver", "executors"], default="driver",
                        help="where every table's batches are worked on (target.plan_on; executors needs delta-spark)")
    parser.add_argument("--queries", type=int, default=1,
                        help="streaming queries the tables share (source.queries); as many as tables: one each")
    parser.add_argument("--source", choices=["embedded", "kafka"], default="embedded",
                        help="where the engine reads the records: the embedded log or the stack's Kafka broker")
    parser.add_argument("--kafka-reader", choices=["spark", "python"], default=None,
                        help="with --source kafka: source.kafka.reader (default: the configuration's default)")
    parser.add_argument("--driver-seconds", type=float, default=0.0,
                        help="source.driver_seconds: a backlog the driver expects to apply within this long is "
                             "applied without starting Spark (default 0: through Spark, whatever the backlog)")
    parser.add_argument("--busy-core", action="store_true", help="keep one core busy while the engine runs")
    parser.add_argument("--jit", choices=["auto", "quick", "full"], default="auto",
                        help="the driver JVM's JIT compiler (spark.jit)")
    parser.add_argument("--spark-conf", action="append", default=[], type=spark_jobs.setting, metavar="KEY=VALUE",
                        help="a Spark setting for the engine's session (spark.conf in the configuration); repeatable")
    parser.add_argument("--jobs", action="store_true",
                        help="write Spark's event log and print the engine's Spark jobs by kind (spark_jobs.py)")
    parser.add_argument("--bare-spark", action="store_true",
                        help="also run the bare script with delta-spark's MERGE (bare.py --spark) and compare")
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--quality", action="store_true",
                        help="run the engine again with the demo's suites and report what validation adds")
    parser.add_argument("--validate-on", action="append", choices=["auto", "driver", "spark"],
                        help="with --quality: where the suites validate (quality.validate_on; default: the "
                             "demo's); repeat to run the engine once per side, each warm, and compare them")
    args = parser.parse_args()
    if args.validate_on and not args.quality:
        parser.error("--validate-on needs --quality")
    if args.source == "kafka" and args.quality:
        parser.error("--quality reads the embedded log: run it without --source kafka")

    variant = changed_options(parser, args, ignore=("workdir",))  # names its result file
    t0 = time.perf_counter()
    settings = dict(args.spark_conf)
    event_log = None
    if args.jobs:
        event_log = (args.workdir / "eventlog" / time.strftime("%Y%m%dT%H%M%S")).resolve()
        event_log.mkdir(parents=True)
        settings |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log.as_uri()}
    config, config_checked = workload(args.workdir, args.format, args.events, args.batch, args.engine,
                                      args.queries, args.jit, settings, args.plan_on, args.driver_seconds)
    log = TopicLog(config.log_dir)
    records = sum(sum(log.end_offsets(t.topic).values()) for t in config.tables)
    console.print(f"workload: {records:,} records ({args.format}) ready in {time.perf_counter() - t0:.0f} s")
    truth = Truth.load(truth_dir(config))
    # Both read the log from the page cache: a cold first read would slow whichever runs first.
    for path in sorted(Path(config.log_dir).rglob("*.arrow")):
        path.read_bytes()

    stack, started = None, []
    if args.source == "kafka":
        from harness.stack import Stack

        stack = Stack.from_env()
        started = [name for name, seconds in stack.up(["kafka", "registry"]).items() if seconds > 0]
    bare_log: Any = log
    try:
        if stack is not None:
            config, ids = kafka_config(config, stack, console.print, reader=args.kafka_reader)
            bare_log = KafkaLog(stack.bootstrap_servers(), ids)
        base = Baselines()
        meter = CpuMeter().start()
        if not args.skip_bare:
            console.print("bare baseline: running" + (" (reading Kafka with librdkafka)" if stack else ""))
            root = config.workdir / "bare-tables"
            tables = [(t.name, t.topic, truth.key_columns[t.name]) for t in config.tables]
            t0 = time.perf_counter()
            base.batches = bare.run(tables, log=bare_log, value_format=args.format,
                                    registry_dir=config.registry_dir, root=root, batch=args.batch)
            base.span = (t0, time.perf_counter())
            base.seconds = base.span[1] - t0
            base.ok = all(verify_table(n, root / n, truth.tables[n], k).ok for n, _, k in tables)
            console.print(f"bare baseline: {base.seconds:.1f} s, {len(base.batches)} batches, "
                          f"equal to source: {base.ok}")
        if args.bare_spark:
            base.spark_seconds = bare_spark(args.batch, config, truth)
        compare(args, config, config_checked, records, base, meter, event_log, variant)
    finally:
        if isinstance(bare_log, KafkaLog):
            bare_log.close()
        if stack is not None and started:
            stack.down(started)


def bare_spark(batch: int, config: IngestConfig, truth: Truth) -> float:
    """The bare script with delta-spark's MERGE (``bare.py --spark``), in a process and JVM of its own
    so that neither it nor the engine runs on a JVM the other warmed up; its session start excluded.
    Returns its seconds, the sum of its batches'."""
    import json
    import subprocess

    root = config.workdir / "bare-spark-tables"
    shutil.rmtree(root, ignore_errors=True)
    console.print("bare baseline, delta-spark MERGE: running (a process of its own)")
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("bare.py")), "--spark",
                           str(config.workdir / "bench.yaml"), "--root", str(root), "--batch", str(batch)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bare.py --spark failed:\n{done.stderr[-3000:]}")
    batches = json.loads(done.stdout.strip().splitlines()[-1])["batches"]
    ok = all(verify_table(t.name, root / t.name, truth.tables[t.name], truth.key_columns[t.name]).ok
             for t in config.tables)
    console.print(f"bare baseline, delta-spark MERGE: {sum(batches):.1f} s, {len(batches)} batches, "
                  f"equal to source: {ok}")
    if not ok:
        raise SystemExit("the bare script with delta-spark's MERGE did not end equal to the source")
    return float(sum(batches))


def compare(args: argparse.Namespace, config: IngestConfig, config_checked: IngestConfig, records: int,
            base: Baselines, meter: CpuMeter, event_log: Path | None, variant: dict[str, Any]) -> None:
    """Run the engine (and with ``--quality`` its checked runs), then print the table and the ratio."""
    engine = Runner(config)
    t0 = time.perf_counter()
    if not config.source.driver_seconds:  # a run that may stay on the driver starts Spark only if it must
        engine.spark  # noqa: B018 -- the one-time session start is not measured
    start_s = time.perf_counter() - t0
    settings = "".join(f", {key}={value}" for key, value in args.spark_conf)
    console.print(f"engine ({args.engine}{settings}): running")
    run = run_engine(engine, busy_core=args.busy_core)
    meter.stop()  # the CPU figures are the first run's (with --quality, the runs after it are not metered)
    jvm = jvm_peak_mb(engine)
    plain_again = None
    by_side: dict[str, EngineRun] = {}  # the runs with suites, by where they validated, in run order
    if args.quality:
        for n, side in enumerate(args.validate_on or [config_checked.quality.validate_on]):
            console.print(f"engine with the demo's suites, validate_on: {side}: running")
            if n:  # each side writes the same tables, checkpoints and results afresh
                for directory in (config_checked.tables_root, config_checked.checkpoint_root,
                                  config_checked.quality_results_dir):
                    shutil.rmtree(directory, ignore_errors=True)
            on_side = config_checked.model_copy(
                update={"quality": config_checked.quality.model_copy(update={"validate_on": side})})
            by_side[side] = run_engine(Runner(on_side, spark=engine.spark), busy_core=args.busy_core)
        # The first run also warmed the JVM up: the suites are compared with a second run without them.
        for directory in (config.tables_root, config.checkpoint_root):
            shutil.rmtree(directory, ignore_errors=True)
        console.print("engine without suites, again (warm, like the run with suites): running")
        plain_again = run_engine(Runner(config, spark=engine.spark), busy_core=args.busy_core)
    checked = next(iter(by_side.values()), None)  # the table's column: the first side's run

    out = Table(title=f"{records:,} {args.format} records, batches of <= {args.batch:,} per table"
                      + (" (one core kept busy)" if args.busy_core else ""))
    for col in ("measure", "bare script", "engine") + (("engine with suites",) if checked else ()):
        out.add_column(col, justify="right" if col != "measure" else "left")

    def row(measure: str, bare_value: str, value: str, checked_value: str = "-") -> None:
        out.add_row(measure, bare_value, value, *((checked_value,) if checked else ()))

    def rate(r: EngineRun) -> str:
        return f"{records / r.engine_s:,.0f} rec/s"

    bare_s = base.seconds
    row("wall time", f"{bare_s:.1f} s" if bare_s else "-", f"{run.engine_s:.1f} s",
        f"{checked.engine_s:.1f} s" if checked else "-")
    row("throughput", f"{records / bare_s:,.0f} rec/s" if bare_s else "-", rate(run), rate(checked) if checked else "-")
    row("batches", str(len(base.batches)) if base.batches else "-", str(len(run.batches)),
        str(len(checked.batches)) if checked else "-")
    row("batch p50 / p95", p50_p95(base.batches), p50_p95(run.batches), p50_p95(checked.batches) if checked else "-")
    if run.phases:
        row("in batches: decode / apply, overlapping (s)", "-",
            " / ".join(f"{v:.1f}" for v in run.phases),
            " / ".join(f"{v:.1f}" for v in checked.phases) if checked and checked.phases else "-")
    row("first batch / median (per table, worst)", "-",
        f"{max(run.firsts) / statistics.median(run.batches):.2f}x" if run.batches else "-")
    row("failed queries", "-", str(run.failed), str(checked.failed) if checked else "-")
    if checked:
        row("rows held back by the suites", "-", "-", str(checked.quarantined))
    cpu_rows(row, meter, base.span, run, busy_core=args.busy_core)
    row("Python driver peak RSS", "-", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    row("Spark JVM peak RSS", "-", f"{jvm:.0f} MB" if jvm else "?")
    row("Spark session start and worker warm-up (excluded)", "-",
        "not started" if run.on_driver else f"{start_s:.1f} s" if start_s > 0.05 else "in the run")
    if checked:
        row("loading the suites, GX's import (excluded)", "-", "-", f"{checked.suites_s:.1f} s")
    row("streaming query start, before the first batch (excluded)", "-", f"{run.query_start_s:.1f} s",
        f"{checked.query_start_s:.1f} s" if checked else "-")
    row("tables equal to the source", str(base.ok) if base.ok is not None else "-", str(run.ok),
        str(checked.ok) if checked else "-")
    console.print(out)
    if event_log is not None:  # every run of this process, the session's warm-up included
        console.print(spark_jobs.table(spark_jobs.job_kinds(event_log),
                                       f"the engine's Spark jobs by kind ({event_log})"))
    if checked and plain_again:
        console.print(f"warm run without suites: {plain_again.engine_s:.1f} s, batch p50 / p95 "
                      f"{p50_p95(plain_again.batches)}, tables equal to the source: {plain_again.ok}")
        plain_median = statistics.median(plain_again.batches)
        for side, done in by_side.items():
            console.print(f"quality (validate_on: {side}): {done.engine_s:.1f} s, batch p50 / p95 "
                          f"{p50_p95(done.batches)}, adds {done.engine_s / plain_again.engine_s - 1:+.1%} (total) "
                          f"and {statistics.median(done.batches) / plain_median - 1:+.1%} (median batch) "
                          f"to the warm run without suites; tables equal to the source: {done.ok}")
    if bare_s:
        console.print(f"ratio counting the session and query start: {bare_s / (start_s + run.run_s):.2f}")
        console.print(f"ratio counting the query start too: {(records / run.run_s) / (records / bare_s):.2f}")
        console.print(f"ratio engine/bare: {(records / run.engine_s) / (records / bare_s):.2f}")
    if base.spark_seconds:
        if bare_s:
            console.print(f"ratio bare with delta-spark MERGE / bare: {bare_s / base.spark_seconds:.2f}")
        console.print(f"ratio engine / bare with delta-spark MERGE: {base.spark_seconds / run.engine_s:.2f}")
    ok = run.ok and base.ok is not False and all(r.ok for r in (plain_again, *by_side.values()) if r is not None)
    figures = result_figures(records, base, run, meter, jvm, start_s, plain_again, by_side, ok)
    console.print(f"result: {write_result('bench_compare', variant, figures)}")
    raise SystemExit(0 if ok else 1)


def result_figures(records: int, base: Baselines, run: EngineRun, meter: CpuMeter, jvm: float | None,
                   start_s: float, plain_again: EngineRun | None, by_side: dict[str, EngineRun],
                   ok: bool) -> list[Figure]:
    """The printed table's main figures, for the result file (``benchmarks/record.py``)."""
    bare_s = base.seconds
    figures = [
        Figure("records", records),
        Figure("engine: applied on the driver, without Spark", run.on_driver),
        Figure("bare script: wall time", round(bare_s, 2) if bare_s else None, "s"),
        Figure("engine: wall time (batches)", round(run.engine_s, 2), "s"),
        Figure("bare script: batches", len(base.batches) if base.batches else None),
        Figure("engine: batches", len(run.batches)),
        Figure("engine: batch p50", round(statistics.median(run.batches), 2) if run.batches else None, "s"),
        Figure("engine: batch p95", round(nearest_rank(run.batches, .95), 2) if run.batches else None, "s"),
        Figure("engine: first batch / median batch (per table, worst)",
               round(max(run.firsts) / statistics.median(run.batches), 2) if run.batches else None, "x"),
        Figure("engine: failed queries", run.failed),
    ]
    if meter.samples:
        engine_cpu = meter.between(*run.span)
        figures.append(Figure("engine: CPU in all", round(sum(engine_cpu[k] for k in KINDS), 1), "s"))
        if base.span:
            bare_cpu = meter.between(*base.span)
            figures.append(Figure("bare script: CPU in all", round(sum(bare_cpu[k] for k in KINDS), 1), "s"))
    figures += [
        Figure("Python driver peak RSS", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "MB"),
        Figure("Spark JVM peak RSS", round(jvm) if jvm else None, "MB"),
        Figure("Spark session start (excluded)", round(start_s, 1), "s"),
        Figure("streaming query start (excluded)", round(run.query_start_s, 1), "s"),
    ]
    if bare_s:
        figures += [Figure("ratio engine/bare", round((records / run.engine_s) / (records / bare_s), 2)),
                    Figure("ratio counting the query start too", round((records / run.run_s) / (records / bare_s), 2)),
                    Figure("ratio counting the session and query start", round(bare_s / (start_s + run.run_s), 2))]
    if base.spark_seconds:
        figures += [Figure("bare script with delta-spark's MERGE: wall time", round(base.spark_seconds, 2), "s"),
                    Figure("ratio engine / bare with delta-spark MERGE", round(base.spark_seconds / run.engine_s, 2))]
    if plain_again and plain_again.batches:
        plain_median = statistics.median(plain_again.batches)
        figures.append(Figure("warm run without suites: wall time", round(plain_again.engine_s, 2), "s"))
        for side, done in by_side.items():
            figures += [Figure(f"suites validated on {side}: add to the total",
                               round(100 * (done.engine_s / plain_again.engine_s - 1), 1), "%"),
                        Figure(f"suites validated on {side}: add to the median batch",
                               round(100 * (statistics.median(done.batches) / plain_median - 1), 1), "%")]
    figures.append(Figure("tables equal to the source", ok))
    return figures


if __name__ == "__main__":
    main()
