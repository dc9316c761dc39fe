"""Validating winners that are on Spark: with GX's Spark engine, or collected and validated on the driver.

Not a test. With ``target.plan_on: executors`` a batch's winners are a Spark DataFrame, and the
quality gate validates them there (``check_frame``), unless they are at most
``quality.driver_rows``: then it collects them in one Spark job and validates them with pandas.
This script times both ways on the same persisted frames of the demo's ``orders`` winners (the
demo suite, ``expectations/orders.json``; one value in 500 breaks it, so the failing rows are
named and held), for each size in ``--sizes``, taking turns round by round, and counts the Spark
jobs each way runs. It prints the median seconds per batch of each way, their ratio and the jobs,
and writes them to ``benchmarks/results/``. Its default bound, 100,000 rows, is the largest size
measured here.

    .venv/bin/python benchmarks/bench_gate_on_spark.py [--sizes 1000,10000,100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa
from bench_quality import ORDERS, STATUSES, SUITES
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.config import TableSpec
from ingest.quality import QualityGate, ResultStore, load_suite
from ingest.spark.session import arrow_frame, get_spark

console = Console()
WAYS = ("spark", "driver")


def winners(rows: int) -> pa.Table:
    """``rows`` reduced ``orders`` winners, one per key, as the executors' reduction leaves them."""
    quantity = [-(1 + k % 20) if k % 500 == 7 else 1 + k % 20 for k in range(rows)]
    price = [Decimal(100 + k % 9000).scaleb(-2) for k in range(rows)]
    status = [STATUSES[k % 4] for k in range(rows)]
    return pa.table({
        "_cdc_op": pa.array(["u"] * rows), "_cdc_key_columns": pa.array([json.dumps(["id"])] * rows),
        "id": pa.array(range(rows), pa.int64()),
        "customer_id": pa.array([1 + k % 400 for k in range(rows)], pa.int32()),
        "product_id": pa.array([1 + k % 80 for k in range(rows)], pa.int32()),
        "quantity": pa.array(quantity, pa.int16()), "unit_price": pa.array(price, pa.decimal128(10, 2)),
        "amount": pa.array([p * q for p, q in zip(price, quantity, strict=True)], pa.decimal128(12, 2)),
        "status": pa.array(status), "ordered_at": pa.array([datetime(2026, 1, 1)] * rows, pa.timestamp("us")),
        "ship_date": pa.array([date(2026, 1, 3) if s == "shipped" else None for s in status], pa.date32()),
        "note": pa.nulls(rows, pa.string()),
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000", help="winners per batch, comma separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = get_spark()
    tracker = spark.sparkContext.statusTracker()
    spec = TableSpec(name="orders", topic="orders", expectations="orders", quality_policy="quarantine")
    suite = load_suite(SUITES, "orders")
    figures: list[Figure] = []
    table = Table("winners", "GX on Spark (s)", "collected, on the driver (s)", "driver / Spark", "Spark jobs each way")
    with tempfile.TemporaryDirectory() as scratch:
        for size in (int(s) for s in args.sizes.split(",")):
            frame = arrow_frame(spark, winners(size)).persist()
            frame.count()
            gates = {way: QualityGate(spec, suite, results=ResultStore(Path(scratch) / way / str(size)), spark=spark,
                                      driver_rows=size if way == "driver" else 0) for way in WAYS}
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            jobs: dict[str, int] = {}
            held: dict[str, int] = {}
            for n in range(args.rounds + 1):  # round 0 warms both ways up and is not counted
                for way in WAYS if n % 2 else reversed(WAYS):
                    before, started = max(tracker.getJobIdsForGroup() or [0]), time.perf_counter()
                    report, _ = gates[way].check_frame(frame, ORDERS, ("id",), batch_id=n, run_id="bench")
                    if n:
                        times[way].append(time.perf_counter() - started)
                    jobs[way], held[way] = max(tracker.getJobIdsForGroup() or [0]) - before, len(report.held)
                    console.print(f"{size:>7} winners, round {n}, {way}: {time.perf_counter() - started:.2f} s, "
                                  f"{jobs[way]} jobs, {held[way]} held")
            frame.unpersist()
            assert held["spark"] == held["driver"] > 0, held  # the same rows held either way
            spark_s, driver_s = statistics.median(times["spark"]), statistics.median(times["driver"])
            table.add_row(f"{size:,}", f"{spark_s:.2f}", f"{driver_s:.2f}", f"{driver_s / spark_s:.2f}",
                          f"{jobs['spark']} / {jobs['driver']}")
            figures += [Figure(f"{size} winners: GX on Spark", round(spark_s, 2), "s"),
                        Figure(f"{size} winners: on the driver", round(driver_s, 2), "s"),
                        Figure(f"{size} winners: driver / Spark", round(driver_s / spark_s, 2)),
                        Figure(f"{size} winners: Spark jobs on Spark", jobs["spark"]),
                        Figure(f"{size} winners: Spark jobs on the driver", jobs["driver"])]
    console.print(table)
    console.print(f"result: {write_result('bench_gate_on_spark', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
