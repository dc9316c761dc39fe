"""What Ctrl-C does to an `ingest run` through Spark, pressed at chosen moments of it (not a test).

The demo's tables over a workload of ``--events`` changes, applied through Spark
(``source.driver_seconds: 0``) in micro-batches of ``--batch`` records, the suites kept. For each
moment in ``--at`` (seconds after the command starts), the lake is emptied, ``ingest run`` starts in
a session of its own, and SIGINT goes to its process group, as a terminal's Ctrl-C does. The table
says which handler took the press (from what the run printed: the start's guard, the run's watch of
its queries, PySpark's own, Python's before Spark or in its launch), the exit codes, how long the
run took to end after the press, whether it printed its report, the tracebacks it printed (and
which part of PySpark printed them), its error lines, and the processes of its session still there
3 s after it ended (a Spark JVM left behind holds its memory and the run's output for good: they
are killed then). A run that has not ended 120 s after the press is killed and shown as such, once
its threads' stacks are taken: its JVMs' with ``jstack``, its Python threads' on its stderr
(``--keep`` keeps both).

With ``--against DIR``, the same presses go to another checkout's run too (``git worktree add
/tmp/before <commit>``), taking turns: what a change to the stop gained.

    .venv/bin/python benchmarks/bench_ctrl_c.py [--at 1 2 4 6 8 12] [--rounds 1] [--events 20000]
    .venv/bin/python benchmarks/bench_ctrl_c.py --against /tmp/before [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
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
from ingest.spark.class_archive import build

console = Console(width=140)
ROOT = Path(__file__).resolve().parent.parent
#: How long a run may take to end after the press before it counts as not ending.
PATIENCE = 120.0
#: How long after the run ended its session's processes are looked for.
LINGER = 3.0
#: What the run logs as it takes the press, by who took it.
TAKEN_BY = {"interrupted while the run starts": "the start's guard",
            "the micro-batch under way finishes": "the run's watch",
            "the batch under way finishes": "the driver's batches"}
#: Who printed a traceback, by a file its stack passes through (else "elsewhere").
TRACEBACK_FROM = {"pyspark/accumulators.py": "accumulator server",
                  "python_streaming_source_runner.py": "streaming source runner"}


@dataclass(frozen=True)
class Press:
    """What one press did."""

    taken_by: str
    code: int | None  # None: not ended within PATIENCE
    seconds: float  # from the press to the run's end
    report: bool
    tracebacks: int
    traceback_from: frozenset[str]
    errors: int
    left: int  # processes of the run's session still there LINGER s after it ended
    left_mib: float


def _session(sid: int) -> dict[int, float]:
    """The processes of session ``sid``, with their resident memory (MiB)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, IndexError, ValueError):
            continue  # it ended while it was read
    return found


def _dump_stacks(pid: int, into: Path) -> None:
    """Where a run that did not end is stuck: its JVMs' threads (``jstack``) into ``into``, then its
    Python threads on its stderr (SIGABRT, which faulthandler answers with every thread's stack)."""
    with into.open("w") as out:
        for java in _session(pid):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):  # it ended, or jstack hung
                if Path(f"/proc/{java}/exe").resolve(strict=True).name == "java":
                    subprocess.run(["jstack", str(java)], stdout=out, stderr=subprocess.STDOUT, check=False,
                                   timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGABRT)
    time.sleep(2)


def _traceback_from(stderr: str) -> frozenset[str]:
    """Who printed the tracebacks in ``stderr`` (chained ones count with the first)."""
    found = set()
    for block in stderr.split("Traceback (most recent call last):")[1:]:
        found.add(next((who for file, who in TRACEBACK_FROM.items() if file in block), "elsewhere"))
    return frozenset(found)


