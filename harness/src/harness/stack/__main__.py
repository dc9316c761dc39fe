"""``python -m harness.stack up|down|status|prepare|restart|env|jars [--components pg,kafka,...]``."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness.stack.errors import StackError
from harness.stack.stack import ORDER, Stack
from harness.stack.tools import ensure_jars


def _components(raw: str | None) -> list[str] | None:
    return [c.strip() for c in raw.split(",") if c.strip()] if raw else None


def main(argv: list[str] | None = None) -> int:
    """Run the stack command line; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m harness.stack", description=(
        "Local PostgreSQL + Kafka + Connect/Debezium + schema registry on loopback (docs/stack.md)."))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("up", "start what is not running and wait until healthy"),
                       ("down", "stop (SIGTERM, then SIGKILL after a timeout)"),
                       ("status", "component, ports, pid, healthy"),
                       ("prepare", "install and set up what up would start (packages, jars, data), starting nothing")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--components", help=f"comma list from: {','.join(ORDER)} (default: all)")
    restart = sub.add_parser("restart", help="stop and start one component")
    restart.add_argument("component", choices=ORDER)
    sub.add_parser("env", help="print shell export lines: the stack's addresses and credentials")
    sub.add_parser("jars", help="resolve the JVM jars with Maven (infra/jvm) if needed")
    args = parser.parse_args(argv)

    try:
        stack = Stack.from_env()
        if args.command == "up":
            times = stack.up(_components(args.components))
            started = {k: v for k, v in times.items() if v > 0}
            summary = ", ".join(f"{k} {v:.1f} s" for k, v in started.items()) or "everything was already running"
            print(f"stack up: {summary} (addresses and credentials: python -m harness.stack env)")
        elif args.command == "down":
            stack.down(_components(args.components))
            left = stack.leftovers() if not args.components else []
            for pid, cmd in left:
                print(f"still running from {stack.settings.stack_dir}: pid {pid}: {cmd}", file=sys.stderr)
            print("stack down" + (f" ({len(left)} process(es) left, see above)" if left else ""))
            return 1 if left else 0
        elif args.command == "prepare":
            stack.prepare(_components(args.components))
            print("stack prepared: python -m harness.stack up starts it")
        elif args.command == "status":
            wanted = set(_components(args.components) or ORDER)
            print(f"{'component':<14} {'ports':<40} {'pid':>8}  healthy  ready-in")
            for row in stack.status():
                if row.name in wanted:
                    ports = " ".join(f"{k}={v}" for k, v in row.ports.items())
                    ready = f"{row.started_in:.1f} s" if row.started_in is not None else "-"
                    healthy = "yes" if row.healthy else "no"
                    print(f"{row.name:<14} {ports:<40} {row.pid or '-':>8}  {healthy:<7}  {ready}")
        elif args.command == "restart":
            stack.restart(args.component)
        elif args.command == "env":
            for key, value in stack.settings.shell_env().items():
                print(f"export {key}={shlex.quote(value)}")
        elif args.command == "jars":
            ensure_jars(stack.settings, stack.progress)
            print(f"jars ready in {stack.settings.jars_dir}")
    except StackError as exc:
        print(f"stack: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
