"""Continuous-mode latency on the real stack: PostgreSQL commit -> row visible in Delta, per load rate.

Not a test: it measures. Per target rate (default 500, 2,000 and 5,000 row changes/s), on a fresh
schema (``benchlat``) and fresh tables:

1. reset the schema and its topics, write a small catalog (customers, products);
2. start ``ingest run --continuous`` on the stack (Avro through the registry's basic-auth port, or
   ``--format json``) and wait until it has caught up with the catalog;
3. run the load generator (:class:`harness.postgres.load.LoadGenerator`) in ``ceil(rate / per-generator)``
   processes, each with its own connection, for ``warmup + measure`` seconds;
4. wait until Debezium has captured everything and the tables have applied their topics (the
   backlog, if the engine fell behind, is drained and timed), then stop the engine;
5. report the achieved source rate (changes PostgreSQL committed / load seconds), the engine's
   throughput (Kafka records the engine received per second in the measurement window, from the
   audit), and the latency p50/p95/p99 of every ``order_items`` row (inserted, never updated by the
   generator) whose source commit fell in the measurement window:
   ``commit time of the first Delta version holding the row's offset - _cdc_source_ts``
   (:mod:`harness.latency`).

    .venv/bin/python benchmarks/bench_latency.py [--rates 500,2000,5000] [--warmup 20] [--measure 60]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path

from harness.latency import CommitIndex, row_latencies
from harness.postgres.load import LoadGenerator, LoadReport
from harness.postgres.workload import WorkloadSpec, run_workload
from harness.stack_proofs.setup import engine_environment, reset_source, stack_config
from harness.torture.process import IngestProcess
from rich.console import Console
from rich.table import Table

from ingest.config import load_config
from ingest.records import audit
from ingest.verify.capture import wait_for_capture
from ingest.verify.source_db import wait_for_tables

console = Console(width=170)  # the table is the result: never wrapped to a pipe's 80 columns
SCHEMA = "benchlat"


@dataclass
class RateResult:
    """One rate's figures."""

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


def _generate(dsn: str, rate: float, duration: float, seed: int, start_at: float) -> LoadReport:
    """One generator process: wait for the common start, then write ``rate`` changes/s for ``duration`` s."""
    time.sleep(max(0.0, start_at - time.time()))
    return LoadGenerator(dsn, rate=rate, duration=duration, seed=seed, schema=SCHEMA,
                         application_name=f"bench-latency-{seed}").run()


def measure(stack: object, rate: float, args: argparse.Namespace) -> RateResult:
    """Run one rate (see the module docstring)."""
    dsn = stack.pg_dsn()  # type: ignore[attr-defined]
    workdir = args.workdir / f"rate-{int(rate)}"
    shutil.rmtree(workdir, ignore_errors=True)
    reset_source(stack, SCHEMA, say=console.print)
    run_workload(dsn, WorkloadSpec(seed=5, scale=0.05, schema=SCHEMA))
    config_path = stack_config(stack, workdir, value_format=args.format, schema=SCHEMA)
    config = load_config(config_path)
    process = IngestProcess(config_path, workdir / "logs", engine_environment(stack))
    process.start()
    try:
        catch_up = wait_for_tables(config, list(config.tables), wait=600, say=console.print)
        if not catch_up.ok:
            raise SystemExit(f"the engine did not catch up with the catalog: {catch_up.problem}\n{process.tail()}")
        generators = max(1, math.ceil(rate / args.per_generator))
        duration = args.warmup + args.measure
        start_at = time.time() + 3.0
        console.print(f"rate {rate:.0f}/s: {generators} generator process(es) for {duration:.0f} s")
        with ProcessPoolExecutor(generators, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_generate, dsn, rate / generators, duration, 100 + i, start_at)
                       for i in range(generators)]
            reports = [f.result() for f in futures]
        load_end = time.time()
        capture = wait_for_capture(dsn, timeout=600, say=console.print)
        drained = wait_for_tables(config, list(config.tables), wait=900, say=console.print)
        drain_seconds = time.time() - load_end
    finally:
        process.stop(timeout=60)
    since = datetime.fromtimestamp(start_at + args.warmup, UTC)
    until = datetime.fromtimestamp(start_at + duration, UTC)
    items = config.table_path("order_items")
    lat = row_latencies(items, since=since, until=until, index=CommitIndex.of_table(items))
    received = 0
    for spec in config.tables:
        for row in audit.read(config.tables_root / config.target.audit_table, table=spec.name).to_pylist():
            if row["finished_at"] is not None and since <= row["finished_at"] < until:
                received += row["received"]
    committed = sum(r.committed_changes for r in reports)
    seconds = max(r.seconds for r in reports)
    return RateResult(
        target=rate, generators=generators, achieved=committed / seconds,
        per_generator=[r.rate for r in reports], engine_rate=received / args.measure,
        p50=lat.percentile(50), p95=lat.percentile(95), p99=lat.percentile(99), rows=len(lat.values),
        unmatched=lat.unmatched, drain_seconds=drain_seconds, caught_up=capture.ok and drained.ok,
        failed_transactions=sum(r.failed_transactions for r in reports))


def _s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,2000,5000", help="target row changes per second, comma separated")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the window")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds of the measurement window")
    parser.add_argument("--per-generator", type=float, default=600.0,
                        help="target changes/s per generator process (one connection each)")
    parser.add_argument("--format", choices=("avro", "json"), default="avro")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work/latency"))
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()

    from harness.stack import CDC_COMPONENTS, Stack

    stack = Stack.from_env()
    stack.up(CDC_COMPONENTS)
    stack.wait_connectors()
    os.environ.update(stack.engine_env())
    results = [measure(stack, float(r), args) for r in args.rates.split(",")]

    out = Table(title=f"Continuous mode on the stack ({args.format}): PostgreSQL commit -> visible in Delta, "
                      f"order_items rows committed in a {args.measure:.0f} s window after {args.warmup:.0f} s warm-up")
    for col in ("target rate", "generators", "achieved source rate", "per generator", "engine records/s",
                "latency p50", "p95", "p99", "rows measured", "drain after load", "failed tx"):
        out.add_column(col, justify="right")
    for r in results:
        out.add_row(f"{r.target:,.0f}/s", str(r.generators), f"{r.achieved:,.0f}/s",
                    ", ".join(f"{x:.0f}" for x in r.per_generator), f"{r.engine_rate:,.0f}/s",
                    _s(r.p50), _s(r.p95), _s(r.p99), f"{r.rows:,}" + (f" ({r.unmatched} unmatched)" if r.unmatched
                                                                      else ""),
                    f"{r.drain_seconds:.0f} s" + ("" if r.caught_up else " (NOT caught up)"),
                    str(r.failed_transactions))
    console.print(out)
    console.print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
