"""The ``ingest`` command line: the operating commands (``run``, ``status``, ``verify``, ``produce``);
the analysts' read commands are in :mod:`ingest.cli.read`, quality and quarantine in
:mod:`ingest.cli.quality`. Commands of installed extensions (the demo and the proofs of the
development harness) are added by :mod:`ingest.cli.plugins`."""

from __future__ import annotations

import base64
import json
import logging
import signal
import sys
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from ingest import logs
from ingest.cli import plugins
from ingest.cli.common import (
    DEFAULT_CONFIG,
    ConfigOpt,
    FormatOpt,
    TableOrJson,
    TablesOpt,
    WorkdirOpt,
    console,
    err,
    load,
    print_json,
    progress_printer,
)
from ingest.cli.maintain import maintain
from ingest.cli.outcome import (
    EXIT_CODES_HELP,
    Exit,
    classify,
    discard_output,
    output_closed,
    stop_as_interrupted,
)
from ingest.cli.quality import quality_app, quarantine_app
from ingest.cli.read import changes, cuts, history, query
from ingest.cli.setup import check, init, jars
from ingest.cli.verify import verify_source
from ingest.errors import ConfigError

if TYPE_CHECKING:
    from ingest.stream.report import TableRun  # pyarrow: not loaded when the CLI starts

#: The ``ingest --help`` panels: operating the pipeline, reading its tables, its quality stage.
OPERATE, READ, QUALITY = "Operate the pipeline", "Read the tables", "Quality and quarantine"
log = logging.getLogger(__name__)


class _Commands(TyperGroup):
    """The command group: a command that fails ends in one line and its exit code (:mod:`ingest.cli.outcome`),
    however it is invoked (the console script, ``python -m ingest.cli``, a test's runner)."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context, which typer does not export
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader that went away shows here, not as Python leaves
            return result
        except (typer.Exit, typer.Abort, typer.TyperException):  # an exit, or a usage error Typer reports itself
            raise
        except Exception as exc:
            if output_closed(exc):
                discard_output()
                raise typer.Exit(Exit.OUTPUT_CLOSED) from None
            if _debug:
                raise
            code, line = classify(exc)
            err.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
            raise typer.Exit(code) from None


app = typer.Typer(help=f"CDC lakehouse ingestion: Debezium topics -> Delta Lake tables.\n\n{EXIT_CODES_HELP}",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=_Commands)
app.add_typer(quality_app, name="quality", rich_help_panel=QUALITY)
app.add_typer(quarantine_app, name="quarantine", rich_help_panel=QUALITY)
#: ``--debug``: show the traceback of an error instead of its one line
_debug = False


#: The distribution ``ingest`` comes from (pyproject.toml).
DISTRIBUTION = "cdc-lakehouse-ingest"


def _version(shown: bool) -> None:
    if shown:
        try:
            found = package_version(DISTRIBUTION)
        except PackageNotFoundError:  # run from a checkout that was never installed
            found = "unknown (not installed)"
        console.print(f"{DISTRIBUTION} {found}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def options(
    debug: Annotated[bool, typer.Option("--debug", help="show the traceback of an error, not only its line")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
    log_format: Annotated[logs.LogFormat, typer.Option(
        "--log-format", envvar=logs.FORMAT_VARIABLE,
        help="log lines on stderr as text, or one JSON object per line (time, level, logger, message; "
             "event, table, batch and figures for the engine's events)")] = "text",
    log_level: Annotated[logs.LogLevel, typer.Option(
        "--log-level", envvar=logs.LEVEL_VARIABLE,
        help="the least severe log lines shown (info: one line per table batch and per run)")] = "warning",
) -> None:
    """Options of every command."""
    global _debug
    _debug = debug
    if log_format == "json":
        logs.json_stderr()
    logs.configure(log_format, log_level)
    logs.export(log_format, log_level)


@app.command(rich_help_panel=OPERATE)
def run(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    table: TablesOpt = None,
    continuous: Annotated[bool, typer.Option(help="keep running and poll for new changes")] = False,
    reset_checkpoints: Annotated[bool, typer.Option(help="delete Spark checkpoints; resume from Delta")] = False,
    from_beginning: Annotated[bool, typer.Option(help="re-read topics from offset 0 (replay)")] = False,
    full_start: Annotated[bool, typer.Option(
        hidden=True, help="start Spark even when every table is caught up (benchmarks/bench_start.py)")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        envvar="CDC_INGEST_METRICS_PORT", min=0, max=65535,
        help="serve Prometheus metrics on this port (/metrics) while the run lasts")] = None,
    metrics_address: Annotated[str, typer.Option(
        envvar="CDC_INGEST_METRICS_ADDRESS", help="the address the metrics are served on (0.0.0.0: every interface)",
    )] = "127.0.0.1",
) -> None:
    """Ingest the configured tables until caught up (or continuously).

    A run whose tables already hold every record of their topics says so and ends without starting Spark."""
    from ingest.stream.runner import Runner  # Delta reads and the locks: loaded when a run starts

    # A draining run needs the topics now: a source that cannot list them is its one error line. A
    # continuous one waits for the cluster (Runner._ask_kafka), then discovers.
    cfg = load(config, workdir, strict=not continuous)
    metrics = None
    if metrics_port is not None:
        from ingest.metrics import RunMetrics  # the Prometheus client: only for a run that serves it
        from ingest.source.catalog import catalog_for, heartbeat_of

        metrics = RunMetrics(catalog_for(cfg), heartbeat_of=heartbeat_of(cfg))
        port = metrics.serve(metrics_port, metrics_address)
        logs.event(log, "metrics-serving", f"metrics at http://{metrics_address}:{port}/metrics", port=port)
    runner = Runner(cfg, full_start=full_start, metrics=metrics)
    try:
        report = runner.run(tables=table, mode="continuous" if continuous else "available_now",
                            reset_checkpoints=reset_checkpoints, from_beginning=from_beginning,
                            progress=progress_printer())
    finally:
        if metrics is not None:
            metrics.close()
    caught_up = ("; every table was caught up, Spark was not started" if report.caught_up and not report.failed
                 else "; the tables that ran were caught up, Spark was not started" if report.caught_up
                 else "; applied on the driver, Spark was not started" if report.on_driver else "")
    out = Table(title=f"run {report.run_id} ({report.seconds:.1f} s{caught_up})")
    for col in ("table", "batches", "received", "inserted", "updated", "deleted", "quarantined", "replayed", "error"):
        out.add_column(col)
    for name, t in report.tables.items():
        out.add_row(name, str(len(t.batches)), str(t.total("received")), str(t.total("inserted")),
                    str(t.total("updated")), str(t.total("deleted")), str(t.total("quarantined")),
                    str(t.already_applied), _remark(t))
    console.print(out)
    if report.cuts is not None:
        console.print(escape(report.cuts.describe()), highlight=False)
    if report.failed:
        unavailable = all(report.tables[name].unavailable for name in report.failed)
        raise typer.Exit(Exit.UNAVAILABLE if unavailable else Exit.TABLE_FAILED)


def _remark(table: TableRun) -> str:
    """The closing table's last column for one table: its error, else what else the run should say."""
    if table.error:
        return table.error
    if table.interrupted:
        return "interrupted before its commit; the next run applies it"
    return f"recovered from: {table.recovered[-1]}" if table.recovered else ""


