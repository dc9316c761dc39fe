"""``ingest verify --source-db``: every table against ``SELECT``s of its source database, as a report."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ingest.cli.common import console, say
from ingest.config import IngestConfig


def verify_source(config: IngestConfig, dsn: str, *, wait: float, tables: list[str] | None = None) -> bool:
    """Run ``verify --source-db`` and print its report; returns whether everything is equal."""
    # the decoders, the lake and the source database's client: loaded when the command runs
    from ingest.ops.verify_source import verify_source_db
    from ingest.verify.source_db import reached, source_database

    source = source_database(dsn)
    where = source.describe(dsn)
    console.rule(f"verify against {where}")
    with reached(source, where):
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
