"""A delta-spark batch applied on the driver against on the executors, side by side (not a test).

With delta-spark nothing row-level need go through the driver: the executors placement
(:mod:`ingest.apply.placement.executors`) assembles, reduces and plans a batch on Spark's executors
and MERGEs from there; the driver placement reduces and plans on the driver (Arrow, DuckDB) and
hands the MERGE its source. This script runs the one journey (:func:`ingest.apply.journey.apply_batch`)
over the same batches with each placement, taking turns batch by batch, into two copies of one table
per size (``bench_merge.py``'s table: laid out by key, deletion vectors on), and prints each way's
median time and how far the driver's resident memory rose during the batch.

The executors' batch starts as a cached DataFrame of the decoded parts, as the decode step leaves
it; building it is not timed (nor is the driver's collect of the decoded parts on the other side).
Batches: ``random`` (updates spread over the whole key space) and ``hot set`` (80 % updates of the
newest 50,000 keys, 20 % new keys), ``--batch`` changes each.

    .venv/bin/python benchmarks/bench_executor_apply.py [--sizes 200000,2000000] [--batch 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_merge
import pyarrow as pa
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.apply.journey import apply_batch, apply_parts, placement_for
from ingest.commit.state import OpenTables
from ingest.decode.parts import write_parts
from ingest.lake.delta import open_table, read_all
from ingest.lake.location import LakePath
from ingest.spark.session import arrow_frame

console = Console()
WAYS = ("driver", "executors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="200000,2000000")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("bench-work/executor-apply"))
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()  # Spark SQL names a table by its absolute path
    engine = bench_merge.make_engine("delta-spark", bench_merge.TargetSpec().target_file_size_mb)
    spark = engine.session()  # type: ignore[attr-defined]
    times: dict[tuple[int, str, str], list[float]] = {}
    memory: dict[tuple[int, str, str], list[float]] = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    for rows in sizes:
        console.print(f"two tables of {rows:,} rows")
        tables = {}
        for way in WAYS:
            root = LakePath.local_dir(args.workdir / way)
            shutil.rmtree(args.workdir / way, ignore_errors=True)
            tables[way], source = bench_merge.build(root, rows, bench_merge.TargetSpec().target_file_size_mb)
            bench_merge.enable_deletion_vectors(engine, tables[way])
        rng = random.Random(7)
        for kind in ("hot set", "random"):
            for n in range(args.rounds + 1):  # the first round of each kind warms up and is not counted
                parts = source.parts(bench_merge.batch_keys(kind, rows, source, args.batch, rng))
                for way in WAYS:
                    paths = tables[way]
                    if way == "driver":
                        with bench_merge.DriverMemory() as driver:
                            t0 = time.perf_counter()
                            record = apply_parts(bench_merge.SPEC, paths, parts, batch_id=n, run_id="bench",
                                                 writer=engine).record
                            seconds = time.perf_counter() - t0
                        assert record is not None and record.balanced
                    else:
                        frame = arrow_frame(spark, pa.Table.from_batches([write_parts(parts)])).cache()
                        frame.count()
                        with bench_merge.DriverMemory() as driver:
                            t0 = time.perf_counter()
                            record = apply_batch(bench_merge.SPEC, paths, frame, writer=engine,
                                                 placement=placement_for("executors", engine, paths.table),
                                                 opened=OpenTables(paths, "orders"), batch_id=n,
                                                 run_id="bench").record
                            seconds = time.perf_counter() - t0
                        frame.unpersist()
                        assert record is not None and record.balanced
                    if n:
                        times.setdefault((rows, kind, way), []).append(seconds)
                        memory.setdefault((rows, kind, way), []).append(driver.rose_mib)
                    console.print(f"  {kind}, {way}, round {n}{' (warm-up)' if not n else ''}: {seconds:.2f} s, "
                                  f"{record.updated} updated, {record.inserted} inserted, "
                                  f"driver memory +{driver.rose_mib:,.0f} MiB")
        same = _rows(tables["driver"].table) == _rows(tables["executors"].table)
        console.print(f"  the two tables are equal: {same}")
        assert same
        shutil.rmtree(args.workdir, ignore_errors=True)
    out = Table(title=f"A {args.batch:,}-change batch with delta-spark: reduce and plan on the driver or the "
                      f"executors (median of {args.rounds})")
    for col in ("table rows", "batch", "driver", "executors", "executors / driver", "driver memory: driver",
                "driver memory: executors"):
        out.add_column(col, justify="right")
    figures: list[Figure] = []
    for rows in sizes:
        for kind in ("hot set", "random"):
            d, e = (statistics.median(times[(rows, kind, w)]) for w in WAYS)
            md, me = (statistics.median(memory[(rows, kind, w)]) for w in WAYS)
            out.add_row(f"{rows:,}", kind, f"{d:.2f} s", f"{e:.2f} s", f"{e / d:.2f}x", f"+{md:,.0f} MiB",
                        f"+{me:,.0f} MiB")
            figures += [Figure(f"{rows:,} rows, {kind}: driver", round(d, 2), "s"),
                        Figure(f"{rows:,} rows, {kind}: executors", round(e, 2), "s"),
                        Figure(f"{rows:,} rows, {kind}: executors / driver", round(e / d, 2), "x"),
                        Figure(f"{rows:,} rows, {kind}: driver memory, driver", round(md), "MiB"),
                        Figure(f"{rows:,} rows, {kind}: driver memory, executors", round(me), "MiB")]
    console.print(out)
    variant = changed_options(parser, args, ["workdir"])
    console.print(f"result: {write_result('bench_executor_apply', variant, figures)}")


def _rows(path: Path | LakePath) -> list[tuple[object, ...]]:
    table = open_table(path)
    assert table is not None
    found = read_all(table, columns=["id", "amount", "status", "_cdc_position", "_cdc_deleted"])
    return sorted(tuple(r.values()) for r in found.to_pylist())


if __name__ == "__main__":
    main()
