"""The analysts' commands: a table's change data feed (``changes``), its commits (``history``) and SQL
over the live rows, now or as of a version or time (``query``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

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
    print_json,
    print_json_rows,
    print_table,
    write_csv,
)

if TYPE_CHECKING:
    from ingest.read.query import Commit  # Delta and DuckDB: not loaded when the CLI starts


def cuts(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    output: FormatOpt = TableOrJson.table,
    limit: Annotated[int, typer.Option(min=1, help="newest cuts to list")] = 20,
) -> None:
    """List the published cuts: source transactions at which every table of the group is read at one version."""
    # the Delta reads: loaded when the command runs, not when the CLI starts
    from ingest.read.consistent import ConsistencyError
    from ingest.read.consistent import cuts as published

    cfg = load(config, workdir)
    found = published(cfg)[-limit:]
    if output == TableOrJson.json:
        for c in found:
            print_json({"cut": c.cut, "txn": c.txn, "commit_ts": c.commit_ts, "position": c.position,
                        "versions": c.versions, "quarantined": c.quarantined, "published_at": c.published_at})
        return
    if not found:
        raise ConsistencyError("no cut published yet ('ingest status' says what holds it back)")
    out = Table(title=f"cuts of {cfg.source.transactions.topic if cfg.source.transactions else '-'}")
    for col in ("cut", "transaction", "committed", "position", "versions", "quarantined since the previous"):
        out.add_column(col)
    for c in reversed(found):
        out.add_row(f"#{c.cut}", c.txn, f"{c.commit_ts:%Y-%m-%d %H:%M:%S}" if c.commit_ts else "-", c.position or "-",
                    ", ".join(f"{t}@{'-' if v is None else v}" for t, v in sorted(c.versions.items())),
                    ", ".join(f"{t}: {n}" for t, n in sorted(c.quarantined.items()) if n) or "-")
    console.print(out)


def changes(
    name: Annotated[str | None, typer.Argument(metavar="[TABLE]", help="a configured table (or --table)")] = None,
    table: OptionalTableOpt = None,
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    from_version: Annotated[int | None, typer.Option(help="first commit version to read (inclusive)")] = None,
    since: Annotated[str | None, typer.Option(help="read the commits made at or after this time (ISO 8601)")] = None,
    to_version: Annotated[int | None, typer.Option(help="last commit version to read (inclusive)")] = None,
    output: RowsFormatOpt = TableJsonOrCsv.table,
    limit: Annotated[int, typer.Option(min=1, help="rows to print in table format")] = 50,
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
    limit: Annotated[int | None, typer.Option(min=1, help="newest commits only")] = None,
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
    out = Table(title=f"{table}: {_versions(commits)}")
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


def _versions(commits: Sequence[Commit]) -> str:
    """What part of a table's history ``commits`` is: ``--limit`` and log clean-up leave older versions out."""
    made = commits[0].version + 1 if commits else 0  # versions count from 0, one per commit
    return (f"{made} commit{'' if made == 1 else 's'}, newest first" if len(commits) == made
            else f"the newest {len(commits)} of {made} commits")


def query(
    sql: Annotated[str, typer.Argument(help="SQL over the tables (each configured table is a view of live rows)")],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    output: RowsFormatOpt = TableJsonOrCsv.table,
    limit: Annotated[int, typer.Option(min=1, help="rows to print in table format")] = 50,
    as_of: Annotated[list[str] | None, typer.Option(
        "--as-of", help="read as of a VERSION (of the one table the query reads), a TIMESTAMP (every "
        "table), or TABLE@VERSION / TABLE@TIMESTAMP; repeatable")] = None,
    consistent: Annotated[bool, typer.Option(
        "--consistent", help="read the transaction group's tables at the latest cut: each holds the same "
        "source transactions (source.transactions)")] = False,
    consistent_as_of: Annotated[str | None, typer.Option(
        "--consistent-as-of", help="as --consistent, at the latest cut at or before a cut number (#12), a "
        "transaction id, a cut's position or a TIMESTAMP ('ingest cuts' lists them)")] = None,
) -> None:
    """Run SQL (DuckDB) over the tables' live rows: now, as they were, or at one source transaction.

    --as-of reads tables as they were; --consistent reads a transaction group's tables at one source
    transaction, so that a join never sees half of one."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.read.query import AsOf, run_sql

    cfg = load(config, workdir)
    if consistent or consistent_as_of is not None:
        if as_of:
            raise typer.BadParameter("give --as-of or --consistent, not both", param_hint="--consistent")
        from ingest.read.consistent import run_consistent  # only for a consistent read

        result, cut = run_consistent(cfg, sql, consistent_as_of)
        err.print(f"at cut #{cut.cut}: transaction {escape(cut.txn)}"
                  f"{f' committed {cut.commit_ts:%Y-%m-%d %H:%M:%S}' if cut.commit_ts else ''}", highlight=False)
    else:
        result = run_sql(cfg, sql, [AsOf.parse(p) for p in as_of or []])
    if output == TableJsonOrCsv.json:
        print_json_rows(result)
    elif output == TableJsonOrCsv.csv:
        write_csv(result)
    else:
        print_table(result, f"{result.num_rows} rows", limit)
