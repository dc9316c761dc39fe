"""Spark's checkpoint per micro-batch on local disk: how Hadoop writes its files, three ways (one is the engine's).

Not a test: it measures. Every micro-batch of a streaming query writes its offsets to the checkpoint
before it runs (``walCommit``) and its commit after (``commitOffsets``); a continuous run at a short
trigger pays both on every micro-batch, and a change waits through the first. Per run (default two),
taking turns, a fresh process starts the engine's Spark session (:func:`ingest.spark.session.get_spark`)
and runs a query of Spark's ``rate-micro-batch`` source into an empty ``foreachBatch`` at a 250 ms
trigger for ``--seconds``, on a fresh local checkpoint:

* ``checksummed``: Spark's default checkpoint files, through FileContexts, on Hadoop's default local
  file system, which writes a ``.crc`` beside each file (and renames it with the file);
* ``raw``: through FileContexts of the local file system the engine's session configures, which
  writes no checksum files;
* ``filesystem``: as the engine's session writes a local checkpoint, through FileSystems
  (:data:`ingest.spark.session.LOCAL_CHECKPOINTS`): without Hadoop's native library a local
  FileContext forks ``chmod`` for each file it creates and ``readlink`` for each rename.

It reports the medians of Spark's own durations over the micro-batches after the first ten
(``StreamingQueryProgress.durationMs``).

    .venv/bin/python benchmarks/bench_checkpoint_files.py
    .venv/bin/python benchmarks/bench_checkpoint_files.py --runs 3 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Figure, changed_options, write_result

console = Console(width=120)
#: Hadoop's checksummed local file system for FileContexts (Hadoop's default)
CHECKSUMMED = (("spark.hadoop.fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.LocalFs"),)
MODES = ("checksummed", "raw", "filesystem")
DURATIONS = ("walCommit", "commitOffsets", "triggerExecution")
WARM_BATCHES = 10


def child(mode: str, seconds: float, checkpoint: str) -> None:
    """One run in this process: print the micro-batches' ``durationMs`` as JSON lines."""
    from ingest.spark.session import LOCAL_CHECKPOINTS, get_spark

    extra = {"checksummed": CHECKSUMMED, "filesystem": tuple(LOCAL_CHECKPOINTS.items())}.get(mode, ())
    spark = get_spark(extra=extra)
    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 100).load().writeStream
             .foreachBatch(lambda _df, _batch_id: None).option("checkpointLocation", checkpoint)
             .trigger(processingTime="250 milliseconds").start())
    time.sleep(seconds)
    progress = list(query.recentProgress)
    query.stop()
    for p in progress:
        print(json.dumps(p["durationMs"]))


def run(mode: str, seconds: float, scratch: Path) -> dict[str, float]:
    """Medians of :data:`DURATIONS` of one run of ``mode`` in a fresh process."""
    checkpoint = scratch / f"checkpoint-{mode}-{time.monotonic_ns()}"
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--seconds", str(seconds),
                          "--checkpoint", str(checkpoint)], check=True, capture_output=True, text=True).stdout
    batches = [json.loads(line) for line in out.splitlines() if line.startswith("{")][WARM_BATCHES:]
    if not batches:
        raise SystemExit(f"{mode}: no micro-batch after the first {WARM_BATCHES} in {seconds:.0f} s")
    return {d: statistics.median(b.get(d, 0) for b in batches) for d in DURATIONS} | {"batches": len(batches)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode, taking turns")
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds each query runs")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.checkpoint)
        return
    rows = []
    with tempfile.TemporaryDirectory() as scratch, console.status("") as status:
        for n in range(1, args.runs + 1):
            for mode in MODES:
                status.update(f"{mode}, run {n} of {args.runs}: a query for {args.seconds:.0f} s")
                rows.append((mode, n, run(mode, args.seconds, Path(scratch))))
    out = Table(title="Spark's checkpoint on local disk, per micro-batch (medians, 250 ms trigger)")
    for col in ("checkpoint files", "run", "micro-batches", *DURATIONS):
        out.add_column(col, justify="right")
    figures = []
    for mode, n, medians in rows:
        out.add_row(mode, str(n), str(medians["batches"]), *(f"{medians[d]:.0f} ms" for d in DURATIONS))
        figures += [Figure(f"{mode}, run {n}: {d} (median)", medians[d], "ms") for d in DURATIONS]
    console.print(out)
    variant = changed_options(parser, args, ignore=("child", "checkpoint"))
    console.print(f"result: {write_result('bench_checkpoint_files', variant, figures)}")


if __name__ == "__main__":
    main()
