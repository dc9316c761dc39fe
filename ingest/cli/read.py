"""The analysts' commands: a table's change data feed (``changes``), its commits (``history``) and SQL
over the live rows, now or as of a version or time (``query``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ingest.cli.common import (
    DEFAULT_CONFIG,
    ConfigOpt,
    FormatOpt,
    OptionalTableOpt,
    RowsFormatOpt,
    TableJsonOrCsv,
    TableOrJson,
    WorkdirOpt,
    console,
    err,
    load,
    one_table,
    print_json_rows,
    print_table,
    write_csv,
)


def changes(
    name: Annotated[str | None, typer.Argument(metavar="[TABLE]", help="a configured table (or --table)")] = None,
    table: OptionalTableOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    from_version: Annotated[int | None, typer.Option(help="first commit version to read (inclusive)")] = None,
    since: Annotated[str | None, typer.Option(help="read the commits made at or after this time (ISO 8601)")] = None,
    to_version: Annotated[int | None, typer.Option(help="last commit version to read (inclusive)")] = None,
    output: RowsFormatOpt = TableJsonOrCsv.table,
    limit: Annotated[int, typer.Option(help="rows to print in table format")] = 50,
) -> None:
    """Print or export a table's change data feed: inserts, update pre/post images and deletes, by version."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.read.changes import ChangeRange, as_json_lines
    from ingest.read.changes import changes as read_changes

    table = one_table(name, table)
    if (from_version is None) == (since is None):
        raise typer.BadParameter("give one of --from-version N or --since TIMESTAMP", param_hint="--from-version")
    try:
        moment = datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None
    except ValueError:
        raise typer.BadParameter(f"{since}: expected an ISO 8601 time, e.g. 2026-11-24T06:00:00Z",
                                 param_hint="--since") from None
    which = ChangeRange(from_version, moment.replace(tzinfo=moment.tzinfo or UTC) if moment else None, to_version)
    rows = read_changes(load(config, workdir), table, which, say=lambda m: err.print(escape(m)))
    if output == TableJsonOrCsv.json:
        print(as_json_lines(rows))
    elif output == TableJsonOrCsv.csv:
        write_csv(rows)
    else:
        shown = [c for c in rows.column_names if not c.startswith("_cdc_") or c in ("_cdc_position", "_cdc_deleted")]
        print_table(rows.select(shown), f"{table}: {rows.num_rows} changes", limit)


def history(
    name: Annotated[str | None, typer.Argument(
        metavar="[TABLE]", help="a configured table, the audit or the quarantine (or --table)")] = None,
    table: OptionalTableOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    limit: Annotated[int | None, typer.Option(help="newest commits only")] = None,
    output: FormatOpt = TableOrJson.table,
) -> None:
    """List a table's commits: version, time, batch, offsets, counts and quality status."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.read.query import history as table_history
    from ingest.read.query import history_json, offsets_text

    table = one_table(name, table)
    commits = table_history(load(config, workdir), table, limit=limit)
    if output == TableOrJson.json:
        print(history_json(commits))
        return
    out = Table(title=f"{table}: {len(commits)} commits, newest first")
    for name in ("version", "time (UTC)", "operation", "kind", "batch", "engine", "offsets", "received",
                 "+ins", "~upd", "-del", "quarantined", "quality"):
        out.add_column(name, justify="right" if name in ("version", "batch", "received", "+ins", "~upd", "-del",
                                                         "quarantined") else "left")
    for c in commits:
        out.add_row(*("" if v is None else str(v) for v in (
            c.version, f"{c.time:%Y-%m-%d %H:%M:%S}", c.operation, c.kind, c.batch_id, c.engine,
            offsets_text(c.offsets), c.received, c.inserted, c.updated, c.deleted, c.quarantined,
            c.quality_status)))
    console.print(out)


def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables (each configured table is a view of live rows)")],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    output: RowsFormatOpt = TableJsonOrCsv.table,
    limit: Annotated[int, typer.Option(help="rows to print in table format")] = 50,
    as_of: Annotated[list[str] | None, typer.Option(
        "--as-of", help="read as of a VERSION (of the one table the query reads), a TIMESTAMP (every "
        "table), or TABLE@VERSION / TABLE@TIMESTAMP; repeatable")] = None,
) -> None:
    """Run SQL (DuckDB) over the live rows of the Delta tables, now or as they were (--as-of)."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.read.query import AsOf, run_sql

    result = run_sql(load(config, workdir), sql, [AsOf.parse(p) for p in as_of or []])
    if output == TableJsonOrCsv.json:
        print_json_rows(result)
    elif output == TableJsonOrCsv.csv:
        write_csv(result)
    else:
        print_table(result, f"{result.num_rows} rows", limit)
