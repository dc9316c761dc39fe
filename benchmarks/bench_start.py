"""What an `ingest run` that has nothing to do costs (not a test).

The demo's tables are caught up first; then the same command is timed, end to end as a user runs it,
two ways, taking turns which goes first:

* ``--shortcut``: as it runs (the run sees that every table's Delta log holds every offset of its
  topic and ends without Spark or Great Expectations, :mod:`ingest.stream.caught_up`) against the
  same run forced through the whole start (``ingest run --full-start``: GX's import and the suites,
  the Spark session, the streaming query). The demo's quality suites are kept, as a user has them.
* ``--against DIR``: this checkout's forced whole start against the same run of another checkout
  (``DIR``, e.g. a worktree of an earlier commit: ``git worktree add /tmp/before <commit>``), with the
  demo's suites, as a user has them: what a change to the start gained or cost. A checkout older
  than ``--full-start`` has no shortcut and takes the whole start anyway. With ``--shortcut``, both
  checkouts' caught-up runs as they run.
* ``--backlog EVENTS``: a run with work, as a scheduled run finds it: the demo's tables hold none of a
  workload of ``EVENTS`` changes, and the run applies them all, with ``source.driver_seconds`` (the
  driver applies them without starting Spark, :mod:`ingest.stream.driver_run`) and without it
  (Spark's session and query). The tables are emptied before every run; the suites are kept.
* otherwise, the forced whole start with the driver's class archive (:mod:`ingest.spark.class_archive`)
  and without it (``INGEST_CLASS_ARCHIVE=off``), the suites left out (Python imports, the driver JVM
  and its context, the Python workers' warm-up and the query's start).

    .venv/bin/python benchmarks/bench_start.py --shortcut [--rounds 3] [--engine delta-rs|delta-spark]
    .venv/bin/python benchmarks/bench_start.py --against /tmp/before [--rounds 5]
    .venv/bin/python benchmarks/bench_start.py --backlog 5000 [--rounds 3]
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
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.demo import prepare_workload
from record import Figure, changed_options, checkout_commit, write_result

from ingest.config import load_config
from ingest.spark.class_archive import SWITCH, build

console = Console(width=120)
#: --backlog: the driver's budget, longer than any backlog the script is run with takes there
DRIVER_SECONDS = 60
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Side:
    """One way of running the caught-up command."""

    label: str
    archive: bool = True
    full_start: bool = True
    checkout: Path | None = None  # another checkout's code (its runtime and harness) instead of this one's
    on_driver: bool = False  # with --backlog: the configuration with source.driver_seconds (DRIVER_SECONDS)


def _run(config: Path, side: Side) -> float:
    if side.on_driver:
        config = config.with_name(f"driver-{config.name}")
    env = {**os.environ, SWITCH: "on" if side.archive else "off"}
    if side.checkout is not None:
        env["PYTHONPATH"] = f"{side.checkout}{os.pathsep}{side.checkout / 'harness' / 'src'}"
    started = time.perf_counter()
    flags = ["--full-start"] if side.full_start else []
    subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(config), *flags], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=side.checkout or ROOT)
    return time.perf_counter() - started


def _against(args: argparse.Namespace) -> dict[str, str]:
    """The other checkout, by its commit, for the result file's name."""
    return {"against": checkout_commit(args.against)} if args.against else {}


def _knows_full_start(checkout: Path) -> bool:
    """Whether a checkout's ``ingest run`` has ``--full-start`` (older ones always take the whole start)."""
    return "full_start" in (checkout / "ingest" / "cli" / "commands.py").read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=("delta-rs", "delta-spark"), default="delta-rs")
    parser.add_argument("--shortcut", action="store_true",
                        help="the caught-up run as it runs against the same run forced through the whole start")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="this checkout's whole start against another checkout's (suites kept)")
    parser.add_argument("--backlog", type=int, metavar="EVENTS",
                        help="a run that applies a workload of this many changes, on the driver against through Spark")
    args = parser.parse_args()
    if args.backlog and (args.against or args.shortcut):
        parser.error("--backlog is a comparison of its own: without --against and --shortcut")
    # the side measured, then the side it is measured against
    if args.against:  # with --shortcut, both as they run (caught up); else both through the whole start
        other, whole = args.against.resolve(), not args.shortcut
        sides = [Side("this checkout", full_start=whole),
                 Side(f"checkout {other.name}", full_start=whole and _knows_full_start(other), checkout=other)]
    elif args.backlog:
        sides = [Side("on the driver", full_start=False, on_driver=True), Side("through Spark", full_start=False)]
    elif args.shortcut:
        sides = [Side("as it runs", full_start=False), Side("forced whole start")]
    else:
        sides = [Side("with the class archive"), Side("without", archive=False)]
    keep_suites = bool(args.shortcut or args.against or args.backlog)
    build()
    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
        raw["workdir"] = str(work)
        raw["target"] = {**raw.get("target", {}), "writer": args.engine}
        raw["quality"]["expectations_dir"] = str(ROOT / "expectations")
        for table in raw["tables"] if not keep_suites else []:
            for key in ("expectations", "expectation_policies", "quality_policy"):  # GX's import is not measured here
                table.pop(key, None)
        config = work / "config.yaml"
        raw["source"]["driver_seconds"] = 0  # through Spark, whatever the backlog
        config.write_text(yaml.safe_dump(raw))
        raw["source"]["driver_seconds"] = DRIVER_SECONDS
        config.with_name(f"driver-{config.name}").write_text(yaml.safe_dump(raw))
        loaded = load_config(config)
        prepare_workload(loaded, events=args.backlog or 500, seed=1, malformed_fraction=0.0)
        if not args.backlog:
            console.print(f"catching up first ({args.engine}), not timed")
            _run(config, Side("catch-up", full_start=False))
        times: dict[str, list[float]] = {side.label: [] for side in sides}
        for n in range(args.rounds):
            for side in sides if n % 2 == 0 else sides[::-1]:
                if args.backlog:  # every run finds the whole workload to apply
                    for leftover in (loaded.tables_root, loaded.checkpoint_root, loaded.quality_results_dir):
                        shutil.rmtree(leftover, ignore_errors=True)
                times[side.label].append(_run(config, side))
                console.print(f"round {n + 1}: {side.label} {times[side.label][-1]:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    what = f"an `ingest run` applying {args.backlog:,} changes" if args.backlog else "a caught-up `ingest run`"
    out = Table(title=f"{what} ({args.engine}), {args.rounds} rounds, wall seconds")
    for col in ("run", "median", "min", "max"):
        out.add_column(col, justify="left" if col == "run" else "right")
    for label, runs in reversed(times.items()):
        out.add_row(label, f"{statistics.median(runs):.1f}", f"{min(runs):.1f}", f"{max(runs):.1f}")
    console.print(out)
    measured, against = (side.label for side in sides)
    ratio = statistics.median(times[measured]) / statistics.median(times[against])
    console.print(f"ratio {measured} / {against} (medians): {ratio:.2f}")
    figures = []
    for label, runs in reversed(times.items()):
        figures += [Figure(f"{label}: median", round(statistics.median(runs), 1), "s"),
                    Figure(f"{label}: min", round(min(runs), 1), "s"),
                    Figure(f"{label}: max", round(max(runs), 1), "s")]
    figures.append(Figure(f"ratio {measured} / {against} (medians)", round(ratio, 2)))
    variant = changed_options(parser, args, ignore=["against"]) | _against(args)
    console.print(f"result: {write_result('bench_start', variant, figures)}")


if __name__ == "__main__":
    main()
