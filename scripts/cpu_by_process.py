"""Where a command's CPU goes, by kind of process (not a test).

Runs the command, reads every process's CPU from ``/proc`` each ``--interval`` seconds while it runs,
and prints the CPU seconds by kind of process (a Spark driver JVM, Spark's Python workers, a pytest
worker, an ``ingest`` command, a stack server ...) and by what started it (the nearest pytest worker
or ``ingest`` command above it). On a machine that the command saturates, its wall time follows its
CPU: this is where to look for what to cut. The whole machine's busy CPU over the same time is shown
beside the sampled total; a process that lives less than an interval is missed, and so is a process
that ends before the first sample after its last CPU. Processes that ran before the command count
only from its start.

    .venv/bin/python scripts/cpu_by_process.py -- make test
    .venv/bin/python scripts/cpu_by_process.py --out cpu.json -- .venv/bin/python -m pytest tests/apply
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from harness.cpu import TICKS, busy_seconds
from rich.console import Console
from rich.table import Table

#: Java main classes (or jar names) of the servers and of Spark's driver, by kind.
JAVA_KINDS = (("SparkSubmit", "Spark driver JVM"), ("kafka.Kafka", "Kafka broker"),
              ("ConnectDistributed", "Kafka Connect"), ("quarkus", "schema registry"), ("apicurio", "schema registry"))
#: The kinds that own what they start, for the "started by" column.
OWNERS = ("pytest worker", "ingest command", "pytest")


@dataclass
class Seen:
    kind: str
    argv: tuple[str, ...]
    owner: str
    base: float
    cpu: float


def kind_of(argv: tuple[str, ...]) -> str:
    """The kind of process ``argv`` runs."""
    if not argv:
        return "kernel threads"
    program = Path(argv[0]).name
    if program.startswith("java"):
        line = " ".join(argv)
        known = next((kind for key, kind in JAVA_KINDS if key in line), None)
        return known or f"JVM {_main_class(argv)}"
    if program.startswith("python"):
        at = argv.index("-c") if "-c" in argv[1:] else 0
        if at and "-m" not in argv[1:at]:
            inline = argv[at + 1] if at + 1 < len(argv) else ""
            if "exec(eval(sys.stdin.readline()))" in inline:
                return "pytest worker"  # pytest-xdist's worker, started through execnet
            return "python -c (inline code)"
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        if module == "pyspark.daemon" or module == "pyspark.worker":
            return "Spark Python workers"
        if module.startswith("pyspark."):
            return "Spark Python runners"
        if module == "ingest.cli" or Path(script).name == "ingest":
            return "ingest command"
        if module == "pytest" or Path(script).name in ("pytest", "py.test"):
            return "pytest"
        if module.startswith("moto"):
            return "moto (S3 server)"
        return f"python -m {module}" if module else f"python {Path(script).name}"
    if program in ("ingest", "uv", "pip", "make", "go"):
        return {"ingest": "ingest command"}.get(program, program)
    if program.startswith(("postgres", "postmaster")):
        return "PostgreSQL"
    if program.startswith(("mariadbd", "mysqld")):
        return "MariaDB"
    return program


def _main_class(argv: tuple[str, ...]) -> str:
    """The class (or ``-jar`` file) a ``java`` command line runs: its first word that is not an option or
    an option's value."""
    takes_value = ("-cp", "-classpath", "--class-path", "--module-path", "-p", "--add-modules", "-jar")
    words = iter(argv[1:])
    for word in words:
        if word in takes_value:
            value = next(words, "")
            if word == "-jar":
                return Path(value).name
        elif not word.startswith("-"):
            return word.rsplit(".", 1)[-1]
    return "(unknown)"


def process_stat(pid: str | int) -> tuple[int, int, float]:
    """``pid``'s parent, start time (ticks since boot) and CPU seconds so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICKS


def _argv(pid: str) -> tuple[str, ...]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)


class Sampler:
    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], Seen] = {}
        self.current: dict[int, tuple[int, int]] = {}
        self.me = os.getpid()

    def _owner(self, ppid: int) -> str:
        parent = self.seen.get(self.current.get(ppid, (0, 0)))
        if parent is None:
            return "-"
        return parent.kind if parent.kind in OWNERS else parent.owner

    def sample(self, *, first: bool = False) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == self.me:
                continue
            try:
                ppid, start, cpu = process_stat(pid)
                key = (int(pid), start)
                entry = self.seen.get(key)
                if entry is None:
                    argv = _argv(pid)
                    self.seen[key] = Seen(kind_of(argv), argv, self._owner(ppid), cpu if first else 0.0, cpu)
                    self.current[int(pid)] = key
                    continue
                entry.cpu = cpu
                argv = _argv(pid)
                if argv and argv != entry.argv:  # a launcher that exec'd what it runs (spark-submit -> java)
                    entry.kind, entry.argv = kind_of(argv), argv
            except (OSError, ValueError, IndexError):
                continue  # ended between the listing and the read

    def by_kind(self) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for entry in self.seen.values():
            out[(entry.kind, entry.owner)] += entry.cpu - entry.base
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--top", type=int, default=25, help="rows to print (default 25)")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    sampler = Sampler()
    sampler.sample(first=True)
    busy, started = busy_seconds(), time.monotonic()
    child = subprocess.Popen(command)
    while child.poll() is None:
        time.sleep(args.interval)
        sampler.sample()
    wall, busy = time.monotonic() - started, busy_seconds() - busy
    totals = sampler.by_kind()
    sampled = sum(totals.values())
    table = Table(title=f"CPU by kind of process: {' '.join(command)} (exit {child.returncode})")
    for column in ("kind", "started by", "CPU s", "share"):
        table.add_column(column, justify="left" if column in ("kind", "started by") else "right")
    for (kind, owner), seconds in totals.most_common(args.top):
        table.add_row(kind, owner, f"{seconds:,.0f}", f"{seconds / sampled:.1%}" if sampled else "-")
    console = Console()
    console.print(table)
    console.print(f"wall {wall:,.0f} s; the machine's busy CPU {busy:,.0f} s ({busy / wall:.2f} of "
                  f"{os.cpu_count()} cores); sampled {sampled:,.0f} s ({sampled / busy:.0%} of it)" if busy and wall
                  else f"wall {wall:,.0f} s")
    if args.out:
        args.out.write_text(json.dumps({
            "command": command, "exit": child.returncode, "wall_seconds": round(wall, 1),
            "busy_cpu_seconds": round(busy, 1), "sampled_cpu_seconds": round(sampled, 1),
            "by_kind": [{"kind": k, "started_by": o, "cpu_seconds": round(s, 1)} for (k, o), s in totals.most_common()],
        }, indent=1))
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
