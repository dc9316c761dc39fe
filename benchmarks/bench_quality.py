"""What data-quality validation costs per micro-batch, and whether memory stays flat.

Not a test: it measures, on the driver path only (``apply_parts`` on decoded batches, no Spark),
so the denominator is the smallest honest one -- Spark's decode time is left out.

1. **Overhead at 100k-event batches.** Synthetic ``orders`` batches (the demo's orders columns, a
   few values that break the demo suite) go through ``apply_parts`` twice per round, into two
   tables: once without a suite, once with ``expectations/orders.json`` under policy
   ``quarantine``. Rounds alternate the two so machine load hits both alike. Reported, in wall
   and CPU seconds (CPU is steadier on a shared machine): median batch time of each, the
   validation itself (the gate's ``check``) and its share. Data is clean by default (pure
   validation cost); ``--violations-every N`` adds rejected rows, and so quarantine writes.
2. **Once per process.** The first suite load pays GX's import and context; the second is free.
3. **Memory over 1,000 batches.** RSS every 100 batches while the quality gate validates 1,000
   batches (gate only; then full ``apply_parts`` with MERGE, audit, quarantine and result
   files; then the same without a suite as a control, since Delta tables that grow by a commit per
   batch grow the process too), and the number of pandas DataFrames still alive at the end.

    .venv/bin/python benchmarks/bench_quality.py [--events 100000] [--rounds 5] [--memory-batches 1000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.apply.batch import MicroBatch
from ingest.apply.journey import apply_parts
from ingest.commit.state import TableState
from ingest.config import TableSpec
from ingest.decode.parts import PartsBuilder
from ingest.lake.layout import TablePaths
from ingest.model import ChangeEvent, ColumnSpec, SourcePosition
from ingest.quality import QualityGate, ResultStore, load_suite
from ingest.rules.reduce import reduce_changes

console = Console()
SUITES = Path(__file__).resolve().parent.parent / "expectations"
ORDERS = (
    ColumnSpec("id", "long", False), ColumnSpec("customer_id", "integer", False),
    ColumnSpec("product_id", "integer", False), ColumnSpec("quantity", "short", False),
    ColumnSpec("unit_price", "decimal(10,2)", False), ColumnSpec("amount", "decimal(12,2)", False),
    ColumnSpec("status", "string", False), ColumnSpec("ordered_at", "timestamp_ntz", False),
    ColumnSpec("ship_date", "date"), ColumnSpec("note", "string"),
)
STATUSES = ("pending", "paid", "shipped", "cancelled")


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Batches:
    """Decoded ``orders`` batches as the decode step emits them (columns once per batch)."""

    def __init__(self, keys: int, bad_every: int = 0) -> None:
        self.keys, self.bad_every = keys, bad_every
        self.offset = 0
        self.lsn = 1_000_000

    def next(self, events: int) -> list[pa.RecordBatch]:
        """The decode step's parts for ``events`` changes of ``orders``."""
        ts = datetime(2026, 1, 1, tzinfo=UTC)
        source = pa.table({"topic": pa.array(["orders"] * events, pa.string()),
                           "partition": pa.array([0] * events, pa.int32()),
                           "offset": pa.array(range(self.offset, self.offset + events), pa.int64()),
                           "timestamp": pa.array([ts] * events, pa.timestamp("us", tz="UTC"))})
        out = PartsBuilder(source)
        for i in range(events):
            self.lsn += 1
            key = (self.lsn * 7919) % self.keys  # spread over the key space, some keys twice per batch
            qty = 1 + self.lsn % 20
            price = Decimal(100 + self.lsn % 9000).scaleb(-2)
            status = STATUSES[self.lsn % 4]
            if self.bad_every and self.lsn % self.bad_every == 0:
                qty = -qty  # a value the demo suite rejects: the quarantine path runs too
            after = {"id": key, "customer_id": 1 + key % 400, "product_id": 1 + key % 80, "quantity": qty,
                     "unit_price": price, "amount": price * qty, "status": status,
                     "ordered_at": datetime(2026, 1, 1), "ship_date": date(2026, 1, 3) if status == "shipped" else None,
                     "note": None}
            out.change(ChangeEvent("u", {"id": key}, after, None, SourcePosition(self.lsn, self.lsn, 0, 1), ORDERS,
                                   ("id",), source_ts_ms=1_767_225_600_000 + i, schema_ref="avro:1"), i)
        self.offset += events
        return out.parts()


