"""Where a batch's reduce costs less: on the driver (Arrow) or on Spark's executors (not a test).

Issue 11 asks that with delta-spark nothing row-level goes through the driver; today the driver
collects a table's decoded batch and reduces it with :func:`ingest.rules.reduce.reduce_changes`.
This script measures what moving that reduce to the executors would cost, with the same function,
on the same rows, side by side in one Spark session:

* **driver**: the batch's rows collected from the executors (``toArrow``) and reduced on the driver,
  as the engine does now;
* **executors**: the batch's rows grouped by a hash of the key into one bucket per core, and each
  bucket reduced by the same function in a Python worker (``groupBy(...).applyInArrow``): every
  change of a key lands in one bucket, so the winners are the same. The output is written to
  Spark's ``noop`` sink, so nothing comes back.

The batch is already decoded and cached on the executors before either side runs: what is timed
is what happens after the decode. Changes are random inserts, updates and deletes of ``rows / 4``
keys, no TOAST placeholder. The two sides take turns, ``--rounds`` times per size; the table gives
medians and the winners each side found (they must be equal).

    .venv/bin/python benchmarks/bench_reduce_where.py [--sizes 20000,200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.decode.parts import FRAME
from ingest.model import ColumnSpec
from ingest.rules.reduce import reduce_changes
from ingest.spark.session import arrow_frame, get_spark

COLUMNS = [ColumnSpec("id", "long"), ColumnSpec("name", "string"), ColumnSpec("amount", "double")]
KEY = ("id",)


def changes(rows: int, seed: int) -> pa.Table:
    """``rows`` changes of ``rows // 4`` keys: the framework's columns and three user columns."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, max(1, rows // 4), rows).astype(np.int64)
    frame = {f.name: pa.nulls(rows, f.type) for f in FRAME}
    frame.update({
        "_cdc_kind": pa.array(["change"] * rows),
        "_cdc_op": pa.array(rng.choice(np.array(["c", "u", "d"]), rows, p=[0.3, 0.6, 0.1])),
        "_cdc_position": pa.array([f"{i:020d}" for i in range(rows)]),
        "_cdc_topic": pa.array(["bench.public.t"] * rows),
        "_cdc_partition": pa.array(np.zeros(rows, dtype=np.int32)),
        "_cdc_offset": pa.array(np.arange(rows, dtype=np.int64)),
        "_cdc_flattened": pa.array(np.zeros(rows, dtype=bool)),
        "_cdc_key_columns": pa.array(['["id"]'] * rows),
        "_cdc_toast": pa.array([[]] * rows, pa.list_(pa.string())),
    })
    table = pa.table(frame)
    table = table.append_column("id", pa.array(keys))
    table = table.append_column("name", pa.array([f"name {k}" for k in keys]))
    return table.append_column("amount", pa.array(rng.random(rows)))


def on_driver(frame: object) -> int:
    rows = frame.toArrow()  # type: ignore[attr-defined]
    return reduce_changes(rows, KEY, COLUMNS).winners.num_rows


def on_executors(frame: object, schema: pa.Schema, buckets: int) -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    def reduce_bucket(rows: pa.Table) -> pa.Table:
        return reduce_changes(rows, KEY, COLUMNS).winners.cast(schema)

    bucket = F.pmod(F.hash(*KEY), F.lit(buckets))
    winners = frame.groupBy(bucket).applyInArrow(reduce_bucket, from_arrow_schema(schema))  # type: ignore[attr-defined]
    winners = winners.cache()
    try:
        winners.write.format("noop").mode("overwrite").save()
        return int(winners.count())
    finally:
        winners.unpersist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20000,200000")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    console = Console()
    spark = get_spark()
    buckets = spark.sparkContext.defaultParallelism
    table = Table(title=f"reduce of one table's batch: driver vs executors ({buckets} buckets), median of "
                        f"{args.rounds}")
    for name in ("changes", "driver (collect + reduce)", "executors (group by key hash)", "executors / driver",
                 "winners equal"):
        table.add_column(name, justify="right")
    figures: list[Figure] = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows = changes(size, seed=size)
        schema = reduce_changes(rows.slice(0, 100), KEY, COLUMNS).winners.schema
        frame = arrow_frame(spark, rows).cache()
        frame.count()
        driver, executors, equal = [], [], True
        for i in range(args.rounds + 1):  # the first round warms both sides up and is not counted
            t0 = time.perf_counter()
            found_driver = on_driver(frame)
            t1 = time.perf_counter()
            found_executors = on_executors(frame, schema, buckets)
            t2 = time.perf_counter()
            equal = equal and found_driver == found_executors
            if i:
                driver.append(t1 - t0)
                executors.append(t2 - t1)
            console.print(f"{size:,} changes, round {i}{' (warm-up)' if not i else ''}: driver {t1 - t0:.3f} s, "
                          f"executors {t2 - t1:.3f} s")
        frame.unpersist()
        d, e = statistics.median(driver), statistics.median(executors)
        table.add_row(f"{size:,}", f"{d:.3f} s", f"{e:.3f} s", f"{e / d:.1f}x", str(equal))
        figures += [Figure(f"{size:,} changes: driver (collect + reduce)", round(d, 3), "s"),
                    Figure(f"{size:,} changes: executors (group by key hash)", round(e, 3), "s"),
                    Figure(f"{size:,} changes: executors / driver", round(e / d, 1), "x"),
                    Figure(f"{size:,} changes: winners equal", equal)]
    console.print(table)
    console.print(f"result: {write_result('bench_reduce_where', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
