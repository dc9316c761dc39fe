"""The engine against a bare single-process script, side by side on the same records (not a test).

Generates one simulated workload (snapshot, updates, deletes, duplicates, cross-partition
reordering, a truncate, an added and a widened column, TOAST placeholders), applies it with the bare
baseline (``benchmarks/bare.py``: json or fastavro + Arrow + delta-rs MERGE, no Spark) and with the
engine (``ingest.engine.Engine``, no quality suites, as the bare script has none), verifies both
against the simulator's truth, and prints a table. The engine's one-time Spark session start and
the start of its streaming queries are excluded (and shown); every batch, the first included,
counts. The last line is
``ratio engine/bare: X.XX`` (the engine's throughput divided by the baseline's).

    .venv/bin/python benchmarks/bench_compare.py --format json --events 200000 --batch 20000
    .venv/bin/python benchmarks/bench_compare.py --format avro --busy-core   # a CPU hog beside the engine

Driver memory: the Python driver's peak RSS (``ru_maxrss``) and the Spark JVM's (``VmHWM``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bare

from ingest.config import IngestConfig, load_config
from ingest.engine import Engine
from ingest.proof.demo import prepare_workload, truth_dir, verify_all
from ingest.proof.simulator import Truth
from ingest.proof.verify import verify_table
from ingest.source.topiclog import TopicLog

console = Console()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def workload(root: Path, value_format: str, events: int, batch: int) -> IngestConfig:
    """The workload's config (no expectations suites), generated once per format and size."""
    workdir = (root / f"{value_format}-{events}").resolve()
    raw = yaml.safe_load(Path("configs/demo.yaml").read_text())
    raw["workdir"] = str(workdir)
    raw["quality"]["expectations_dir"] = str(Path("expectations").resolve())
    raw["source"]["value_format"] = value_format
    raw["source"]["max_records_per_batch"] = batch
    for table in raw["tables"]:
        for key in ("expectations", "quality_policy", "expectation_policies"):
            table.pop(key, None)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    prepare_workload(config, events=events, seed=11, malformed_fraction=0.0)
    for leftover in (config.tables_root, config.checkpoint_root, workdir / "bare-tables"):
        shutil.rmtree(leftover, ignore_errors=True)
    return config


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def jvm_peak_mb(engine: Engine) -> float | None:
    proc = getattr(engine.spark.sparkContext._gateway, "proc", None)
    if proc is None:
        return None
    status = Path(f"/proc/{proc.pid}/status")
    for line in status.read_text().splitlines() if status.exists() else []:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="max records per micro-batch and table")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work"))
    parser.add_argument("--busy-core", action="store_true", help="keep one core busy while the engine runs")
    parser.add_argument("--skip-bare", action="store_true")
    args = parser.parse_args()

    t0 = time.perf_counter()
    config = workload(args.workdir, args.format, args.events, args.batch)
    log = TopicLog(config.log_dir)
    records = sum(sum(log.end_offsets(t.topic).values()) for t in config.tables)
    console.print(f"workload: {records:,} records ({args.format}) ready in {time.perf_counter() - t0:.0f} s")
    truth = Truth.load(truth_dir(config))
    # Both read the log from the page cache: a cold first read would slow whichever runs first.
    for path in sorted(Path(config.log_dir).rglob("*.arrow")):
        path.read_bytes()

    bare_s = bare_ok = None
    bare_batches: list[float] = []
    if not args.skip_bare:
        console.print("bare baseline: running")
        root = config.workdir / "bare-tables"
        tables = [(t.name, t.topic, truth.key_columns[t.name]) for t in config.tables]
        t0 = time.perf_counter()
        bare_batches = bare.run(tables, log=log, value_format=args.format, registry_dir=config.registry_dir,
                                root=root, batch=args.batch)
        bare_s = time.perf_counter() - t0
        bare_ok = all(verify_table(n, root / n, truth.tables[n], k).ok for n, _, k in tables)
        console.print(f"bare baseline: {bare_s:.1f} s, {len(bare_batches)} batches, equal to source: {bare_ok}")

    engine = Engine(config)
    t0 = time.perf_counter()
    engine.spark  # noqa: B018 -- the one-time session start is not measured
    start_s = time.perf_counter() - t0
    hog = None
    if args.busy_core:
        hog = multiprocessing.Process(target=_burn, args=(time.time() + 3600,), daemon=True)
        hog.start()
    console.print("engine: running")
    t0 = time.perf_counter()
    report = engine.run(progress=lambda table, record, result: console.print(
        f"  {table}: batch {record.batch_id} {record.received} records {record.total_ms} ms"
        f" (decode {record.decode_ms}, apply {record.apply_ms})") if record else None)
    run_s = time.perf_counter() - t0
    # Starting the streaming queries (the source's Python runner, the first plan) is a one-time cost
    # like the session start: excluded, and shown. Every batch, the first included, counts.
    query_start_s = report.startup_seconds or 0.0
    engine_s = run_s - query_start_s
    if hog is not None:
        hog.terminate()
    engine_ok = all(v.ok for v in verify_all(config)) and not report.failed
    batches = [b.total_ms / 1000 for t in report.tables.values() for b in t.batches]
    firsts = [t.batches[0].total_ms / 1000 for t in report.tables.values() if t.batches]

    out = Table(title=f"{records:,} {args.format} records, batches of <= {args.batch:,} per table"
                      + (" (one core kept busy)" if args.busy_core else ""))
    for col in ("measure", "bare script", "engine"):
        out.add_column(col, justify="right" if col != "measure" else "left")
    out.add_row("wall time", f"{bare_s:.1f} s" if bare_s else "-", f"{engine_s:.1f} s")
    out.add_row("throughput", f"{records / bare_s:,.0f} rec/s" if bare_s else "-", f"{records / engine_s:,.0f} rec/s")
    out.add_row("batches", str(len(bare_batches)) if bare_batches else "-", str(len(batches)))
    if bare_batches:
        out.add_row("batch p50 / p95", f"{statistics.median(bare_batches):.2f} / {percentile(bare_batches, .95):.2f} s",
                    f"{statistics.median(batches):.2f} / {percentile(batches, .95):.2f} s")
    else:
        out.add_row("batch p50 / p95", "-", f"{statistics.median(batches):.2f} / {percentile(batches, .95):.2f} s")
    out.add_row("first batch / median (per table, worst)", "-",
                f"{max(firsts) / statistics.median(batches):.2f}x" if batches else "-")
    out.add_row("failed queries", "-", str(len(report.failed)))
    out.add_row("Python driver peak RSS", "-", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    jvm = jvm_peak_mb(engine)
    out.add_row("Spark JVM peak RSS", "-", f"{jvm:.0f} MB" if jvm else "?")
    out.add_row("Spark session start and worker warm-up (excluded)", "-", f"{start_s:.1f} s")
    out.add_row("streaming query start, before the first batch (excluded)", "-", f"{query_start_s:.1f} s")
    out.add_row("tables equal to the source", str(bare_ok) if bare_ok is not None else "-", str(engine_ok))
    console.print(out)
    if bare_s:
        console.print(f"ratio counting the query start too: {(records / run_s) / (records / bare_s):.2f}")
        console.print(f"ratio engine/bare: {(records / engine_s) / (records / bare_s):.2f}")
    raise SystemExit(0 if engine_ok and bare_ok is not False else 1)


if __name__ == "__main__":
    main()
