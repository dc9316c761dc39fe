"""What the number of tables costs: the same records over 1, 20 and 200 tables, and 200 idle tables (not a test).

Every table is a topic ``bench.public.t<N>`` of JSON Debezium changes (inserts, then updates of a
third of the keys) in the embedded log, found by ``discover.topic_pattern`` -- as a whole database
captured by Debezium would be. For each spread of the same total the engine catches up once
(``available_now``, the default of one shared streaming query) in one Spark session, after a
warm-up run that is not counted; every table is then checked row for row against what was written.

Then **continuous mode with idle tables**: the 200 caught-up tables run for ``--idle-seconds``
with nothing arriving, and the driver's RSS, the Spark JVM's RSS and thread count, and the CPU both
used are sampled, to show they stay bounded.

Then, unless ``--no-update-round``, **an updating round**: the same number of records again, now
updates of keys the tables hold, so every table MERGEs into existing rows -- the steady state of
a pipeline, where each batch rewrites files of every table it touches.

    .venv/bin/python benchmarks/bench_tables.py [--records 20000] [--spreads 1,20,200] [--repeat 3]
        [--writer delta-rs|delta-spark] [--cluster] [--idle-seconds 60] [--no-update-round]

``--cluster`` runs the engine on a Spark standalone cluster on loopback (a master and two workers of
one core each, :class:`harness.spark_cluster.SparkCluster`) instead of ``local[2]``: the same two
cores, now with the scheduling, task shipping and result transfer of a real cluster. The workers
read the embedded log and the lake where the driver wrote them (one machine's disk).

Each spread is caught up ``--repeat`` times, the spreads taking turns (1, 20, 200, 1, 20, 200, ...)
so that the machine's drift falls on all of them; the table gives every run and the median. The
last line is ``200 tables / 1 table: X.XXx`` (median catch-up times; target at most 3x). The
result file (``benchmarks/results/``) keeps the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Figure, changed_options, write_result

from ingest.config import IngestConfig, load_config
from ingest.lake.delta import open_table, read_all
from ingest.source.topiclog import ProducerRecord, TopicLog
from ingest.stream.runner import Runner

console = Console()
TS_MS = 1_767_225_600_000


def _change(op: str, row: dict[str, Any], lsn: int) -> bytes:
    source = {"connector": "postgresql", "lsn": lsn, "sequence": json.dumps([str(lsn - 1), str(lsn)]),
              "ts_ms": TS_MS, "snapshot": "false", "schema": "public"}
    return json.dumps({"before": None, "after": row, "source": source, "op": op, "ts_ms": TS_MS}).encode()


def workload(root: Path, tables: int, records: int, writer: str = "delta-rs", master: str = "local[2]"
             ) -> tuple[IngestConfig, dict[str, dict[int, str]]]:
    """``records`` changes spread over ``tables`` topics; returns the config and each table's expected rows."""
    workdir = root / f"tables-{tables}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    raw = {"workdir": str(workdir.resolve()),
           "source": {"value_format": "json", "max_records_per_batch": 20_000, "driver_seconds": 0},  # Spark's queries
           "target": {"writer": writer},
           "spark": {"master": master},
           "discover": {"topic_pattern": r"bench\.public\.[^.]+", "refresh_seconds": 5}}
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    log = TopicLog(config.log_dir)
    per_table = records // tables
    inserts = max(1, per_table * 2 // 3)
    expected: dict[str, dict[int, str]] = {}
    lsn = 1000
    for t in range(tables):
        topic = f"bench.public.t{t:03d}"
        log.create_topic(topic, 2)
        rows: dict[int, str] = {}
        out = []
        for n in range(per_table):
            key = n if n < inserts else (n - inserts) % inserts
            lsn += 1
            rows[key] = f"v{n}"
            out.append(ProducerRecord(key % 2, json.dumps({"id": key}).encode(),
                                      _change("c" if n < inserts else "u", {"id": key, "body": f"v{n}", "n": n}, lsn),
                                      TS_MS))
        log.append(topic, out)
        expected[f"public_t{t:03d}"] = rows
    return config, expected


def update_round(config: IngestConfig, expected: dict[str, dict[int, str]], records: int) -> None:
    """``records`` more changes, spread as before: updates of keys every table holds (``expected``
    becomes what the tables should hold after them)."""
    log = TopicLog(config.log_dir)
    per_table = records // len(expected)
    lsn = 10_000_000
    for table, rows in sorted(expected.items()):
        keys = sorted(rows)
        out = []
        for n in range(per_table):
            key = keys[n % len(keys)]
            lsn += 1
            rows[key] = f"w{n}"
            out.append(ProducerRecord(key % 2, json.dumps({"id": key}).encode(),
                                      _change("u", {"id": key, "body": f"w{n}", "n": n}, lsn), TS_MS))
        log.append(f"bench.public.t{table.removeprefix('public_t')}", out)


def verify(config: IngestConfig, expected: dict[str, dict[int, str]]) -> bool:
    for table, rows in expected.items():
        got = {r["id"]: r["body"] for r in read_all(open_table(config.table_path(table))).to_pylist()}
        if got != rows:
            console.print(f"[red]{table}: {len(got)} rows, expected {len(rows)}[/]")
            return False
    return True


def _jvm_pid(engine: Runner) -> int | None:
    proc = getattr(engine.spark.sparkContext._gateway, "proc", None)
    return proc.pid if proc is not None else None


def _proc(pid: int) -> dict[str, float]:
    """RSS (MB), threads and CPU seconds of a process, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"rss": int(status["VmRSS"].split()[0]) / 1024, "threads": int(status["Threads"]),
            "cpu": (int(fields[11]) + int(fields[12])) / ticks}


def idle(engine: Runner, seconds: float) -> list[dict[str, float]]:
    """Samples of driver and JVM while ``engine`` runs continuously over caught-up tables."""
    import threading

    jvm = _jvm_pid(engine)
    samples: list[dict[str, float]] = []
    done = threading.Event()

    def sample() -> None:
        start = time.monotonic()
        while not done.wait(5.0):
            me, java = _proc(os.getpid()), (_proc(jvm) if jvm else {})
            samples.append({"t": time.monotonic() - start, "driver_rss": me["rss"], "driver_cpu": me["cpu"],
                            "jvm_rss": java.get("rss", float("nan")), "jvm_threads": java.get("threads", 0),
                            "jvm_cpu": java.get("cpu", float("nan"))})
            console.print(f"  idle {samples[-1]['t']:.0f} s: driver {me['rss']:.0f} MB, JVM "
                          f"{java.get('rss', 0):.0f} MB / {java.get('threads', 0)} threads")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    engine.run(mode="continuous", stop_after=seconds)
    done.set()
    sampler.join()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="total records, whatever the number of tables")
    parser.add_argument("--spreads", default="1,20,200", help="numbers of tables, comma separated")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="continuous run over idle tables (0: skip)")
    parser.add_argument("--repeat", type=int, default=3, help="catch-ups of each spread (the median counts)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work/tables"))
    parser.add_argument("--writer", choices=("delta-rs", "delta-spark"), default="delta-rs",
                        help="who commits the tables' MERGEs")
    parser.add_argument("--cluster", action="store_true",
                        help="a Spark standalone master and two one-core workers on loopback instead of local[2]")
    parser.add_argument("--no-update-round", dest="update_round", action="store_false",
                        help="skip the second round (updates of rows every table holds)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        master = "local[2]"
        if args.cluster:
            from harness.spark_cluster import SparkCluster

            master = stack.enter_context(SparkCluster(args.workdir.resolve() / "cluster", workers=2, cores=1)).url
            console.print(f"Spark standalone cluster: {master}, 2 workers of 1 core")
        ok = measure(parser, args, master)
        if args.cluster:  # the application ends before its cluster does (no "lost executor" noise)
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
            if session is not None:
                session.stop()
    raise SystemExit(0 if ok else 1)


def measure(parser: argparse.ArgumentParser, args: argparse.Namespace, master: str) -> bool:
    """Every round the arguments ask for on ``master``; whether every table ended as written."""
    spreads = [int(n) for n in args.spreads.split(",")]

    # Warm-up, not counted: the session's first query pays the JVM's and the Python workers' start,
    # which would otherwise fall on whichever spread runs first.
    config, _ = workload(args.workdir / "warm-up", 1, 200, args.writer, master)
    engine = Runner(config)
    t0 = time.perf_counter()
    engine.run()
    console.print(f"warm-up (Spark session, first query; not counted): {time.perf_counter() - t0:.1f} s")
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in spreads}
    for turn in range(args.repeat):
        for n in spreads:
            t0 = time.perf_counter()
            config, expected = workload(args.workdir, n, args.records, args.writer, master)
            console.print(f"[{turn + 1}/{args.repeat}] {n} tables x {args.records // n} records: written in "
                          f"{time.perf_counter() - t0:.1f} s")
            engine = Runner(config, spark=engine.spark)
            t0 = time.perf_counter()
            report = engine.run()
            seconds = time.perf_counter() - t0
            ok = not report.failed and len(report.tables) == n and verify(config, expected)
            batches = sum(len(t.batches) for t in report.tables.values())
            console.print(f"  caught up in {seconds:.1f} s, {batches} table batches, tables equal: {ok}")
            updating = None
            if args.update_round:
                update_round(config, expected, args.records)
                engine = Runner(config, spark=engine.spark)
                t0 = time.perf_counter()
                again = engine.run()
                updating = time.perf_counter() - t0
                ok = ok and not again.failed and verify(config, expected)
                console.print(f"  updating round (MERGE into every table's rows) in {updating:.1f} s, tables "
                              f"equal: {ok}")
            runs[n].append({"seconds": seconds, "ok": ok, "batches": batches, "updating": updating,
                            "start": report.startup_seconds or 0.0, "config": config})
    results = [{"tables": n, "records": (args.records // n) * n, "config": done[-1]["config"],
                "seconds": statistics.median(r["seconds"] for r in done),
                "start": statistics.median(r["start"] for r in done),
                "runs": [r["seconds"] for r in done], "batches": done[-1]["batches"],
                "updating": statistics.median(r["updating"] for r in done) if args.update_round else None,
                "ok": all(r["ok"] for r in done)} for n, done in runs.items()]

    out = Table(title=f"Catch-up of {args.records:,} records spread over tables (one shared query, "
                      f"{args.writer}, {'cluster' if args.cluster else 'local[2]'}), median of {args.repeat}")
    for col in ("tables", "records", "catch-up", "runs", "of which query start", "table batches", "records/s",
                "updating round", "equal"):
        out.add_column(col, justify="right")
    for r in results:
        out.add_row(str(r["tables"]), f"{r['records']:,}", f"{r['seconds']:.1f} s",
                    ", ".join(f"{x:.1f}" for x in r["runs"]), f"{r['start']:.1f} s",
                    str(r["batches"]), f"{r['records'] / r['seconds']:,.0f}",
                    f"{r['updating']:.1f} s" if r["updating"] is not None else "-", str(r["ok"]))
    console.print(out)
    figures = [Figure(f"{r['tables']} tables: {name}", value, unit) for r in results
               for name, value, unit in (("catch-up", round(r["seconds"], 2), "s"),
                                         ("updating round", None if r["updating"] is None else round(r["updating"], 2),
                                          "s"), ("equal", r["ok"], ""))]

    if args.idle_seconds:
        last = results[-1]
        console.print(f"continuous mode over {last['tables']} idle tables for {args.idle_seconds:.0f} s")
        engine = Runner(last["config"], spark=engine.spark)
        samples = idle(engine, args.idle_seconds)
        if len(samples) >= 2:
            first, final = samples[0], samples[-1]
            span = final["t"] - first["t"]
            idle_table = Table(title=f"{last['tables']} idle tables, continuous mode, {span:.0f} s sampled")
            for col in ("measure", "first sample", "last sample", "max"):
                idle_table.add_column(col, justify="right")
            for key, unit in (("driver_rss", "MB"), ("jvm_rss", "MB"), ("jvm_threads", "")):
                top = max(s[key] for s in samples)
                idle_table.add_row(key.replace("_", " "), f"{first[key]:.0f} {unit}", f"{final[key]:.0f} {unit}",
                                   f"{top:.0f} {unit}")
            idle_table.add_row("driver CPU", "-", "-", f"{(final['driver_cpu'] - first['driver_cpu']) / span:.0%} "
                               "of a core")
            idle_table.add_row("JVM CPU", "-", "-", f"{(final['jvm_cpu'] - first['jvm_cpu']) / span:.0%} of a core")
            console.print(idle_table)
        console.print(f"Python driver peak RSS over the whole script: "
                      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")

    by_n = {r["tables"]: r for r in results}
    ok = all(r["ok"] for r in results)
    if 1 in by_n and max(by_n) > 1:
        ratio = by_n[max(by_n)]["seconds"] / by_n[1]["seconds"]
        console.print(f"{max(by_n)} tables / 1 table: {ratio:.2f}x")
        figures.append(Figure(f"{max(by_n)} tables / 1 table (catch-up)", round(ratio, 2), "x"))
        if args.update_round:
            updating = by_n[max(by_n)]["updating"] / by_n[1]["updating"]
            console.print(f"{max(by_n)} tables / 1 table, updating round: {updating:.2f}x")
            figures.append(Figure(f"{max(by_n)} tables / 1 table (updating round)", round(updating, 2), "x"))
    variant = changed_options(parser, args, ignore=("workdir",))
    console.print(f"result: {write_result('bench_tables', variant, figures)}")
    return ok


if __name__ == "__main__":
    main()
