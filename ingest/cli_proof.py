"""Commands against the real stack: ``verify --source-db``'s output, ``demo-stack`` and ``pg-load``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ingest.cli_common import console, say
from ingest.config import IngestConfig, load_config


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a libpq connection string (never its password); registers the password
    with :mod:`ingest.secrets` so no error message can echo it."""
    from psycopg.conninfo import conninfo_to_dict

    from ingest import secrets

    try:
        info = conninfo_to_dict(dsn)
    except Exception:  # a malformed DSN: psycopg's own error comes later, redacted
        return "the source database"
    secrets.register(str(info["password"]) if info.get("password") else None)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"


@contextmanager
def source_db_errors(where: str) -> Iterator[None]:
    """Turn a connection failure into one redacted line (exit code 2) instead of a traceback."""
    import psycopg

    from ingest import secrets
    from ingest.errors import SourceUnavailableError

    try:
        yield
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SourceUnavailableError(secrets.redact(f"source database {where}: {first}")) from None


def verify_source(config: IngestConfig, dsn: str, *, wait: float, tables: list[str] | None = None) -> bool:
    """Run ``verify --source-db`` and print its report; returns whether everything is equal."""
    from ingest.proof.source_db import verify_source_db

    where = describe_dsn(dsn)
    console.rule(f"verify against {where}")
    with source_db_errors(where):
        result = verify_source_db(config, dsn, wait=wait, say=say, tables=tables)
    out = Table(title=f"Delta tables against SELECTs of {where}")
    for col in ("table", "source table", "source rows", "Delta rows", "missing", "unexpected", "different", "result"):
        out.add_column(col, justify="right" if col not in ("table", "source table", "result") else "left")
    for check in result.tables:
        v = check.verification
        if check.error or v is None:
            out.add_row(check.table, check.source_table, "", "", "", "", "", f"[red]{escape(check.error or '?')}[/]")
            continue
        verdict = "[green]equal[/]" if v.ok else (f"[red]{v.missing} missing, {v.unexpected} unexpected, "
                                                  f"{v.different} different[/]")
        out.add_row(check.table, check.source_table, str(v.expected_rows), str(v.actual_rows), str(v.missing),
                    str(v.unexpected), str(v.different), verdict)
    console.print(out)
    for check in result.tables:
        for example in check.verification.examples if check.verification else []:
            console.print(f"  {escape(example)}", highlight=False)
        for note in check.notes:
            console.print(f"  [yellow]{check.table}: {escape(note)}[/]", highlight=False)
    if not result.capture.ok:
        console.print(f"[red]not captured:[/] {escape(result.capture.problem or '')}")
    if not result.catch_up.ok:
        console.print(f"[red]{escape(result.catch_up.problem or 'not caught up')}[/]")
    console.print("[green]every table equals its source table[/]" if result.ok else "[red]DIFFERENT[/]")
    return result.ok


def demo_stack(
    avro: Annotated[Path, typer.Option(help="Avro configuration")] = Path("configs/stack.yaml"),
    json_config: Annotated[Path, typer.Option("--json", help="JSON configuration")] = Path("configs/stack-json.yaml"),
    seed: Annotated[int, typer.Option(help="workload seed")] = 42,
    scale: Annotated[float, typer.Option(help="workload size (1.0: ~800 transactions, ~3,000 row changes)")] = 1.0,
    wait: Annotated[float, typer.Option(help="seconds to wait for Debezium and for each verification")] = 180.0,
) -> None:
    """Real stack end to end: reset the source, run the SQL workload, ingest Avro and JSON, verify both."""
    from ingest.cli_common import progress_printer
    from ingest.proof.demo_stack import run_demo_stack
    from ingest.proof.pg_workload import WorkloadSpec

    started = time.perf_counter()
    configs = [("avro", load_config(avro)), ("json", load_config(json_config))]
    console.rule("demo-stack: PostgreSQL -> Debezium -> Kafka -> Spark -> Delta, verified against the source")
    from ingest.errors import EnvironmentProblem
    from ingest.stack import StackError

    try:
        with source_db_errors("the stack's PostgreSQL"):
            result = run_demo_stack(configs, spec=WorkloadSpec(seed=seed, scale=scale), wait=wait, say=say,
                                    progress=progress_printer())
    except StackError as exc:
        raise EnvironmentProblem(f"the local stack could not start: {exc}") from None
    _summary(result)
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    if not result.ok:
        console.print("[red]demo-stack FAILED[/]")
        raise typer.Exit(1)
    console.print("[green]every table equals the source, in Avro and in JSON[/]")


