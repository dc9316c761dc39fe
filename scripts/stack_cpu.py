"""The CPU the stack's Java servers take on this machine (not a test).

Starts PostgreSQL, Kafka, the registry and Connect (``harness.stack``, on ``$STACK_DIR``; the stack must
be down), then prints each Java server's CPU seconds until ``up`` returned and over ``--idle`` seconds
after it, and stops the stack. ``harness/src/harness/stack/tools.py``'s ``LEAN_JVM`` cites its figures;
run it once on each side of a change to those flags, with nothing else on the machine.

    .venv/bin/python scripts/stack_cpu.py [--idle 120]
"""

from __future__ import annotations

import argparse
import time

from cpu_by_process import process_stat
from harness.stack import Stack
from rich.console import Console
from rich.table import Table

JAVA_SERVERS = ("kafka", "registry", "connect")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    return process_stat(pid)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=120.0, help="seconds to measure after up (default 120)")
    args = parser.parse_args()
    stack = Stack.from_env()
    started = time.monotonic()
    stack.up(["pg", *JAVA_SERVERS])
    up_seconds = time.monotonic() - started
    try:
        pids = {name: stack.component(name).pid() for name in JAVA_SERVERS}
        at_up = {name: cpu_seconds(pid) for name, pid in pids.items() if pid}
        time.sleep(args.idle)
        idle = {name: cpu_seconds(pid) - at_up[name] for name, pid in pids.items() if pid}
    finally:
        stack.down()
    out = Table(title=f"the stack's Java servers: up in {up_seconds:.0f} s")
    for col in ("server", "CPU s until up", f"CPU s over {args.idle:.0f} idle s"):
        out.add_column(col, justify="left" if col == "server" else "right")
    for name in at_up:
        out.add_row(name, f"{at_up[name]:.1f}", f"{idle[name]:.1f}")
    out.add_row("all", f"{sum(at_up.values()):.1f}", f"{sum(idle.values()):.1f}")
    Console().print(out)


if __name__ == "__main__":
    main()
