"""What a benchmark measured, kept as a JSON file that the documentation is rendered from (not a test).

A benchmark script calls :func:`write_result` once it has printed its table: the file holds the
benchmark's name, the options it ran with (its *variant*), the command, the date, the commit and the
machine, and the figures. One file per benchmark and variant, under ``benchmarks/results/``: the
next run of the same variant replaces it, and git keeps the earlier ones.
``benchmarks/render_results.py`` renders ``docs/benchmarks.md`` from these files.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: A figure's value: a number, a yes/no, a short text, or nothing measured (None).
Value = float | int | bool | str | None


@dataclass(frozen=True)
class Figure:
    """One measured figure, named as the script's printed table names it."""

    name: str
    value: Value
    unit: str = ""


def changed_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    ignore: Iterable[str] = ()) -> dict[str, Any]:
    """The options a run was given that differ from the script's defaults: what tells its variant."""
    skip = set(ignore)
    out: dict[str, Any] = {}
    for name, value in sorted(vars(args).items()):
        if name in skip or value == parser.get_default(name):
            continue
        out[name] = str(value) if isinstance(value, Path) else value
    return out


def variant_slug(variant: Mapping[str, Any]) -> str:
    """The variant as part of a file name: ``default``, or ``format-avro_batch-200000`` and so on."""
    if not variant:
        return "default"
    def word(value: Any) -> str:
        return re.sub(r"[^A-Za-z0-9.=]+", "-", str(value).replace("_", "-")).strip("-")

    return "_".join(f"{word(key)}-{word(value)}" for key, value in sorted(variant.items()))[:150]


def _git(*argv: str) -> str:
    try:
        done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def commit() -> dict[str, Any]:
    """The checkout the figures were measured on; ``dirty``: tracked files differed from it."""
    return {"sha": _git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def checkout_commit(checkout: Path) -> str:
    """Another checkout's commit, short: what a run ``--against DIR`` was measured against."""
    return _git("-C", str(checkout), "rev-parse", "--short", "HEAD") or "unknown"


def machine() -> dict[str, Any]:
    """What ran it: cores, memory, processor, system and Python."""
    memory_gib = None
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "memory_gib": memory_gib, "cpu": cpu,
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def write_result(benchmark: str, variant: Mapping[str, Any], figures: Sequence[Figure], *,
                 results_dir: Path = RESULTS, argv: Sequence[str] | None = None,
                 when: datetime | None = None) -> Path:
    """Write one run's result file (replacing the variant's previous one) and return its path.

    Args:
        benchmark: the script's name without ``.py``, e.g. ``bench_compare``.
        variant: the options that tell this run from the script's default run (:func:`changed_options`).
        figures: what it measured, in the order its table prints them.
        results_dir: where result files go (tests give a temporary directory).
        argv: the command line (default: this process's).
        when: the time of the run (default: now, UTC).
    """
    words = list(sys.argv if argv is None else argv)
    if words and words[0].endswith(".py"):
        words[0] = os.path.relpath(Path(words[0]).resolve(), ROOT)
    result = {
        "benchmark": benchmark,
        "variant": dict(variant),
        "command": shlex.join(["python", *words]),
        "date": (when or datetime.now(UTC)).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "figures": [asdict(f) for f in figures],
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{benchmark}--{variant_slug(variant)}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def read_results(results_dir: Path = RESULTS) -> list[dict[str, Any]]:
    """Every result file, by benchmark then variant."""
    found = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))] if results_dir.is_dir() else []
    return sorted(found, key=lambda r: (r["benchmark"], variant_slug(r.get("variant", {}))))
