"""Throughput and per-batch latency of the ingestion engine on a simulated workload.

Not a test: it measures. Generates the simulator workload (default 200k events) into a scratch
workdir, ingests it with ``available_now`` and reports events/s and the median and p95 of the
per-batch latency (decode + apply + commit, from the audit table).

    .venv/bin/python benchmarks/bench_ingest.py [--events 200000] [--batch 20000] [--workdir bench-work]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import yaml
from harness.demo import prepare_workload, verify_all
from harness.latency import nearest_rank
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.config import load_config
from ingest.stream.runner import Runner

console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=20_000, help="max records per micro-batch and table")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work"))
    args = parser.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    raw = yaml.safe_load(Path("configs/demo.yaml").read_text())
    raw["workdir"] = str(args.workdir.resolve())
    # The config is written elsewhere: keep its suites where demo.yaml points.
    raw["quality"]["expectations_dir"] = str(Path("expectations").resolve())
    raw["source"]["max_records_per_batch"] = args.batch
    raw["source"]["driver_seconds"] = 0  # the Spark engine's throughput: never the driver alone
    cfg_path = args.workdir / "bench.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    config = load_config(cfg_path)

    t0 = time.perf_counter()
    prepare_workload(config, events=args.events, seed=11, malformed_fraction=0.0)
    generate_s = time.perf_counter() - t0

    engine = Runner(config)
    t0 = time.perf_counter()
    engine.spark  # noqa: B018 -- start the session outside the measured window
    startup_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    report = engine.run()
    run_s = time.perf_counter() - t0

    batches = [b for t in report.tables.values() for b in t.batches]
    received = sum(b.received for b in batches)
    latencies = [b.total_ms / 1000 for b in batches]
    ok = all(v.ok for v in verify_all(config))

    out = Table(title=f"Ingestion benchmark: {args.events} simulated events, batches of <= {args.batch} per table")
    out.add_column("measure")
    out.add_column("value", justify="right")
    out.add_row("messages ingested", f"{received}")
    out.add_row("micro-batches (table batches)", f"{len(batches)}")
    out.add_row("wall time of the run", f"{run_s:.1f} s")
    out.add_row("throughput", f"{received / run_s:,.0f} events/s")
    out.add_row("batch latency median", f"{statistics.median(latencies):.2f} s")
    out.add_row("batch latency p95", f"{nearest_rank(latencies, 0.95):.2f} s")
    out.add_row("Spark session start (excluded)", f"{startup_s:.1f} s")
    out.add_row("workload generation (excluded)", f"{generate_s:.1f} s")
    out.add_row("tables equal to source", "yes" if ok else "NO")
    console.print(out)
    figures = [Figure("messages ingested", received), Figure("micro-batches (table batches)", len(batches)),
               Figure("wall time of the run", round(run_s, 1), "s"),
               Figure("throughput", round(received / run_s), "events/s"),
               Figure("batch latency median", round(statistics.median(latencies), 2), "s"),
               Figure("batch latency p95", round(nearest_rank(latencies, 0.95), 2), "s"),
               Figure("Spark session start (excluded)", round(startup_s, 1), "s"),
               Figure("workload generation (excluded)", round(generate_s, 1), "s"),
               Figure("tables equal to source", ok)]
    console.print(f"result: {write_result('bench_ingest', changed_options(parser, args, ['workdir']), figures)}")
    raise SystemExit(0 if ok and not report.failed else 1)


if __name__ == "__main__":
    main()