def _press(config: Path, at: float, checkout: Path | None, work: Path) -> Press:
    env = dict(os.environ) | {"PYTHONFAULTHANDLER": "1"}  # SIGABRT then prints every thread's stack
    if checkout is not None:
        env["PYTHONPATH"] = f"{checkout}{os.pathsep}{checkout / 'harness' / 'src'}"
    out_path, err_path = work / "stdout.txt", work / "stderr.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        run = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "-c", str(config)], stdout=out,
                               stderr=err, start_new_session=True, env=env, cwd=checkout or ROOT)
        time.sleep(at)
        pressed = time.perf_counter()
        os.killpg(run.pid, signal.SIGINT)
        try:
            code: int | None = run.wait(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.perf_counter() - pressed
        if code is None:
            _dump_stacks(run.pid, work / "stacks.txt")
        time.sleep(LINGER)
        left = _session(run.pid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    lines = stderr.splitlines()
    if code is None:  # the run's own error lines, not the abort that took its stacks
        lines = [line for line in lines if not line.startswith("Fatal Python error: Aborted")]
    taken_by = next((who for said, who in TAKEN_BY.items() if said in stderr), None)
    if taken_by is None:
        if "cancelAllJobs" in stderr or "py4j" in stderr.lower():
            taken_by = "PySpark's handler"
        elif code == 130 and left:  # cut short, Spark's launch leaves its JVM behind
            taken_by = "Python's, in Spark's launch"
        elif code == 130:
            taken_by = "Python's, before Spark"
        else:
            taken_by = "no one: ignored"
    return Press(taken_by, code, seconds, "│ customers" in stdout, sum("Traceback" in line for line in lines),
                 _traceback_from(stderr),
                 sum("error:" in line or " ERROR " in line for line in lines), len(left), sum(left.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=float, nargs="+", default=[1, 2, 4, 6, 8, 12],
                        help="seconds after the command starts at which Ctrl-C is pressed")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000, help="source.max_records_per_batch")
    parser.add_argument("--against", type=Path, metavar="DIR", help="another checkout's run, pressed alike")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep each run's output here, to read what it printed")
    args = parser.parse_args()
    sides: list[tuple[str, Path | None]] = [("this checkout", None)]
    if args.against:
        sides.append((f"checkout {args.against.name}", args.against.resolve()))
    # The runs start as a terminal's foreground command does: Ctrl-C's default action, even when this
    # script runs as a background job, whose shell has it ignore Ctrl-C (and its commands inherit that).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    build()
    work = Path(tempfile.mkdtemp(prefix="bench-ctrl-c-"))
    presses: dict[tuple[str, float], list[Press]] = {(side, at): [] for side, _ in sides for at in args.at}
    try:
        raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
        raw["workdir"] = str(work)
        raw["quality"]["expectations_dir"] = str(ROOT / "expectations")
        raw["source"] |= {"driver_seconds": 0, "max_records_per_batch": args.batch}
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(raw))
        loaded = load_config(config)
        console.print(f"generating a workload of {args.events:,} changes")
        prepare_workload(loaded, events=args.events, seed=1, malformed_fraction=0.0)
        for n in range(args.rounds):
            for at in args.at:
                for label, checkout in sides if n % 2 == 0 else sides[::-1]:
                    for leftover in (loaded.tables_root, loaded.checkpoint_root, loaded.quality_results_dir):
                        shutil.rmtree(leftover, ignore_errors=True)
                    press = _press(config, at, checkout, work)
                    if args.keep:
                        args.keep.mkdir(parents=True, exist_ok=True)
                        for stream in ("stdout", "stderr", "stacks"):
                            if (work / f"{stream}.txt").exists():
                                shutil.copy(work / f"{stream}.txt",
                                            args.keep / f"{n + 1}-{label.replace(' ', '-')}-{at:g}s.{stream}.txt")
                    (work / "stacks.txt").unlink(missing_ok=True)
                    presses[(label, at)].append(press)
                    ended = f"exit {press.code}" if press.code is not None else f"not ended in {PATIENCE:.0f} s"
                    console.print(f"round {n + 1}, {label}, Ctrl-C at {at:g} s ({press.taken_by}): {ended} "
                                  f"after {press.seconds:.1f} s, {press.tracebacks} tracebacks, "
                                  f"{press.left} processes left")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    table = Table(title=f"Ctrl-C to `ingest run` through Spark ({args.events:,} changes, micro-batches of "
                        f"{args.batch:,}), {args.rounds} round(s)")
    for col in ("run", "pressed at", "taken by", "exit codes", "ended after (median)", "report",
                "tracebacks", "tracebacks from", "error lines", "processes left", "their memory"):
        table.add_column(col, justify="left" if col in ("run", "taken by", "exit codes") else "right")
    figures = []
    for (label, at), runs in presses.items():
        codes = ",".join("none" if p.code is None else str(p.code) for p in runs)
        taken = ", ".join(sorted({p.taken_by for p in runs}))
        seconds = statistics.median(p.seconds for p in runs)
        reports = sum(p.report for p in runs)
        worst = max(runs, key=lambda p: (p.left, p.tracebacks, p.errors))
        by_whom = Counter(who for p in runs for who in p.traceback_from)
        printed_by = ", ".join(f"{who} ({n} of {len(runs)})" for who, n in sorted(by_whom.items())) or "-"
        table.add_row(label, f"{at:g} s", taken, codes, f"{seconds:.1f} s", f"{reports} of {len(runs)}",
                      str(sum(p.tracebacks for p in runs)), printed_by, str(sum(p.errors for p in runs)),
                      str(sum(p.left for p in runs)), f"{worst.left_mib:.0f} MiB")
        name = f"{label}, Ctrl-C at {at:g} s"
        figures += [Figure(f"{name}: taken by", taken), Figure(f"{name}: exit codes", codes),
                    Figure(f"{name}: ended after (median)", round(seconds, 1), "s"),
                    Figure(f"{name}: reports printed", reports),
                    Figure(f"{name}: tracebacks", sum(p.tracebacks for p in runs)),
                    Figure(f"{name}: tracebacks from", printed_by),
                    Figure(f"{name}: processes left", sum(p.left for p in runs))]
    console.print(table)
    variant = changed_options(parser, args, ignore=["against", "keep"])
    if args.against:
        variant["against"] = checkout_commit(args.against)
    console.print(f"result: {write_result('bench_ctrl_c', variant, figures)}")


if __name__ == "__main__":
    main()