@app.command(rich_help_panel=OPERATE)
def resnapshot(
    tables: Annotated[list[str], typer.Argument(help="the tables to read again", show_default=False)],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    signal_table: Annotated[str | None, typer.Option(
        help="insert the signal into this <schema>.<table> of --source-db (the connector's "
             "signal.data.collection) instead of its Kafka signal topic", show_default=False)] = None,
    source_db: Annotated[str | None, typer.Option(
        "--source-db", help="the source database holding --signal-table (a libpq string, or mysql://…)",
        show_default=False)] = None,
    where: Annotated[str | None, typer.Option(
        help="read only the rows of the (one) table that match this SQL condition, e.g. \"id IN (5, 9)\" "
             "(Debezium's additional-conditions)", show_default=False)] = None,
) -> None:
    """Read tables again from their database while the stream keeps flowing (an incremental snapshot).

    Asks the tables' Debezium connectors through their Kafka signal topic or their signal table; the
    next runs apply the reads (docs/operations.md)."""
    from ingest.ops.resnapshot import insert_at, send, signals_for  # librdkafka: when the command runs

    if (signal_table is None) != (source_db is None):
        raise ConfigError("--signal-table and --source-db go together: the signal table is in that database")
    cfg = load(config, workdir)
    signals = signals_for(cfg, tables, where)
    if signal_table is not None and source_db is not None:
        sent_to = [insert_at(source_db, signal_table, signals)] * len(signals)
    else:
        send(cfg, signals)
        sent_to = [asked.topic for asked in signals]
    out = Table(title="Incremental snapshots asked for")
    for col in ("connector (topic prefix)", "sent to", "source tables", "tables", "rows"):
        out.add_column(col)
    for asked, to in zip(signals, sent_to, strict=True):
        out.add_row(asked.prefix, to, ", ".join(asked.collections), ", ".join(asked.tables),
                    asked.where or "all")
    console.print(out)


