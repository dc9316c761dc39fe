"""Where a small delta-spark MERGE spends its time: Spark jobs against the driver (not a test).

Each variant runs in its own process (a fresh JVM, so the first MERGE is cold): a table of
``--rows`` rows with deletion vectors and the change feed on, then ``--merges`` MERGEs of
``--batch`` changes each (80 % updates of random keys, 20 % new keys), with the clauses the engine
uses for such a batch (update guarded by position, insert). Each MERGE runs in its own Spark job
group, and Spark's event log gives the time its jobs ran; the rest of its wall time is the
driver's (analysis, planning, code generation, the commit). ``--conf KEY=VALUE`` adds a variant
with that Spark setting (repeat it for more); the baseline is the engine's session as it is.

    .venv/bin/python benchmarks/bench_spark_merge.py [--rows 70000] [--batch 7000] [--merges 10]
        [--conf spark.sql.adaptive.enabled=false] [--conf spark.sql.codegen.wholeStage=false]

This is delta-spark's MERGE alone; ``bench_merge.py --engine delta-spark`` times the engine's whole
path, ``bench_compare.py --engine delta-spark`` the engine against a bare script.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import spark_jobs
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

console = Console(width=150)


def child(rows: int, batch: int, merges: int, conf: dict[str, str]) -> dict[str, list[float]]:
    """Run the MERGEs in this process; per MERGE: wall seconds and seconds its Spark jobs ran."""
    import pyarrow as pa
    from delta.tables import DeltaTable

    from ingest.spark.session import get_spark, session_conf

    work = Path(tempfile.mkdtemp(prefix="bench-spark-merge-"))
    events = work / "events"
    events.mkdir()
    extra = {**session_conf(["delta-spark"], {}), "spark.eventLog.enabled": "true",
             "spark.eventLog.dir": f"file://{events}", "spark.eventLog.compress": "false",
             "spark.eventLog.rolling.enabled": "false", **conf}
    spark = get_spark("local[2]", 2, tuple(sorted(extra.items())))
    path = f"file://{work}/t"

    def changes(keys: list[int], position: int) -> pa.Table:
        return pa.table({"id": pa.array(keys, pa.int64()), "name": [f"n{k}-{position}" for k in keys],
                         "amount": pa.array([k * 1.5 for k in keys]),
                         "_cdc_pos": pa.array([position] * len(keys), pa.int64()), "_cdc_op": ["u"] * len(keys)})

    (spark.createDataFrame(changes(list(range(rows)), 0)).write.format("delta")
     .option("delta.enableDeletionVectors", "true").option("delta.enableChangeDataFeed", "true").save(path))
    rng = random.Random(7)
    walls = []
    for i in range(1, merges + 1):
        new = rows + (i - 1) * batch
        keys = rng.sample(range(rows), batch * 8 // 10) + list(range(new, new + batch // 5))
        source = spark.createDataFrame(changes(keys, i))
        spark.sparkContext.setJobGroup(f"merge-{i}", f"MERGE {i}")
        started = time.perf_counter()
        (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
         .whenMatchedUpdate("s._cdc_pos > t._cdc_pos", {c: f"s.{c}" for c in ("name", "amount", "_cdc_pos", "_cdc_op")})
         .whenNotMatchedInsertAll().execute())
        walls.append(time.perf_counter() - started)
    spark.stop()
    jobs: dict[int, list] = {}
    for event in spark_jobs.events(events):
        if event["Event"] == "SparkListenerJobStart":
            group = (event.get("Properties") or {}).get("spark.jobGroup.id", "")
            jobs[event["Job ID"]] = [group, event["Submission Time"], None]
        elif event["Event"] == "SparkListenerJobEnd" and event["Job ID"] in jobs:
            jobs[event["Job ID"]][2] = event["Completion Time"]
    in_jobs = [sum((end - start) / 1000 for group, start, end in jobs.values() if group == f"merge-{i}" and end)
               for i in range(1, merges + 1)]
    counts = [sum(1 for group, *_ in jobs.values() if group == f"merge-{i}") for i in range(1, merges + 1)]
    shutil.rmtree(work, ignore_errors=True)
    return {"wall": walls, "jobs": in_jobs, "count": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=70_000)
    parser.add_argument("--batch", type=int, default=7_000)
    parser.add_argument("--merges", type=int, default=10)
    parser.add_argument("--conf", action="append", default=[], type=spark_jobs.setting, metavar="KEY=VALUE",
                        help="a variant with this Spark setting; repeatable")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.rows, args.batch, args.merges, json.loads(args.child))))
        return
    variants = [("engine's session", {})] + [(f"{k}={v}", {k: v}) for k, v in args.conf]
    table = Table(title=f"{args.merges} MERGEs of {args.batch:,} changes into {args.rows:,} rows, local[2]")
    for column in ("variant", "first MERGE", "later MERGEs, median", "of which Spark jobs", "driver's share",
                   "jobs per MERGE"):
        table.add_column(column, justify="left" if column == "variant" else "right",
                         overflow="fold", min_width=24 if column == "variant" else None)
    figures: list[Figure] = []
    for name, conf in variants:
        console.print(f"running: {name}")
        done = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--batch", str(args.batch),
                               "--merges", str(args.merges), "--child", json.dumps(conf)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.splitlines()[-25:])
            sys.exit(f"variant {name!r} failed (exit {done.returncode}); the end of its output:\n{tail}")
        result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
        wall, jobs = result["wall"][1:], result["jobs"][1:]
        median_wall, median_jobs = statistics.median(wall), statistics.median(jobs)
        table.add_row(name, f"{result['wall'][0]:.2f} s", f"{median_wall:.2f} s", f"{median_jobs:.2f} s",
                      f"{1 - median_jobs / median_wall:.0%}", f"{statistics.median(result['count'][1:]):.0f}")
        figures += [Figure(f"{name}: first MERGE", round(result["wall"][0], 2), "s"),
                    Figure(f"{name}: later MERGEs, median", round(median_wall, 2), "s"),
                    Figure(f"{name}: of which Spark jobs", round(median_jobs, 2), "s"),
                    Figure(f"{name}: jobs per MERGE", round(statistics.median(result["count"][1:])))]
    console.print(table)
    console.print(f"result: {write_result('bench_spark_merge', changed_options(parser, args, ['child']), figures)}")


if __name__ == "__main__":
    main()
