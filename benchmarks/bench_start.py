"""What the class archive saves on an `ingest run` that has nothing to do (not a test).

A caught-up run is almost all start-up: Python imports, the driver JVM and its context, the Python
workers' warm-up and the streaming query's start. This times that command, end to end as a user runs
it, with the driver's class archive (:mod:`ingest.spark.class_archive`) and without it
(``INGEST_CLASS_ARCHIVE=off``), alternating which goes first, on the demo's tables with the engine
given (delta-spark loads Delta's classes too).

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


def _run(config: Path, archive: bool) -> float:
    env = {**os.environ, SWITCH: "on" if archive else "off"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(config)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=("delta-rs", "delta-spark"), default="delta-rs")
    args = parser.parse_args()
    build()
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
        raw["workdir"] = str(work)
        raw["target"] = {**raw.get("target", {}), "writer": args.engine}
        raw["quality"]["expectations_dir"] = str(ROOT / "expectations")
        for table in raw["tables"]:
            for key in ("expectations", "expectation_policies", "quality_policy"):  # GX's import is not measured here
                table.pop(key, None)
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(raw))
        prepare_workload(load_config(config), events=500, seed=1, malformed_fraction=0.0)
        console.print(f"catching up first ({args.engine}), not timed")
        _run(config, archive=True)
        times: dict[bool, list[float]] = {True: [], False: []}
        for n in range(args.rounds):
            for archive in ((True, False) if n % 2 == 0 else (False, True)):
                times[archive].append(_run(config, archive))
                console.print(f"round {n + 1}: {'with' if archive else 'without'} the archive "
                              f"{times[archive][-1]:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Table(title=f"a caught-up `ingest run` ({args.engine}), {args.rounds} rounds, wall seconds")
    for col in ("driver JVM", "median", "min", "max"):
        out.add_column(col, justify="left" if col == "driver JVM" else "right")
    for archive in (False, True):
        runs = times[archive]
        out.add_row("with the class archive" if archive else "without", f"{statistics.median(runs):.1f}",
                    f"{min(runs):.1f}", f"{max(runs):.1f}")
    console.print(out)
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    console.print(f"ratio with / without (medians): {ratio:.2f}")
    figures = []
    for archive in (False, True):
        runs, side = times[archive], "with the class archive" if archive else "without"
        figures += [Figure(f"{side}: median", round(statistics.median(runs), 1), "s"),
                    Figure(f"{side}: min", round(min(runs), 1), "s"), Figure(f"{side}: max", round(max(runs), 1), "s")]
    figures.append(Figure("ratio with / without (medians)", round(ratio, 2)))
    console.print(f"result: {write_result('bench_start', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