def _raw(coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[bytes, bytes, None]]:
    """The raw bytes of held messages, as the engine fetches them again from the source."""
    return {c: (b"k%d" % c[2], b"v" * 200, None) for c in coords}


def paths_in(root: Path, name: str) -> TablePaths:
    tables = root / "tables"
    return TablePaths(tables / name, tables / "_cdc_tombstones" / name, tables / "_cdc_audit",
                      tables / "_cdc_quarantine", root / "quality" / name)


class Clock:
    """Wall and CPU seconds of a stretch of work (CPU: this process, all threads)."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


class TimedGate(QualityGate):
    """The real gate, timing its ``check`` (the whole cost of validation in a batch)."""

    clocks: list[Clock]

    def check(self, *args: Any, **kwargs: Any) -> Any:
        with Clock() as clock:
            result = super().check(*args, **kwargs)
        self.clocks.append(clock)
        return result


def overhead(root: Path, events: int, rounds: int, bad_every: int) -> dict[str, float]:
    plain_spec = TableSpec(name="plain", topic="orders")
    spec = TableSpec(name="checked", topic="orders", expectations="orders", quality_policy="quarantine")
    gate = TimedGate(spec, load_suite(SUITES, "orders"), results=ResultStore(root / "quality" / "checked"))
    gate.clocks = []
    plain_src, checked_src = (Batches(keys=events * 3 // 5, bad_every=bad_every),
                              Batches(keys=events * 3 // 5, bad_every=bad_every))
    plain: list[Clock] = []
    checked: list[Clock] = []
    held = 0
    for n in range(rounds + 1):  # round 0 warms both tables up (creation) and is not counted
        rows = plain_src.next(events)
        with Clock() as a:
            apply_parts(plain_spec, paths_in(root, "plain"), rows, batch_id=n, run_id="bench",
                          fetch_raw=_raw)
        rows = checked_src.next(events)
        with Clock() as b:
            result = apply_parts(spec, paths_in(root, "checked"), rows, batch_id=n, run_id="bench", gate=gate,
                                   fetch_raw=_raw)
        del rows
        v = gate.clocks[-1]
        if n:
            plain.append(a)
            checked.append(b)
            held += result.record.quarantined if result.record else 0
        console.print(f"  round {n}: without suite {a.wall:.2f} s (cpu {a.cpu:.2f}), with suite {b.wall:.2f} s "
                      f"(cpu {b.cpu:.2f}), validation {v.wall:.2f} s (cpu {v.cpu:.2f})")
    out = {"held": held / rounds}
    for unit in ("wall", "cpu"):
        base = statistics.median(getattr(c, unit) for c in plain)
        with_suite = statistics.median(getattr(c, unit) for c in checked)
        validation = statistics.median(getattr(c, unit) for c in gate.clocks[1:])
        out |= {f"plain_{unit}": base, f"checked_{unit}": with_suite, f"validation_{unit}": validation,
                f"share_{unit}": validation / base, f"diff_{unit}": with_suite / base - 1}
    return out


def memory(root: Path, batches: int, events: int, *, full: bool, suite: bool = True) -> list[tuple[int, float]]:
    """RSS samples (batch, MB) over ``batches``; the last entry is ``(-1, pandas DataFrames alive)``."""
    import pandas as pd

    name = f"mem_{'full' if full else 'gate'}{'' if suite else '_nosuite'}"
    spec = TableSpec(name=name, topic="orders", expectations="orders" if suite else None,
                     quality_policy="quarantine")
    gate = QualityGate(spec, load_suite(SUITES, "orders"), results=ResultStore(root / "quality" / spec.name, 50))
    source = Batches(keys=events * 20, bad_every=997)
    samples = []
    for n in range(1, batches + 1):
        rows = source.next(events)
        if full:
            apply_parts(spec, paths_in(root, spec.name), rows, batch_id=n, run_id="mem",
                          gate=gate if suite else None, fetch_raw=_raw)
        else:
            batch = MicroBatch.from_parts(rows, TableState(None, None, None, None))
            winners = reduce_changes(batch.changes, ("id",), batch.columns).winners
            gate.check(winners, list(ORDERS), batch_id=n, run_id="mem")
            del batch, winners
        del rows
        if n == 1 or n % 100 == 0:
            gc.collect()
            samples.append((n, rss_mb()))
            console.print(f"  after batch {n}: RSS {samples[-1][1]:.0f} MB")
    gc.collect()
    frames = sum(isinstance(o, pd.DataFrame) for o in gc.get_objects())
    samples.append((-1, float(frames)))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events per batch for the overhead rounds")
    parser.add_argument("--rounds", type=int, default=5, help="overhead rounds (0: skip)")
    parser.add_argument("--violations-every", type=int, default=0,
                        help="overhead rounds: one event in N breaks the suite (0: clean data, pure validation cost)")
    parser.add_argument("--memory-batches", type=int, default=1000)
    parser.add_argument("--memory-events", type=int, default=2000, help="events per batch for the memory runs")
    parser.add_argument("--skip-full-memory", action="store_true", help="gate-only memory run")
    parser.add_argument("--skip-control", action="store_true",
                        help="no control run (full apply_parts without a suite: the Delta side's own growth)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    load_suite(SUITES, "orders")
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_suite(SUITES, "customers")
    second = time.perf_counter() - t0

    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        root = Path(tmp)
        cost = None
        if args.rounds:
            console.print(f"overhead: {args.rounds} rounds of {args.events} events per table")
            cost = overhead(root, args.events, args.rounds, args.violations_every)
        gate_mem = full_mem = control_mem = None
        if args.memory_batches:
            console.print(f"memory: {args.memory_batches} batches of {args.memory_events} events, gate only")
            gate_mem = memory(root, args.memory_batches, args.memory_events, full=False)
        if args.memory_batches and not args.skip_full_memory:
            console.print(f"memory: {args.memory_batches} batches of {args.memory_events} events, full apply_parts")
            full_mem = memory(root, args.memory_batches, args.memory_events, full=True)
        control_mem = None
        if args.memory_batches and not args.skip_full_memory and not args.skip_control:
            console.print(f"memory: {args.memory_batches} batches of {args.memory_events} events, full "
                          "process_batch WITHOUT a suite (control)")
            control_mem = memory(root, args.memory_batches, args.memory_events, full=True, suite=False)

    out = Table(title=f"Quality validation cost ({args.events}-event batches, suite expectations/orders.json)")
    out.add_column("measure")
    out.add_column("value", justify="right")
    figures: list[Figure] = []

    def row(name: str, shown: str, value: float, unit: str = "") -> None:
        out.add_row(name, shown)
        figures.append(Figure(name, value, unit))

    for unit, label in (("wall", "wall"), ("cpu", "CPU")) if cost else ():
        plain, checked = cost[f"plain_{unit}"], cost[f"checked_{unit}"]
        row(f"batch time without validation (median, {label})", f"{plain:.2f} s", round(plain, 2), "s")
        row(f"batch time with validation (median, {label})", f"{checked:.2f} s", round(checked, 2), "s")
        validation = cost[f"validation_{unit}"]
        row(f"validation itself: frame + GX + result file (median, {label})", f"{validation:.3f} s",
            round(validation, 3), "s")
        share, diff = cost[f"share_{unit}"], cost[f"diff_{unit}"]
        row(f"overhead = validation / batch time without it ({label})", f"{share:.1%}", round(share * 100, 1), "%")
        row(f"difference of the two medians ({label}; noisy on a busy machine)", f"{diff:+.1%}",
            round(diff * 100, 1), "%")
    if cost:
        row("rows quarantined per batch (injected violations)", f"{cost['held']:.0f}", round(cost["held"]))
    row("GX import + context + first suite (once per process)", f"{first:.1f} s", round(first, 1), "s")
    row("second suite load (same process)", f"{second * 1000:.0f} ms", round(second * 1000), "ms")
    runs = [(label, samples) for label, samples in (("gate only", gate_mem), ("full apply_parts", full_mem),
                                                    ("full, no suite (control)", control_mem)) if samples]
    for label, samples in runs:
        points = [(n, mb) for n, mb in samples if n > 0]
        base = next((mb for n, mb in points if n >= 100), points[0][1])
        growth = points[-1][1] - base
        row(f"RSS growth, {label}, batch #100 -> #{points[-1][0]}", f"{growth:+.1f} MB", round(growth, 1), "MB")
        row(f"pandas DataFrames alive after {label}", str(int(samples[-1][1])), int(samples[-1][1]))
    console.print(out)
    rss = Table(title="RSS (MB) after batch")
    rss.add_column("batch", justify="right")
    for label, _ in runs:
        rss.add_column(label, justify="right")
    for i, (n, _) in enumerate(p for p in (gate_mem or []) if p[0] > 0):
        rss.add_row(str(n), *(f"{samples[i][1]:.0f}" for _, samples in runs))
    if runs:
        console.print(rss)
    console.print(f"result: {write_result('bench_quality', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
