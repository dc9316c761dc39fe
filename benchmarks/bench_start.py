"""What an `ingest run` that has nothing to do costs (not a test).

The demo's tables are caught up first; then the same command is timed, end to end as a user runs it,
two ways, taking turns which goes first:

* ``--shortcut``: as it runs (the run sees that every table's Delta log holds every offset of its
  topic and ends without Spark or Great Expectations, :mod:`ingest.stream.caught_up`) against the
  same run forced through the whole start (``ingest run --full-start``: GX's import and the suites,
  the Spark session, the streaming query). The demo's quality suites are kept, as a user has them.
* otherwise, the forced whole start with the driver's class archive (:mod:`ingest.spark.class_archive`)
  and without it (``INGEST_CLASS_ARCHIVE=off``), the suites left out (Python imports, the driver JVM
  and its context, the Python workers' warm-up and the query's start).

    .venv/bin/python benchmarks/bench_start.py --shortcut [--rounds 3] [--engine delta-rs|delta-spark]
    .venv/bin/python benchmarks/bench_start.py [--rounds 3] [--engine delta-rs|delta-spark]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.demo import prepare_workload
from record import Figure, changed_options, write_result

from ingest.config import load_config
from ingest.spark.class_archive import SWITCH, build

console = Console(width=120)
ROOT = Path(__file__).resolve().parent.parent


def _run(config: Path, archive: bool, full_start: bool) -> float:
    env = {**os.environ, SWITCH: "on" if archive else "off"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(config), *(["--full-start"] * full_start)],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=("delta-rs", "delta-spark"), default="delta-rs")
    parser.add_argument("--shortcut", action="store_true",
                        help="the caught-up run as it runs against the same run forced through the whole start")
    args = parser.parse_args()
    # (label, class archive, --full-start): the side measured, then the side it is measured against
    sides = ([("as it runs", True, False), ("forced whole start", True, True)] if args.shortcut
             else [("with the class archive", True, True), ("without", False, True)])
    build()
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
        raw["workdir"] = str(work)
        raw["target"] = {**raw.get("target", {}), "writer": args.engine}
        raw["quality"]["expectations_dir"] = str(ROOT / "expectations")
        for table in raw["tables"] if not args.shortcut else []:
            for key in ("expectations", "expectation_policies", "quality_policy"):  # GX's import is not measured here
                table.pop(key, None)
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(raw))
        prepare_workload(load_config(config), events=500, seed=1, malformed_fraction=0.0)
        console.print(f"catching up first ({args.engine}), not timed")
        _run(config, archive=True, full_start=False)
        times: dict[str, list[float]] = {label: [] for label, _, _ in sides}
        for n in range(args.rounds):
            for label, archive, full_start in (sides if n % 2 == 0 else sides[::-1]):
                times[label].append(_run(config, archive, full_start))
                console.print(f"round {n + 1}: {label} {times[label][-1]:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Table(title=f"a caught-up `ingest run` ({args.engine}), {args.rounds} rounds, wall seconds")
    for col in ("run", "median", "min", "max"):
        out.add_column(col, justify="left" if col == "run" else "right")
    for label, runs in reversed(times.items()):
        out.add_row(label, f"{statistics.median(runs):.1f}", f"{min(runs):.1f}", f"{max(runs):.1f}")
    console.print(out)
    (measured, _, _), (against, _, _) = sides
    ratio = statistics.median(times[measured]) / statistics.median(times[against])
    console.print(f"ratio {measured} / {against} (medians): {ratio:.2f}")
    figures = []
    for side, runs in reversed(times.items()):
        figures += [Figure(f"{side}: median", round(statistics.median(runs), 1), "s"),
                    Figure(f"{side}: min", round(min(runs), 1), "s"), Figure(f"{side}: max", round(max(runs), 1), "s")]
    figures.append(Figure(f"ratio {measured} / {against} (medians)", round(ratio, 2)))
    console.print(f"result: {write_result('bench_start', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
