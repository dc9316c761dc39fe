"""``ingest maintain``: compaction, vacuum and the tombstone purge without Dagster (:mod:`ingest.ops.maintain`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ingest.cli.common import (
    DEFAULT_CONFIG,
    ConfigOpt,
    FormatOpt,
    TableOrJson,
    WorkdirOpt,
    console,
    err,
    given,
    print_json,
)
from ingest.cli.outcome import Exit
from ingest.config import load_config
from ingest.errors import SourceUnavailableError

if TYPE_CHECKING:
    from ingest.ops.maintain_tables import TableOutcome

class Layout(StrEnum):
    compact = "compact"
    zorder = "zorder"
    none = "none"


def maintain(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    table: Annotated[list[str] | None, typer.Option(
        "--table", "-t", help="only these tables, repeatable (default: every configured and discovered table, plus "
        "the audit and quarantine tables)")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="say what would be compacted, vacuumed and purged; change nothing")] = False,
    layout: Annotated[Layout, typer.Option(
        help="compact: bin-pack small files; zorder: rewrite each table clustered by its primary key (the whole "
        "table); none: leave the files alone")] = Layout.compact,
    target_file_size_mb: Annotated[int | None, typer.Option(
        min=1, help="size of the files compaction writes (default: target.target_file_size_mb)")] = None,
    vacuum: Annotated[bool, typer.Option(help="delete files no version within the retention refers to")] = True,
    vacuum_retention_hours: Annotated[int, typer.Option(
        min=0, help="vacuum deletes unreferenced files older than this (it bounds time travel)")] = 168,
    checkpoint: Annotated[bool, typer.Option(help="write a Delta log checkpoint (delta-rs tables)")] = True,
    cleanup_log: Annotated[bool, typer.Option(
        help="remove expired log files, unless the engine's newest commit would expire with them")] = True,
    wait: Annotated[float, typer.Option(
        min=0, help="seconds to wait for a table's writer lock while a run holds it, then skip the table")] = 60.0,
    output: FormatOpt = TableOrJson.table,
) -> None:
    """Compact, vacuum and checkpoint the tables; forget deletes older than tombstone_retention.

    A table is maintained under its writer lock, as a run writes it. While a run holds
    the lock (a continuous run holds it until it stops), the table is skipped after --wait.

    Exit codes (those of every command): 0 done; 2 an error before any table (configuration,
    unknown table); 3 the source could not list its topics, so discovered tables were left out;
    4 a table failed or was skipped because a run held it (its row says which and why).
    """
    # Delta, and Spark for tables with deletion vectors: loaded when the command runs
    from ingest.ops.maintain import MaintenanceOptions
    from ingest.ops.maintain_tables import maintain_tables, tables_to_maintain

    cfg = load_config(given(config), workdir=workdir)
    left_out = None
    try:
        from ingest.source.discovery import with_discovered  # loads Arrow: not before a command runs

        cfg = with_discovered(cfg, strict=True)
    except SourceUnavailableError as exc:
        left_out = str(exc)
    options = MaintenanceOptions(layout=layout.value,
                                 target_file_size_mb=target_file_size_mb or cfg.target.target_file_size_mb,
                                 vacuum_retention_hours=vacuum_retention_hours if vacuum else None,
                                 checkpoint=checkpoint, cleanup_log=cleanup_log)
    total = len(tables_to_maintain(cfg, table))
    with _progress("planning" if dry_run else "maintaining", total) as on_table:
        if output is TableOrJson.json:
            with _stdout_on_stderr():  # the JVM's own messages (Delta prints what VACUUM deleted) keep off the JSON
                outcomes = maintain_tables(cfg, options, tables=table, dry_run=dry_run, wait=wait, on_table=on_table)
        else:
            outcomes = maintain_tables(cfg, options, tables=table, dry_run=dry_run, wait=wait, on_table=on_table)
    if output is TableOrJson.json:
        print_json({"dry_run": dry_run, "discovered_tables_left_out": left_out,
                    "tables": [o.as_dict() for o in outcomes]})
    else:
        console.print(_dry_run_table(outcomes) if dry_run else _done_table(outcomes))
    if left_out is not None:
        err.print(f"[yellow]discovered tables left out:[/] {escape(left_out)}")
    if {o.status for o in outcomes} & {"failed", "skipped"}:
        raise typer.Exit(Exit.TABLE_FAILED)
    if left_out is not None:
        raise typer.Exit(Exit.UNAVAILABLE)


@contextmanager
def _progress(doing: str, total: int) -> Iterator[Callable[[TableOutcome], None]]:
    """A bar on stderr, in a terminal, that counts the tables as they end (a table may take minutes)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(f"{doing} {total} tables", total=total)
        yield lambda outcome: bar.update(task, advance=1, description=f"{doing}: {outcome.table} {outcome.status}")


@contextmanager
def _stdout_on_stderr() -> Iterator[None]:
    """File descriptor 1 goes to stderr meanwhile, in this process and in those it starts (Spark's JVM)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB"


def _why(outcome: TableOutcome) -> str:
    if outcome.status in ("failed", "skipped"):
        return f"[red]{escape(outcome.reason or '')}[/]" if outcome.status == "failed" else escape(outcome.reason or "")
    notes = (outcome.report.notes if outcome.report else outcome.plan.notes if outcome.plan else [])
    return escape("; ".join(notes))


def _done_table(outcomes: list[TableOutcome]) -> Table:
    out = Table(title=f"maintenance of {len(outcomes)} tables ({sum(o.seconds for o in outcomes):.1f} s)")
    for col in ("table", "result", "version", "files compacted", "files vacuumed", "tombstones purged",
                "log clean-up", "seconds", "notes"):
        out.add_column(col, justify="right" if col in ("files vacuumed", "tombstones purged", "seconds") else "left")
    for o in outcomes:
        r = o.report
        if r is None or not r.exists:
            result = "no table yet" if o.status == "absent" else o.status
            out.add_row(o.table, result, "", "", "", "", "", f"{o.seconds:.1f}", _why(o))
            continue
        out.add_row(o.table, o.status, f"{r.version_before} -> {r.version_after}",
                    f"{r.files_removed} -> {r.files_added}", str(r.vacuumed_files), str(r.tombstones_purged),
                    escape(r.log_cleanup), f"{o.seconds:.1f}", _why(o))
    return out


def _dry_run_table(outcomes: list[TableOutcome]) -> Table:
    out = Table(title=f"dry run: what maintenance would do to {len(outcomes)} tables (nothing was changed)")
    for col in ("table", "result", "version", "maintained by", "files to compact", "size", "files to vacuum",
                "tombstones to purge", "notes"):
        out.add_column(col, justify="right" if col in ("files to compact", "size", "files to vacuum",
                                                       "tombstones to purge") else "left")
    for o in outcomes:
        p = o.plan
        if p is None or not p.exists:
            out.add_row(o.table, "no table yet" if o.status == "absent" else o.status, "", "", "", "", "", "", _why(o))
            continue
        out.add_row(o.table, "would maintain", str(p.version), p.maintained_by, str(len(p.compact)),
                    _mib(p.compact_bytes), str(len(p.vacuum)), str(p.tombstones_to_purge), _why(o))
    return out
