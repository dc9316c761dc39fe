"""The ``ingest`` command line: the operating commands (``run``, ``status``, ``verify``, ``produce``);
the analysts' read commands are in :mod:`ingest.cli.read`, quality and quarantine in
:mod:`ingest.cli.quality`. Commands of installed extensions (the demo and the proofs of the
development harness) are added by :mod:`ingest.cli.plugins`."""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ingest.cli import plugins
from ingest.cli.common import DEFAULT_CONFIG, ConfigOpt, WorkdirOpt, console, err, load, progress_printer
from ingest.cli.maintain import maintain
from ingest.cli.quality import quality_app, quarantine_app
from ingest.cli.read import changes, history, query
from ingest.cli.verify import verify_source
from ingest.errors import IngestError
from ingest.secrets import install_log_redaction, redact
from ingest.source.topiclog import ProducerRecord, TopicLog, partition_for_key

app = typer.Typer(help="CDC lakehouse ingestion: Debezium topics -> Delta Lake tables.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(quality_app, name="quality")
app.add_typer(quarantine_app, name="quarantine")


@app.command()
def run(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    table: Annotated[list[str] | None, typer.Option("--table", "-t", help="only these tables")] = None,
    continuous: Annotated[bool, typer.Option(help="keep running and poll for new changes")] = False,
    reset_checkpoints: Annotated[bool, typer.Option(help="delete Spark checkpoints; resume from Delta")] = False,
    from_beginning: Annotated[bool, typer.Option(help="re-read topics from offset 0 (replay)")] = False,
) -> None:
    """Ingest the configured tables until caught up (or continuously)."""
    # the streaming runner brings Spark and the decoders: loaded when a run starts
    from ingest.stream.runner import Runner

    cfg = load(config, workdir)
    report = Runner(cfg).run(tables=table, mode="continuous" if continuous else "available_now",
                             reset_checkpoints=reset_checkpoints, from_beginning=from_beginning,
                             progress=progress_printer())
    out = Table(title=f"run {report.run_id} ({report.seconds:.1f} s)")
    for col in ("table", "batches", "received", "inserted", "updated", "deleted", "quarantined", "replayed", "error"):
        out.add_column(col)
    for name, t in report.tables.items():
        out.add_row(name, str(len(t.batches)), str(t.total("received")), str(t.total("inserted")),
                    str(t.total("updated")), str(t.total("deleted")), str(t.total("quarantined")),
                    str(t.already_applied), t.error or (f"recovered from: {t.recovered[-1]}" if t.recovered else ""))
    console.print(out)
    if report.failed:
        raise typer.Exit(1)


@app.command()
def status(config: ConfigOpt = DEFAULT_CONFIG, workdir: WorkdirOpt = None) -> None:
    """Per table: applied offsets, lag, Delta version, last batch."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.ops.status import table_status

    cfg = load(config, workdir)
    out = Table(title="Table status")
    for col in ("table", "topic", "applied offsets", "lag", "Delta version", "live rows", "last batch"):
        out.add_column(col)
    statuses = table_status(cfg)
    for s in statuses:
        applied = ", ".join(f"p{p}:{'-' if o is None else o}/{s.end[p] - 1}" for p, o in sorted(s.applied.items()))
        last = "-"
        if s.last_batch and s.last_batch.get("finished_at"):
            b = s.last_batch
            last = f"#{b['batch_id']} {b['status']} at {b['finished_at']:%Y-%m-%d %H:%M:%S}"
        lag = str(s.lag) if s.lag is not None else "[red]unknown[/]"
        out.add_row(s.table, s.topic, applied or "-", lag, str(s.delta_version), str(s.rows), last)
    console.print(out)
    unreachable = {s.source_error for s in statuses if s.source_error}
    for problem in sorted(unreachable):
        err.print(f"[red]source unavailable:[/] {escape(problem)}")
    if unreachable:
        raise typer.Exit(3)


@app.command()
def verify(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    source_db: Annotated[str | None, typer.Option(
        "--source-db", help="libpq URL of the source PostgreSQL database: wait for Debezium and the tables, then "
        "compare each table with a SELECT of its source table (default: the simulator's truth)")] = None,
    wait: Annotated[float, typer.Option(
        help="--source-db: seconds to wait for Debezium's slots, and again for the tables to catch up")] = 120.0,
    table: Annotated[list[str] | None, typer.Option("--table", "-t", help="--source-db: only these tables")] = None,
) -> None:
    """Compare every table with its source (the simulator's truth, or --source-db); exit 1 on any mismatch."""
    if source_db is not None:

        if not verify_source(load(config, workdir), source_db, wait=wait, tables=table):
            raise typer.Exit(1)
        return
    truth = plugins.truth_verifier()
    if truth is None:
        raise typer.BadParameter("name the source database to compare with; the simulated source's truth "
                                 "comes with the demo harness (harness/), which is not installed",
                                 param_hint="--source-db")
    if not truth(load(config, workdir)):
        raise typer.Exit(1)


app.command()(maintain)
# The analysts' commands, listed after the operators' (the order of `ingest --help`).
app.command()(changes)
app.command()(history)
app.command()(query)


@app.command()
def produce(
    topic: Annotated[str, typer.Argument(help="topic to append to (created if missing)")],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="JSON lines file; default: stdin")] = None,
    partitions: Annotated[int, typer.Option(help="partitions when the topic is created")] = 3,
) -> None:
    """Append records to the embedded topic log from JSON lines.

    One record per line: {"partition": 0 (optional; default by key hash), "key": base64|null,
    "value": base64|null, "timestamp": epoch millis (optional), "headers": [{"key": "k", "value": base64|null}]}.
    """

    cfg = load(config, workdir)
    log = TopicLog(cfg.log_dir)
    if not log.exists(topic):
        log.create_topic(topic, partitions)
    count = log.partitions(topic)
    stream = file.open() if file else sys.stdin
    records = []
    for lineno, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            key = base64.b64decode(obj["key"], validate=True) if obj.get("key") is not None else None
            value = base64.b64decode(obj["value"], validate=True) if obj.get("value") is not None else None
            partition = obj.get("partition")
            if partition is None:
                partition = partition_for_key(key, count) if key is not None else lineno % count
            headers = tuple((h["key"], base64.b64decode(h["value"]) if h.get("value") is not None else None)
                            for h in obj.get("headers", []))
            records.append(ProducerRecord(int(partition), key, value, int(obj.get("timestamp", time.time() * 1000)),
                                          headers))
        except (ValueError, KeyError, TypeError) as exc:
            raise IngestError(f"line {lineno}: not a valid record ({type(exc).__name__}: {exc})") from exc
    written = log.append(topic, records)
    for partition, (first, nxt) in sorted(written.items()):
        console.print(f"{topic}[{partition}]: offsets {first}..{nxt - 1}")




plugins.register_commands(app)


def main() -> None:

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no credential reaches a log line, whoever logs it
    try:
        app()
    except IngestError as exc:
        err.print(f"[red]error:[/] {escape(redact(exc))}", highlight=False)
        sys.exit(2)