def _summary(result: Any) -> None:
    workload = result.workload
    out = Table(title="Tables after demo-stack")
    out.add_column("table")
    for col in ("source rows", "inserted", "updated", "deleted"):
        out.add_column(col, justify="right")
    for run in result.runs:
        out.add_column(f"{run.label} records", justify="right")
        out.add_column(f"{run.label} Delta rows", justify="right")
        out.add_column(f"{run.label} verify")
    names = list(workload.tables) if workload else []
    for name in names:
        src = workload.tables[name]
        row = [name, str(src.rows), str(src.inserted), str(src.updated), str(src.deleted)]
        for run in result.runs:
            table_run = run.report.tables.get(name) if run.report else None
            check = next((c for c in (run.verification.tables if run.verification else []) if c.table == name), None)
            v = check.verification if check else None
            row.append(str(table_run.total("received")) if table_run else "-")
            row.append(str(v.actual_rows) if v else "-")
            if table_run and table_run.error:
                row.append(f"[red]failed: {escape(table_run.error[:60])}[/]")
            elif check is None or v is None:
                row.append(f"[red]{escape(check.error if check and check.error else 'not verified')}[/]")
            else:
                row.append("[green]equal[/]" if v.ok else f"[red]-{v.missing} +{v.unexpected} ~{v.different}[/]")
        out.add_row(*row)
    console.print(out)
    for run in result.runs:
        for check in run.verification.tables if run.verification else []:
            for example in check.verification.examples if check.verification else []:
                console.print(f"  {run.label}: {escape(example)}", highlight=False)
            for note in check.notes:
                console.print(f"  [yellow]{run.label} {check.table}: {escape(note)}[/]", highlight=False)
        if run.verification and not run.verification.catch_up.ok:
            console.print(f"  [red]{run.label}: {escape(run.verification.catch_up.problem or 'not caught up')}[/]")
    if result.capture is not None and not result.capture.ok:
        console.print(f"[red]Debezium did not capture the workload: {escape(result.capture.problem or '')}[/]")
    timings = Table(title="Wall time")
    timings.add_column("phase")
    timings.add_column("seconds", justify="right")
    for phase, seconds in result.timings.items():
        timings.add_row(phase, f"{seconds:.1f}")
    console.print(timings)
    if workload:
        console.print(f"workload: {workload.transactions} transactions, {workload.statements} statements, "
                      f"{workload.changes} row changes (pg_stat_user_tables, cascades included; the TRUNCATE "
                      f"counts once), DDL: {len(workload.ddl)} statements", highlight=False)


def pg_load(
    rate: Annotated[float, typer.Option(help="target row changes per second")] = 200.0,
    duration: Annotated[float, typer.Option(help="seconds to run")] = 60.0,
    seed: Annotated[int, typer.Option(help="seeds every value")] = 1,
    source_db: Annotated[str | None, typer.Option("--source-db", help="libpq URL (default: the local stack's)")]
    = None,
    schema: Annotated[str, typer.Option(help="schema with the shop tables (after demo-stack or its workload)")]
    = "shop",
) -> None:
    """Write steady load into the shop schema (reconnects across PostgreSQL restarts) and report it."""
    from ingest.proof.load import LoadGenerator

    if source_db is None:
        from ingest.stack import StackSettings

        source_db = StackSettings.from_env().pg_dsn()
    console.rule(f"load on {describe_dsn(source_db)}: {rate:.0f} changes/s for {duration:.0f} s")
    report = LoadGenerator(source_db, rate=rate, duration=duration, seed=seed, schema=schema, say=say).run()
    console.print(f"committed {report.committed_changes} changes in {report.committed_transactions} transactions "
                  f"({report.rate:.0f}/s over {report.seconds:.1f} s); failed {report.failed_transactions}, "
                  f"uncertain {report.uncertain_transactions}, reconnects {report.reconnects}", highlight=False)
    if report.last_error:
        console.print(f"last error: {escape(report.last_error)}", highlight=False)
