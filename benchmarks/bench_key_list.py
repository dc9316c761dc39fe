"""What listing a batch's keys in delta-spark's MERGE condition saves and costs (not a test).

``spark_merge.dialect_for`` lists a random batch's keys (``t.id IN (...)``) when the table is large
enough to repay it. This script gives the figures behind that choice, on one table of ``--rows``
rows (laid out by key, deletion vectors on, as ``bench_merge.py`` builds it):

* **shuffle**: random ``--batch``-key batches through the engine's whole path, the keys listed
  (forced, whatever the table's size), listed with untyped integer literals, and not listed,
  taking turns batch by batch. For each batch,
  its wall time and the bytes its Spark SQL executions wrote to shuffles (every ``Exchange`` node's
  *shuffle bytes written*, read from Spark's REST API: the session runs with its UI on).
* **literals**: what Spark's analysis and optimization of a query holding the list cost, the list
  written with typed integer literals (``7L``, as the engine writes them) and untyped (``7``): the
  median time to the optimized plan of ``SELECT count(*) ... WHERE id IN (<list>)``, alternating.
  A MERGE is planned several times (Delta plans each of its steps), so it pays this more than once.

    .venv/bin/python benchmarks/bench_key_list.py [--rows 2000000] [--batch 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import socket
import statistics
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_merge
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.apply.journey import apply_parts
from ingest.commit import spark_merge
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.lake.location import LakePath
from ingest.spark.session import get_spark, session_conf, spark_location
from ingest.spark.sql import ident

console = Console()
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SqlMetrics:
    """The session's SQL executions, read from Spark's REST API."""

    def __init__(self, port: int, app_id: str) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1/applications/{app_id}/sql"

    def _executions(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.base}?details=true&planDescription=false&length=100000") as reply:
            return list(json.load(reply))

    def last_id(self) -> int:
        return max((int(e["id"]) for e in self._executions()), default=-1)

    def shuffled_since(self, after: int) -> int:
        """Bytes written to shuffles by the executions after ``after``."""
        total = 0
        for execution in self._executions():
            if int(execution["id"]) <= after:
                continue
            for node in execution.get("nodes", []):
                for metric in node.get("metrics", []):
                    if metric["name"] == "shuffle bytes written":
                        total += _bytes(metric["value"])
        return total


def _bytes(value: str) -> int:
    """The total of a size metric as the UI writes it (``total (min, med, max ...)\\n1.2 MiB (...)``)."""
    found = re.search(r"([0-9.]+) (B|KiB|MiB|GiB|TiB)", value.splitlines()[-1])
    if found is None:
        raise ValueError(f"Spark's UI wrote a size this script cannot read: {value!r}")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


#: How a batch's keys stand in the MERGE condition: listed as the engine lists them (typed integer
#: literals, forced whatever the table's size), listed with untyped literals, not listed.
KINDS = ("listed", "listed, untyped literals", "unlisted")


def _choice(kind: str) -> ExitStack:
    """The engine patched for ``kind`` (not settings)."""
    stack = ExitStack()
    if kind.startswith("listed"):
        stack.enter_context(patch.object(spark_merge, "ROWS_PER_LISTED_KEY", 0))
    if kind == "listed, untyped literals":
        untyped = replace(spark_merge.DIALECT, integer=lambda value, _type: str(value))
        stack.enter_context(patch.object(spark_merge, "DIALECT", untyped))
    if kind == "unlisted":
        stack.enter_context(patch.object(spark_merge, "DIALECT", replace(spark_merge.DIALECT, key_list_limit=0)))
    return stack


def _literal_seconds(spark: Any, location: str, keys: list[int], typed: bool) -> float:
    listed = ", ".join(f"{k}L" if typed else str(k) for k in keys)
    started = time.perf_counter()  # spark.sql parses and analyzes at once
    frame = spark.sql(f"SELECT count(*) FROM delta.{ident(location)} WHERE id IN ({listed})")
    frame._jdf.queryExecution().optimizedPlan()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("bench-work/key-list"))
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    port = _free_port()
    conf = {**session_conf(["delta-spark"], {}), "spark.ui.enabled": "true", "spark.ui.port": str(port)}
    spark = get_spark("local[2]", 2, tuple(sorted(conf.items())))
    metrics = SqlMetrics(port, spark.sparkContext.applicationId)
    engine = DeltaSparkWriter(spark)
    try:
        console.print(f"table of {args.rows:,} rows")
        paths, source = bench_merge.build(LakePath.local_dir(workdir), args.rows, 128)
        bench_merge.enable_deletion_vectors(engine, paths)
        location = spark_location(spark, paths.table)
        rng = random.Random(11)
        times: dict[str, list[float]] = {}
        shuffled: dict[str, list[int]] = {}
        for n in range(args.rounds + 1):  # the first round warms the session up and is not counted
            for kind in KINDS:
                parts = source.parts(rng.sample(range(args.rows), args.batch))
                before = metrics.last_id()
                with _choice(kind):
                    started = time.perf_counter()
                    record = apply_parts(bench_merge.SPEC, paths, parts, batch_id=n + 1, run_id="bench",
                                         writer=engine).record
                    seconds = time.perf_counter() - started
                assert record is not None and record.balanced and record.updated == args.batch
                written = metrics.shuffled_since(before)
                console.print(f"  {kind}: {seconds:.2f} s, shuffles wrote {written / 2**20:,.1f} MiB"
                              + (" (warm-up)" if n == 0 else ""))
                if n:
                    times.setdefault(kind, []).append(seconds)
                    shuffled.setdefault(kind, []).append(written)
        analysis: dict[bool, list[float]] = {}
        for n in range(args.rounds * 2 + 2):
            keys = rng.sample(range(args.rows), args.batch)
            for typed in (True, False):
                seconds = _literal_seconds(spark, location, keys, typed)
                if n >= 2:  # two warm-up rounds
                    analysis.setdefault(typed, []).append(seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = Table(title=f"A {args.batch:,}-key random batch into {args.rows:,} rows, delta-spark "
                      f"(median of {args.rounds})")
    for col in ("keys in the MERGE condition", "batch time", "shuffle bytes written"):
        out.add_column(col, justify="right")
    for kind in KINDS:
        out.add_row(kind, f"{statistics.median(times[kind]):.2f} s",
                    f"{statistics.median(shuffled[kind]) / 2**20:,.1f} MiB")
    console.print(out)
    figures = [figure for kind in KINDS for figure in (
        Figure(f"{kind}: batch time", round(statistics.median(times[kind]), 2), "s"),
        Figure(f"{kind}: shuffle bytes written", round(statistics.median(shuffled[kind]) / 2**20, 1), "MiB"))]
    for kind in KINDS[1:]:
        ratio = statistics.median(times["listed"]) / statistics.median(times[kind])
        console.print(f"listed / {kind}: {ratio:.2f}x the time")
        figures.append(Figure(f"listed / {kind}: time", round(ratio, 2), "x"))
    with_types, without = statistics.median(analysis[True]), statistics.median(analysis[False])
    console.print(f"analysis and optimization of a {args.batch:,}-key list: typed literals {with_types:.3f} s, "
                  f"untyped {without:.3f} s ({without / with_types:.2f}x), median of {len(analysis[True])}")
    figures += [Figure("analysis of the list, typed literals", round(with_types, 3), "s"),
                Figure("analysis of the list, untyped literals", round(without, 3), "s")]
    console.print(f"result: {write_result('bench_key_list', changed_options(parser, args, ['workdir']), figures)}")


if __name__ == "__main__":
    main()
