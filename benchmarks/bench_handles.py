"""Kept Delta handles against tables opened afresh every batch, on the driver alone (not a test).

Decodes one simulated workload (``bench_compare.workload``) into micro-batches in this process, then
applies every batch twice, into two lakes of their own: once with the table's handles kept from
batch to batch (``OpenTables``, as the stream does) and once opening the tables afresh. The two
alternate batch by batch, and which goes first alternates too. It prints the CPU seconds of each
(``time.process_time``: every thread of this process, delta-rs's and DuckDB's included). No Spark.

    .venv/bin/python benchmarks/bench_handles.py --batch 2000    # many small batches: long logs
    .venv/bin/python benchmarks/bench_handles.py --batch 20000   # bench_compare's batch size
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compare import workload
from record import Figure, changed_options, write_result

from ingest.apply.journey import apply_parts
from ingest.commit.state import OpenTables
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.lake.layout import TablePaths
from ingest.source.sources import source_for

WAYS = ("kept", "fresh")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["json", "avro"], default="json")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000, help="max records per micro-batch and table")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work"))
    args = parser.parse_args()
    console = Console()
    config, _ = workload(args.workdir, args.format, args.events, args.batch)
    source = source_for(config)
    lakes = {way: config.workdir / f"handles-{way}" for way in WAYS}
    results = Table("table", "batches", *(f"{way}: CPU s" for way in WAYS), "kept / fresh")
    figures: list[Figure] = []
    for spec in config.tables:
        decoder = BatchDecoder({spec.topic: DecoderSpec.for_table(config, spec)})
        end = source.end_offsets(spec.topic)
        step = max(1, args.batch // len(end))
        start, batches = dict.fromkeys(end, 0), []
        while any(start[p] < end[p] for p in end):
            stop = {p: min(end[p], start[p] + step) for p in end}
            batches.append(decoder.decode(source.read_arrow(spec.topic, start, stop)))
            start = stop
        paths = {way: TablePaths(root / spec.name, root / "_cdc_tombstones" / spec.name, root / "_cdc_audit",
                                 root / "_cdc_quarantine") for way, root in lakes.items()}
        opened = OpenTables(paths["kept"], spec.name)
        cpu = dict.fromkeys(WAYS, 0.0)
        for i, parts in enumerate(batches):
            for way in WAYS if i % 2 == 0 else reversed(WAYS):
                t0 = time.process_time()
                apply_parts(spec, paths[way], parts, opened=opened if way == "kept" else None,
                            batch_id=i, run_id="bench-handles")
                cpu[way] += time.process_time() - t0
            console.print(f"  {spec.name}: batch {i + 1}/{len(batches)}", end="\r")
        console.print()
        results.add_row(spec.name, str(len(batches)), *(f"{cpu[w]:.2f}" for w in WAYS),
                        f"{cpu['kept'] / cpu['fresh']:.2f}")
        figures += [Figure(f"{spec.name}: batches", len(batches)),
                    *(Figure(f"{spec.name}: {way}, CPU", round(cpu[way], 2), "s") for way in WAYS),
                    Figure(f"{spec.name}: kept / fresh", round(cpu["kept"] / cpu["fresh"], 2), "x")]
    for root in lakes.values():
        shutil.rmtree(root, ignore_errors=True)
    console.print(results)
    console.print(f"result: {write_result('bench_handles', changed_options(parser, args, ['workdir']), figures)}")


if __name__ == "__main__":
    main()
