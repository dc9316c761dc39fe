"""Where the test suite's time goes, from the JUnit XML pytest writes (not a test).

Prints the worker seconds of the whole run (setup, call and teardown of every test, summed over the
xdist workers), the costliest modules, and the lines of ``MODULE_SECONDS`` in ``tests/conftest.py``
that would schedule them. Given a second file (an earlier run, say of an earlier commit), it also
compares the tests both runs have -- what got slower or faster on the same tests -- apart from the
tests only one of them has. ``--memory`` lists instead the tests that raised their worker's peak
resident memory most (``tests/memory.py`` records it).

    CI=true .venv/bin/python -m pytest -n 2 --junitxml=/tmp/after.xml
    .venv/bin/python scripts/suite_times.py /tmp/after.xml [--against /tmp/before.xml] [--top 20]
    .venv/bin/python scripts/suite_times.py .test-results/suite.xml --memory
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=140)


def test_id(case: ET.Element) -> str:
    """A JUnit ``testcase``'s test id (``path::name[case]``)."""
    return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"


def test_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test id of one run."""
    return {test_id(case): float(case.get("time", 0)) for case in ET.parse(junit).iter("testcase")}


def memory_rises(junit: Path) -> list[tuple[str, float, float]]:
    """``(test, MiB it raised its worker's peak by, the peak after it)``, the largest rise first."""
    out = []
    for case in ET.parse(junit).iter("testcase"):
        found = {p.get("name"): float(p.get("value", 0)) for p in case.iter("property")}
        if "rss_rise_mib" in found:
            out.append((test_id(case), found["rss_rise_mib"], found["peak_rss_mib"]))
    return sorted(out, key=lambda row: -row[1])


def by_module(seconds: dict[str, float]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for test, spent in seconds.items():
        totals[test.split("::", 1)[0]] += spent
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--against", type=Path, help="the JUnit XML of another run, to compare with")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--memory", action="store_true", help="the tests that raised their worker's peak memory most")
    args = parser.parse_args()
    if args.memory:
        rises = Table(title=f"the {args.top} tests that raised their worker's peak resident memory most")
        for col in ("test", "rise MiB", "peak after MiB"):
            rises.add_column(col, justify="left" if col == "test" else "right")
        for test, rise, peak in memory_rises(args.junit)[:args.top]:
            rises.add_row(test, f"{rise:,.0f}", f"{peak:,.0f}")
        console.print(rises)
        return
    after = test_seconds(args.junit)
    modules = by_module(after)
    console.print(f"{len(after)} tests, {sum(after.values()):,.0f} worker seconds")
    out = Table(title=f"the {args.top} costliest modules")
    out.add_column("module")
    out.add_column("seconds", justify="right")
    out.add_column("tests", justify="right")
    counts = Counter(test.split("::", 1)[0] for test in after)
    for module, spent in modules.most_common(args.top):
        out.add_row(module, f"{spent:,.0f}", str(counts[module]))
    console.print(out)
    console.print("MODULE_SECONDS (tests/conftest.py, modules outside tests/stack/):")
    console.print(", ".join(f'"{m}": {round(s, -1):.0f}' for m, s in modules.most_common(args.top)
                            if not m.startswith("tests/stack/")), highlight=False, soft_wrap=True)
    if args.against is None:
        return
    before = test_seconds(args.against)
    common = after.keys() & before.keys()
    compare = Table(title=f"against {args.against.name}")
    for col in ("tests", "count", "seconds before", "seconds after"):
        compare.add_column(col, justify="left" if col == "tests" else "right")
    compare.add_row("in both runs", str(len(common)), f"{sum(before[t] for t in common):,.0f}",
                    f"{sum(after[t] for t in common):,.0f}")
    only_before, only_after = before.keys() - common, after.keys() - common
    compare.add_row("only before", str(len(only_before)), f"{sum(before[t] for t in only_before):,.0f}", "")
    compare.add_row("only after", str(len(only_after)), "", f"{sum(after[t] for t in only_after):,.0f}")
    console.print(compare)
    moved = Table(title=f"the {args.top} modules whose shared tests changed most")
    for col in ("module", "seconds before", "seconds after", "change"):
        moved.add_column(col, justify="left" if col == "module" else "right")
    was, now = by_module({t: before[t] for t in common}), by_module({t: after[t] for t in common})
    for module in sorted(was, key=lambda m: -abs(now[m] - was[m]))[:args.top]:
        moved.add_row(module, f"{was[module]:,.0f}", f"{now[module]:,.0f}", f"{now[module] - was[module]:+,.0f}")
    console.print(moved)


if __name__ == "__main__":
    main()
