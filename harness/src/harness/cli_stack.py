"""``ingest torture --stack``: the output of the stack torture (:mod:`harness.stack_proofs.torture`);
``ingest torture --lake s3``: the stack's MinIO as the lake."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer
from rich.markup import escape
from rich.table import Table

from ingest.cli.common import console, say

if TYPE_CHECKING:
    from harness.torture.consistency import ConsistencyReport


def torture_stack(*, seed: int, faults: int, rate: float, value_format: Literal["avro", "json"],
                  workdir: Path | None, schema: str, scale: float, pause: tuple[float, float]) -> bool:
    """Run the stack torture, print one line per fault and a summary table; returns whether it held."""
    from harness.stack import StackError
    from harness.stack_proofs.torture import StackTorture, StackTortureSpec
    from ingest.errors import EnvironmentProblem

    where = workdir or Path(tempfile.mkdtemp(prefix="cdc-torture-stack-"))
    spec = StackTortureSpec(workdir=where, seed=seed, faults=faults, rate=rate, value_format=value_format,
                            schema=schema, scale=scale, pause=pause)
    console.rule(f"torture on the stack: seed {seed}, {faults} faults, {rate:.0f} changes/s, {value_format}, "
                 f"schema {schema}")
    try:
        result = StackTorture(spec, say=say).run()
    except StackError as exc:
        raise EnvironmentProblem(f"the local stack could not start: {exc}") from None
    summary(result, where)
    return result.ok


def stack_lake(prefix: str, *, away: float = 5.0) -> tuple[str, dict[str, object], Callable[[], float]]:
    """A lake under ``prefix`` in the stack's MinIO (started if need be): ``target.root``, ``target.storage``
    and a function that restarts the server (stopped, ``away`` seconds gone, started; returns the seconds
    from the stop until it answered again). Puts the server's keys into this process's environment, for the
    runs it starts and for the checks it makes itself."""
    import os

    from harness.stack import Stack, StackError
    from ingest.errors import EnvironmentProblem

    stack = Stack.from_env(progress=lambda line: say(f"[stack] {line}"))
    try:
        stack.up(["s3"])
    except StackError as exc:
        raise EnvironmentProblem(f"the stack's S3 server (MinIO) could not start: {exc}") from None
    s = stack.settings
    os.environ.update(s.s3_env())

    return (f"s3://{s.s3_bucket}/{prefix}", {"endpoint_url": s.s3_endpoint(), "path_style": True},
            lambda: stack.restart("s3", away=away))


def summary(result: object, where: Path) -> None:
    """The summary table of a :class:`~harness.stack_proofs.torture.StackTortureResult`."""
    from harness.stack_proofs.torture import StackTortureResult

    assert isinstance(result, StackTortureResult)
    c, w, load = result.check, result.watch, result.load
    out = Table(title=f"torture on the stack in {where}")
    out.add_column("measure")
    out.add_column("value", justify="right")
    kinds = result.by_kind()
    names = {"ingest-kill": "ingest kill", "kafka": "broker", "connect": "Connect", "registry": "registry",
             "pg": "PostgreSQL", "mariadb": "MariaDB"}
    out.add_row(f"faults ({' / '.join(names[k] for k in kinds)})",
                f"{sum(kinds.values())} ({' / '.join(str(n) for n in kinds.values())})")
    kills = " / ".join(f"{k} {n}" for k, n in sorted(result.kills.items()))
    out.add_row("ingest SIGKILLs (from outside / at named points)", kills or "0")
    out.add_row("ingest processes started (incl. restarts) / ended on their own", f"{result.ingest_starts} / "
                f"{len(w.unexpected_exits)}")
    out.add_row("table batches committed by the continuous runs / retried / tables stopped",
                f"{w.batches} / {w.retries} / {len(w.table_stops)}")
    out.add_row("longest time without a committed batch (process up > 90 s)",
                f"{w.longest_stall:.0f} s (after {w.stall_after or '-'})")
    if result.workload is not None:
        out.add_row("initial SQL workload: transactions / row changes", f"{result.workload.transactions} / "
                    f"{result.workload.changes}")
    if result.mariadb_workload is not None:
        out.add_row("initial MariaDB workload: transactions / statements",
                    f"{result.mariadb_workload.transactions} / {result.mariadb_workload.statements}")
    for label, report in (("load", load), ("MariaDB load", result.mariadb_load)):
        if report is not None:
            out.add_row(f"{label}: row changes committed (rate) / failed / uncertain tx / reconnects",
                        f"{report.committed_changes:,} ({report.rate:.0f}/s) / {report.failed_transactions} / "
                        f"{report.uncertain_transactions} / {report.reconnects}")
    out.add_row("final ingest run (availableNow) exit code", str(result.final_exit))
    if c is not None:
        out.add_row("rows: source databases / Delta", f"{c.source_rows:,} / {c.delta_rows:,}")
        out.add_row("records in the topics / received across the audit", f"{c.records:,} / {c.received:,}")
        out.add_row("engine commits (all tables) / quarantined", f"{c.commits} / {c.quarantined}")
        out.add_row("changes counted stale (redelivered or replayed, older than the row)", f"{c.stale:,}")
        add_consistency_rows(out, c)
    out.add_row("wall time", f"{result.seconds / 60:.1f} min")
    console.print(out)
    for text in w.unexpected_exits:
        console.print(f"[yellow]ingest process ended on its own: {escape(text)}[/]", highlight=False)
    for text in w.table_stops:
        console.print(f"[yellow]table stopped in a continuous run: {escape(text)}[/]", highlight=False)
    for problem in ([result.failure] if result.failure else []) + (c.problems if c else []):
        console.print(f"[red]{escape(problem)}[/]", highlight=False)
    console.print("[green]consistent: every table equals its source database[/]" if result.ok else "[red]DIVERGED[/]")


def exit_unless(ok: bool) -> None:
    """Exit 1 unless ``ok``."""
    if not ok:
        raise typer.Exit(1)


def add_consistency_rows(out: Table, report: ConsistencyReport) -> None:
    """The verdict rows every torture table ends with."""
    out.add_row("divergent rows", str(report.divergent_rows))
    out.add_row("duplicate keys", str(report.duplicate_keys))
    out.add_row("audit rows / unbalanced", f"{report.audit_rows} / {report.unbalanced_audit_rows}")
