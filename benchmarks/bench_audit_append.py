"""Appending audit rows as a continuous run does: the table opened afresh for each append, or kept open.

Not a test: it measures. A continuous run appends its micro-batch's audit rows to the shared audit
table once per micro-batch, so a run at a 0.5 s trigger makes 7,200 commits of it an hour. Per
run (default two), on a fresh local table each, taking turns:

* ``afresh``: :func:`ingest.records.audit.append`, which opens the table for each append (as a
  one-shot append does, and as a run did before it kept the table open);
* ``kept open``: :class:`ingest.records.audit.AuditLog`, a run's: the table stays open, brought up to
  date before each append, and its small files are packed.

It reports the median append of the first and of the last ``--window`` appends: an append that
costs more as the table's log grows shows there.

    .venv/bin/python benchmarks/bench_audit_append.py
    .venv/bin/python benchmarks/bench_audit_append.py --appends 4000 --runs 1
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ingest.records import audit
from ingest.records.audit import AuditRecord

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Figure, changed_options, write_result

console = Console(width=120)
Append = Callable[[Path, list[AuditRecord]], None]


def modes() -> dict[str, Append]:
    """The two ways of appending, by name (a fresh :class:`AuditLog` for each run of ``kept open``)."""
    return {"afresh": audit.append, "kept open": audit.AuditLog().append}


def appended(append: Append, path: Path, appends: int, progress: Progress, label: str) -> list[float]:
    """Seconds of each of ``appends`` appends of one audit row (one micro-batch's, one table)."""
    times = []
    task = progress.add_task(label, total=appends)
    for batch_id in range(appends):
        record = AuditRecord(table="orders", run_id="bench", batch_id=batch_id, received=100, inserted=100,
                             started_at=audit.now(), finished_at=audit.now())
        started = time.perf_counter()
        append(path, [record])
        times.append(time.perf_counter() - started)
        progress.advance(task)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per run")
    parser.add_argument("--window", type=int, default=400, help="appends in the first and last window")
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode, taking turns")
    args = parser.parse_args()
    if args.window * 2 > args.appends:
        parser.error("--window must be at most half of --appends")
    rows: list[tuple[str, int, float, float]] = []
    with Progress(console=console, transient=True) as progress, tempfile.TemporaryDirectory() as scratch:
        for run in range(1, args.runs + 1):
            for name, append in modes().items():
                path = Path(scratch) / f"{name.replace(' ', '-')}-{run}" / "_cdc_audit"
                times = appended(append, path, args.appends, progress, f"{name}, run {run}")
                rows.append((name, run, statistics.median(times[:args.window]) * 1000,
                             statistics.median(times[-args.window:]) * 1000))
                shutil.rmtree(path.parent)
    out = Table(title=f"Audit appends to a local table: median of the first and last {args.window} of "
                      f"{args.appends:,} appends")
    for col in ("mode", "run", "first", "last", "last / first"):
        out.add_column(col, justify="right")
    figures = []
    for name, run, first, last in rows:
        out.add_row(name, str(run), f"{first:.1f} ms", f"{last:.1f} ms", f"{last / first:.2f}")
        figures += [Figure(f"{name}, run {run}: median append, first {args.window}", round(first, 1), "ms"),
                    Figure(f"{name}, run {run}: median append, last {args.window}", round(last, 1), "ms")]
    console.print(out)
    console.print(f"result: {write_result('bench_audit_append', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
