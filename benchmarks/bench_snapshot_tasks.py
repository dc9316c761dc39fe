"""Delta's snapshot tasks on a local master: its default (50) against one per core (not a test).

``ingest.spark.session.get_spark`` sets ``spark.databricks.delta.snapshotPartitions`` to the local master's
cores. This builds small tables with deletion vectors through the delta-spark engine (a few MERGE
commits each), then maintains them as ``assets.maintenance`` does -- ``OPTIMIZE ... ZORDER BY`` and
``VACUUM ... RETAIN 0 HOURS`` -- in sessions that differ only in that setting, alternating which
goes first, and prints the seconds of each statement.

    .venv/bin/python benchmarks/bench_snapshot_tasks.py --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Figure, changed_options, write_result

from ingest.apply.journey import apply_parts
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.config import TableSpec
from ingest.spark.session import SNAPSHOT_PARTITIONS, get_spark, session_conf
from ingest.spark.sql import ident
from tests.factories import change, decoded_rows
from tests.harness import paths_in

SPEC = TableSpec(name="customers", topic="t")

WAYS = {"Delta's default": "50", "one per core": None}


def _table(spark, root: Path, batches: int) -> str:
    paths = paths_in(root, "customers")
    engine = DeltaSparkWriter(spark)
    for b in range(batches):
        items = ([change("c", 10 * b + k, 10 * b + k, name=f"n{b}") for k in range(3)]
                 + [change("d", 10 * (b - 1), 10 * b + 5)] * (b > 0))
        apply_parts(SPEC, paths, decoded_rows(items, first_offset=10 * b), batch_id=b, run_id="bench", writer=engine)
    return f"delta.{ident(str(paths.table))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=3, help="MERGE commits per table before maintenance")
    args = parser.parse_args()
    console = Console(stderr=True)
    spark = get_spark("local[2]", 2, tuple(sorted(session_conf(["delta-spark"], {}).items())))
    cores = spark.sparkContext.getConf().get(SNAPSHOT_PARTITIONS)
    seconds: dict[tuple[str, str], list[float]] = {}
    order = list(WAYS)
    for round_ in range(args.rounds):
        for way in order if round_ % 2 == 0 else order[::-1]:
            console.print(f"round {round_ + 1}/{args.rounds}: {way}")
            session = spark.newSession()
            session.conf.set(SNAPSHOT_PARTITIONS, WAYS[way] or cores)
            session.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
            session.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", cores)
            name = _table(spark, Path(tempfile.mkdtemp(prefix="bench-snapshot-")), args.batches)
            for statement in (f"OPTIMIZE {name} ZORDER BY (id)", f"VACUUM {name} RETAIN 0 HOURS"):
                started = time.perf_counter()
                session.sql(statement).collect()
                seconds.setdefault((way, statement.split()[0]), []).append(time.perf_counter() - started)
    table = Table(title=f"maintenance of a {args.batches}-commit table with deletion vectors, local[2], "
                        f"median of {args.rounds}")
    table.add_column("statement")
    for way in WAYS:
        table.add_column(f"{way} ({WAYS[way] or cores} tasks)", justify="right")
    figures: list[Figure] = []
    for statement in ("OPTIMIZE", "VACUUM"):
        table.add_row(statement, *(f"{statistics.median(seconds[(way, statement)]):.1f} s" for way in WAYS))
        figures += [Figure(f"{statement}, {way} ({WAYS[way] or cores} tasks)",
                           round(statistics.median(seconds[(way, statement)]), 2), "s") for way in WAYS]
    Console().print(table)
    console.print(f"result: {write_result('bench_snapshot_tasks', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