@app.command(rich_help_panel=OPERATE)
def retype(
    table: Annotated[str, typer.Argument(help="the stopped table", show_default=False)],
    column: Annotated[str, typer.Argument(help="its column whose source type changed", show_default=False)],
    new_type: Annotated[str, typer.Argument(metavar="TYPE", help="the Delta type the column takes (e.g. string)",
                                            show_default=False)],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
) -> None:
    """Rewrite a table with one column cast to a new type, after an incompatible source change.

    Such a change stops the table; after the rewrite the next run applies it (docs/operations.md)."""
    from ingest.ops.retype import retype as rewrite  # Delta (and Spark for delta-spark tables): when it runs

    done = rewrite(load(config, workdir), table, column, new_type)
    console.print(f"table {done.table}: column {done.column} {done.was} -> {done.now}; {done.rows:,} rows "
                  f"rewritten with {done.rewritten_by} (Delta version {done.version})")


def _or_dash(value: int | None) -> str:
    """An offset or a version as ``status`` prints it: ``-`` for none (nothing applied, an empty partition)."""
    return "-" if value is None or value < 0 else str(value)


@app.command(rich_help_panel=OPERATE)
def status(config: ConfigOpt = DEFAULT_CONFIG, workdir: WorkdirOpt = None,
           output: FormatOpt = TableOrJson.table) -> None:
    """Per table: applied offsets, lag, Delta version, last batch; and how old each connector's newest heartbeat is.

    Exit 3: the source did not answer; 4: a topic ends before the offsets its table applied."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.ops.status import cut_status, describe_heartbeat, heartbeat_status, table_status
    from ingest.source.catalog import catalog_for

    cfg = load(config, workdir)
    source = catalog_for(cfg)  # one connection for the offsets and the heartbeats
    statuses = table_status(cfg, source=source)
    cut = cut_status(cfg)
    unreachable = {s.source_error for s in statuses if s.source_error}
    beats = [] if unreachable else heartbeat_status(cfg, source=source)
    if output == TableOrJson.json:
        for s in statuses:
            print_json({"table": s.table, "topic": s.topic, "applied": s.applied, "end": s.end, "lag": s.lag,
                        "delta_version": s.delta_version, "rows": s.rows, "last_batch": s.last_batch,
                        "source_error": s.source_error, "topic_behind": s.behind})
        if cut is not None:
            latest = cut.latest
            print_json({"cut": latest.cut if latest else None, "txn": latest.txn if latest else None,
                        "commit_ts": latest.commit_ts if latest else None,
                        "versions": latest.versions if latest else None, "lag_seconds": cut.lag_seconds,
                        "waiting": cut.waiting, "error": cut.error})
        for beat in beats:
            print_json({"heartbeat_topic": beat.topic, "newest_heartbeat": beat.written, "error": beat.error})
        if unreachable:
            raise typer.Exit(Exit.UNAVAILABLE)
        if any(s.behind for s in statuses):
            raise typer.Exit(Exit.TABLE_FAILED)
        return
    out = Table(title="Table status")
    for col in ("table", "topic", "offsets applied/newest", "lag", "Delta version", "live rows", "last batch"):
        out.add_column(col)
    for s in statuses:
        applied = ", ".join(f"p{p}:{_or_dash(o)}/{_or_dash(s.end[p] - 1)}" for p, o in sorted(s.applied.items()))
        last = "-"
        if s.last_batch and s.last_batch.get("finished_at"):
            b = s.last_batch
            last = f"#{b['batch_id']} {b['status']} at {b['finished_at']:%Y-%m-%d %H:%M:%S}"
        lag = str(s.lag) if s.lag is not None else "[red]topic behind[/]" if s.behind else "[red]unknown[/]"
        out.add_row(s.table, s.topic, applied or "-", lag, _or_dash(s.delta_version), str(s.rows), last)
    console.print(out)
    if cut is not None:
        console.print(escape(cut.describe()), highlight=False)
    now = time.time()
    for beat in beats:
        console.print(escape(describe_heartbeat(beat, now)), highlight=False)
    for problem in sorted(unreachable):
        err.print(f"[red]source unavailable:[/] {escape(problem)}", soft_wrap=True)
    for s in statuses:
        if s.behind:
            err.print(f"[red]topic behind:[/] {escape(s.behind)}", soft_wrap=True)
    if unreachable:
        raise typer.Exit(Exit.UNAVAILABLE)
    if any(s.behind for s in statuses):
        raise typer.Exit(Exit.TABLE_FAILED)


@app.command(rich_help_panel=OPERATE)
def verify(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    source_db: Annotated[str | None, typer.Option(
        "--source-db", help="the source database: a libpq URL (PostgreSQL) or mysql://user:password@host:port/db "
        "(MariaDB, MySQL); wait for Debezium and the tables, then compare each table with a SELECT of its source "
        "table (default: the simulator's truth)")] = None,
    wait: Annotated[float, typer.Option(
        help="--source-db: seconds to wait for Debezium's slots, and again for the tables to catch up (MariaDB, "
        "MySQL: for the tables to equal the source)")] = 120.0,
    table: TablesOpt = None,
) -> None:
    """Compare every table with its source (the simulator's truth, or --source-db); exit 1 on any mismatch."""
    if source_db is not None:
        if not verify_source(load(config, workdir), source_db, wait=wait, tables=table):
            raise typer.Exit(Exit.MISMATCH)
        return
    if table:
        raise typer.BadParameter("only with --source-db (the simulated source's truth is compared whole)",
                                 param_hint="--table")
    truth = plugins.truth_verifier()
    if truth is None:
        raise typer.BadParameter("name the source database to compare with; the simulated source's truth "
                                 "comes with the demo harness (harness/), which is not installed",
                                 param_hint="--source-db")
    if not truth(load(config, workdir)):
        raise typer.Exit(Exit.MISMATCH)


app.command(rich_help_panel=OPERATE)(init)
app.command(rich_help_panel=OPERATE)(check)
app.command(rich_help_panel=OPERATE)(jars)


app.command(rich_help_panel=OPERATE)(maintain)
# The analysts' commands, listed after the operators' (the order of `ingest --help`).
app.command(rich_help_panel=READ)(changes)
app.command(rich_help_panel=READ)(history)
app.command(rich_help_panel=READ)(query)
app.command(rich_help_panel=READ)(cuts)


#: The fields of a line ``ingest produce`` reads.
_RECORD_FIELDS = frozenset({"partition", "key", "value", "timestamp", "headers"})


@app.command(rich_help_panel=OPERATE)
def produce(
    topic: Annotated[str, typer.Argument(help="topic to append to (created if missing)")],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", exists=True, dir_okay=False,
                                              help="JSON lines file; default: stdin")] = None,
    partitions: Annotated[int, typer.Option(help="partitions when the topic is created")] = 3,
) -> None:
    """Write records from JSON lines to a topic of the configuration's source: the embedded topic log, or Kafka.

    One record per line: {"partition": 0 (optional; default by key hash, as Kafka's Java clients hash),
    "key": base64|null, "value": base64|null, "timestamp": epoch millis (optional),
    "headers": [{"key": "k", "value": base64|null}]}.
    """
    from ingest.source.producer import Outgoing  # loads Arrow: not before the command runs
    from ingest.source.producer import produce as produce_records

    cfg = load(config, workdir)
    stream = file.open() if file else sys.stdin
    records = []
    for lineno, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            if unknown := sorted(set(obj) - _RECORD_FIELDS):
                raise ValueError(f"unknown field(s) {', '.join(unknown)}; "
                                 f"a record has {', '.join(sorted(_RECORD_FIELDS))}")
            key = base64.b64decode(obj["key"], validate=True) if obj.get("key") is not None else None
            value = base64.b64decode(obj["value"], validate=True) if obj.get("value") is not None else None
            partition = obj.get("partition")
            headers = tuple((h["key"], base64.b64decode(h["value"]) if h.get("value") is not None else None)
                            for h in obj.get("headers", []))
            records.append(Outgoing(None if partition is None else int(partition), key, value,
                                    int(obj.get("timestamp", time.time() * 1000)), headers))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise typer.BadParameter(f"line {lineno}: not a valid record ({type(exc).__name__}: {exc})",
                                     param_hint="--file") from None
    written = produce_records(cfg, topic, records, partitions=partitions)
    for partition, (first, nxt) in sorted(written.items()):
        console.print(f"{topic}[{partition}]: offsets {first}..{nxt - 1}")



plugins.register_commands(app)


def main() -> None:
    """The ``ingest`` command: every error ends in one line and a documented exit code (:mod:`ingest.cli.outcome`)."""
    logs.configure()  # redacted text at warning until the options say otherwise: no credential reaches a log line
    signal.signal(signal.SIGTERM, stop_as_interrupted)
    app()


