"""Where a run's Spark time went, by kind of job, read from Spark's event log (not a test).

``bench_compare.py --jobs`` switches the engine's event log on (``spark.eventLog.*``) and prints this
table after its run; on its own, it reads any event log directory or file Spark wrote:

    .venv/bin/python benchmarks/spark_jobs.py bench-work/json-200000/eventlog

A job's kind is its description (Delta names its own: "Compute snapshot for version: 3",
"Writing Deletion Vectors ...") with the numbers taken out, or its call site when it has none; a
streaming micro-batch's jobs are one kind. One statement often runs as several jobs (adaptive
execution runs each query stage as a job of its own), so the counts are jobs, not statements.
Jobs of different threads overlap: the seconds add up to more than the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.table import Table

#: Spark's event log codecs, by file suffix, as pyarrow names them.
_CODECS = {".zstd": "zstd", ".lz4": "lz4", ".snappy": "snappy"}


def setting(pair: str) -> tuple[str, str]:
    """A ``KEY=VALUE`` command-line argument as a Spark setting (an argparse ``type``)."""
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"a Spark setting is KEY=VALUE, not {pair!r}")
    return key.strip(), value.strip()


@dataclass
class JobKind:
    """The jobs of one kind: how many, their seconds in all, their tasks in all."""

    kind: str
    jobs: int = 0
    seconds: float = 0.0
    tasks: int = 0


def kind_of(description: str, call_site: str) -> str:
    """A job's kind: its description, numbers out, or its call site."""
    text = (description or call_site or "(no description)").split("\n")[0]
    if "runId = " in (description or "") or re.search(r"\bbatch = \d+", description or ""):
        return "streaming micro-batch (read and decode)"
    return re.sub(r"\d+", "N", text)[:100]


def events(path: Path) -> Iterator[dict]:
    """The events of an event log: a file, or every log file under a directory (Spark 4 writes a
    directory ``eventlog_v2_<app>`` of ``events_<n>_<app>`` files; one file when rolling is off)."""
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and not p.name.endswith(".crc") and "appstatus" not in p.name)
    if not files:
        raise SystemExit(f"no Spark event log in {path}")
    for file in files:
        codec = _CODECS.get(file.suffix)
        with pa.input_stream(str(file), compression=codec) as stream:
            for line in stream.read().decode().splitlines():
                if line.strip():
                    yield json.loads(line)


def job_kinds(path: Path) -> list[JobKind]:
    """Every finished job of the log, grouped by kind, the costliest first."""
    started: dict[int, tuple[str, int, int]] = {}
    kinds: dict[str, JobKind] = {}
    for event in events(path):
        name = event.get("Event")
        if name == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            kind = kind_of(props.get("spark.job.description") or "", props.get("callSite.short") or "")
            tasks = sum(s.get("Number of Tasks", 0) for s in event.get("Stage Infos", []))
            started[event["Job ID"]] = (kind, event["Submission Time"], tasks)
        elif name == "SparkListenerJobEnd" and event["Job ID"] in started:
            kind, submitted, tasks = started.pop(event["Job ID"])
            entry = kinds.setdefault(kind, JobKind(kind))
            entry.jobs += 1
            entry.tasks += tasks
            entry.seconds += (event["Completion Time"] - submitted) / 1000
    return sorted(kinds.values(), key=lambda k: -k.seconds)


def table(kinds: list[JobKind], title: str = "Spark jobs by kind") -> Table:
    out = Table(title=title)
    for column in ("kind", "jobs", "tasks", "seconds", "share"):
        out.add_column(column, justify="left" if column == "kind" else "right")
    total = sum(k.seconds for k in kinds) or 1.0
    for k in kinds:
        out.add_row(k.kind, str(k.jobs), str(k.tasks), f"{k.seconds:.1f}", f"{k.seconds / total:.0%}")
    out.add_row("all", str(sum(k.jobs for k in kinds)), str(sum(k.tasks for k in kinds)), f"{total:.1f}", "")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="an event log file, or the directory Spark wrote it in")
    args = parser.parse_args()
    Console().print(table(job_kinds(args.log)))


if __name__ == "__main__":
    main()
