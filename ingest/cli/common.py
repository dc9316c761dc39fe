"""What every ``ingest`` command module shares: the consoles, the options every command spells the
same way (the configuration, the table, the output format) and the output helpers (console tables,
JSON, CSV, the per-batch progress line)."""

from __future__ import annotations

import errno
import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ingest.config import IngestConfig, load_config
from ingest.errors import ConfigError


class _Console(Console):
    """Rich's console, but a reader that goes away (``| head``) ends the command as it does for any other
    write (:func:`ingest.cli.outcome.output_closed`); Rich's own answer is exit 1, a code ``ingest`` gives
    a lake that differs from its source."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


# Piped output (CI logs, files) gets a width that fits the summary tables instead of 80 columns.
console = _Console(width=None if sys.stdout.isatty() else 160)
err = _Console(stderr=True)


def say(line: str) -> None:
    """One line of a long command's progress, printed as it is (no markup)."""
    console.print(line, markup=False, highlight=False)


DEFAULT_CONFIG = Path("configs/demo.yaml")
#: The environment variable every command (and the Dagster project) reads the configuration's path from.
CONFIG_ENV = "CDC_INGEST_CONFIG"
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", envvar=CONFIG_ENV, show_envvar=True,
                                         help="configuration file (YAML)")]
WorkdirOpt = Annotated[Path | None, typer.Option(help="override the config's workdir")]
#: One table, named with -t/--table by every command (``history`` and ``changes`` also take it as
#: their argument, as they did first).
TableOpt = Annotated[str, typer.Option("--table", "-t", help="a configured table")]
OptionalTableOpt = Annotated[str | None, typer.Option("--table", "-t", help="a configured table")]
TablesOpt = Annotated[list[str] | None, typer.Option("--table", "-t", help="only these tables (repeatable)")]


class TableOrJson(StrEnum):
    """``--format`` of a command that prints a table or JSON."""

    table = "table"
    json = "json"


class TableJsonOrCsv(StrEnum):
    """``--format`` of a command that prints a table, JSON or CSV."""

    table = "table"
    json = "json"
    csv = "csv"


FormatOpt = Annotated[TableOrJson, typer.Option("--format", help="output format")]
RowsFormatOpt = Annotated[TableJsonOrCsv, typer.Option("--format", help="output format")]


def one_table(argument: str | None, option: str | None) -> str:
    """The table a command names, as its argument or with ``--table`` (not both, and not neither)."""
    if argument is not None and option is not None and argument != option:
        raise typer.BadParameter(f"two tables named: {argument!r} and {option!r}", param_hint="--table")
    name = option or argument
    if name is None:
        raise typer.BadParameter("name the table", param_hint="--table")
    return name


def print_json(value: Any) -> None:
    """One JSON document on stdout (times and decimals as text)."""
    print(json.dumps(value, default=str, indent=None))


def print_json_rows(rows: Any) -> None:
    """An Arrow table as JSON lines on stdout, one object per row."""
    for row in rows.to_pylist():
        print(json.dumps(row, default=str))


def load(path: Path, workdir: Path | None = None, *, strict: bool = False) -> IngestConfig:
    """The configuration, with the tables ``discover`` finds now (``run`` looks again itself).

    ``strict``: a source that cannot list its topics raises (a run, which needs them) instead of a
    warning and the listed tables only (the commands that read).
    """
    from ingest.source.discovery import with_discovered  # loads Arrow: not before a command runs

    return with_discovered(load_config(given(path), workdir=workdir), strict=strict)


def given(path: Path) -> Path:
    """``path``, unless it is the default (the demo's configuration in a checkout) and that is not here.

    Raises:
        ConfigError: the default is not here; the message says how to name a configuration.
    """
    if path == DEFAULT_CONFIG and not path.exists():
        raise ConfigError(f"{DEFAULT_CONFIG}: configuration file not found; it is the default, the demo's in a "
                          f"checkout: give -c FILE or set {CONFIG_ENV} (ingest init writes one)")
    return path


def print_table(rows: Any, title: str, limit: int) -> None:
    """The first ``limit`` rows of an Arrow table as a console table (nulls blank)."""
    out = Table(title=title)
    for name in rows.column_names:
        out.add_column(name)
    for row in rows.slice(0, limit).to_pylist():
        out.add_row(*("" if v is None else str(v) for v in row.values()))
    console.print(out)


def write_csv(table: Any) -> None:
    """``table`` as CSV on stdout; lists and structs (CSV has no such type) as JSON text."""
    import pyarrow as pa  # loaded when a command writes CSV: keeps the CLI's start light
    import pyarrow.csv as pacsv

    nested = [i for i, f in enumerate(table.schema) if pa.types.is_nested(f.type)]
    for i in nested:
        text = pa.array([None if v is None else json.dumps(v, default=str) for v in table.column(i).to_pylist()],
                        pa.string())
        table = table.set_column(i, table.schema.field(i).name, text)
    pacsv.write_csv(table, sys.stdout.buffer)


def progress_printer() -> Any:
    """The line ``run`` and the demos print after every table batch."""
    def show(table: str, record: Any, result: Any) -> None:
        if record is None:
            console.print(f"  [dim]{table}: batch of {result.already_applied} already-applied records skipped[/]")
            return
        console.print(
            f"  {table}: batch {record.batch_id} received {record.received:>6}  "
            f"+{record.inserted} ~{record.updated} -{record.deleted}  superseded {record.superseded}  "
            f"stale {record.stale}  quarantined {record.quarantined}  quality {record.quality_status}  "
            f"-> {'no commit' if record.delta_version is None else f'v{record.delta_version}'} ({record.total_ms} ms)"
        )
    return show
