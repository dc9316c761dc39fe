"""The ``ingest`` command line: running and proving the ingestion; the analysts' read commands are in
:mod:`ingest.cli_read`, quality and quarantine in :mod:`ingest.cli_quality`."""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ingest.cli_common import (
    DEFAULT_CONFIG,
    ConfigOpt,
    WorkdirOpt,
    add_consistency_rows,
    console,
    err,
    load,
    progress_printer,
)
from ingest.cli_proof import demo_stack, pg_load
from ingest.cli_quality import quality_app, quarantine_app
from ingest.cli_read import changes, history, query
from ingest.config import IngestConfig
from ingest.errors import IngestError

app = typer.Typer(help="CDC lakehouse ingestion: Debezium topics -> Delta Lake tables.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.add_typer(quality_app, name="quality")
app.add_typer(quarantine_app, name="quarantine")


@app.command()
def demo(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    events: Annotated[int, typer.Option(help="change events to simulate")] = 20_000,
    seed: Annotated[int, typer.Option(help="simulator seed")] = 7,
    malformed: Annotated[float, typer.Option(help="fraction of extra malformed messages")] = 0.005,
    violations: Annotated[float, typer.Option(help="fraction of changes that break the expectations suites")] = 0.004,
) -> None:
    """Simulate a source database, ingest its changes, verify every table; exit 1 on any mismatch."""
    from ingest.proof.demo import run_demo

    cfg = load(config, workdir)
    console.rule(f"CDC demo in {cfg.workdir}")
    started = time.perf_counter()

    def on_generate(done: int, total: int) -> None:
        if done == total or done % 5000 == 0:
            console.print(f"  simulating: {done}/{total} events")

    result = run_demo(cfg, events=events, seed=seed, malformed_fraction=malformed, violation_fraction=violations,
                      progress=progress_printer(), on_generate=on_generate)
    console.print("workload: " + ("generated" if result.generated else "reused (same seed and size); replaying it"))
    summary = Table(title="Tables after ingestion", show_lines=False)
    for col in ("table", "rows", "inserted", "updated", "deleted", "superseded", "stale", "quarantined",
                "replayed", "Delta version", "unchanged", "verification"):
        summary.add_column(col, justify="right" if col not in ("table", "verification") else "left")
    verdicts = {v.table: v for v in result.verifications}
    for name, run in result.report.tables.items():
        v = verdicts.get(name)
        verdict = f"[red]{_mismatch(v)}[/]"
        if v and v.ok:
            verdict = (f"[green]equal to source except {v.explained} keys explained by quarantine[/]" if v.explained
                       else "[green]equal to source[/]")
        if run.error:
            verdict = f"[red]failed: {run.error}[/]"
        summary.add_row(
            name, str(v.actual_rows if v else "?"), str(run.total("inserted")), str(run.total("updated")),
            str(run.total("deleted")), str(run.total("superseded")), str(run.total("stale")),
            str(run.total("quarantined")), str(run.already_applied), str(result.after[name].version),
            _unchanged(result.before[name], result.after[name]), verdict,
        )
    console.print(summary)
    balanced = all(b.balanced for t in result.report.tables.values() for b in t.batches)
    console.print(f"audit balance (received = applied + superseded + stale + quarantined + skipped): "
                  f"{'holds in every batch' if balanced else '[red]BROKEN[/]'}")
    _quality_summary(cfg, result)
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    if not (result.ok and balanced):
        raise typer.Exit(1)


def _quality_summary(cfg: IngestConfig, result: Any) -> None:
    """Per table: violations the source holds, what this run's batches found, what quarantine holds."""
    from ingest import quarantine

    held = quarantine.read(cfg.tables_root / cfg.target.quarantine_table, stage="quality", pending=True)
    pending = Counter(held["table"].to_pylist())
    for name, run in result.report.tables.items():
        failures: Counter[str] = Counter()
        for b in run.batches:
            failures.update(json.loads(b.quality_failures or "{}"))
        found = (", ".join(f"{k} {v}" for k, v in sorted(failures.items())) or "all expectations met"
                 ) if run.batches else "no new batch to validate"
        console.print(f"quality {name}: {result.counts.get(name, {}).get('quality_violations', 0)} violating "
                      f"changes in the source; this run: {found}; {pending[name]} changes held in quarantine "
                      f"(`ingest quarantine list -t {name}`)", highlight=False)


def _unchanged(before: Any, after: Any) -> str:
    if before.version is None:
        return "created"
    return "yes (same version, same files)" if before == after else f"no: v{before.version} -> v{after.version}"


def _mismatch(v: Any) -> str:
    if v is None:
        return "no truth"
    return f"MISMATCH missing {v.missing} unexpected {v.unexpected} different {v.different}"


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
    from ingest.engine import Engine

    cfg = load(config, workdir)
    report = Engine(cfg).run(tables=table, mode="continuous" if continuous else "available_now",
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
        from ingest.cli_proof import verify_source

        if not verify_source(load(config, workdir), source_db, wait=wait, tables=table):
            raise typer.Exit(1)
        return
    from ingest.proof.demo import verify_all

    results = verify_all(load(config, workdir))
    out = Table(title="Verification against the simulated source")
    for col in ("table", "expected", "actual", "missing", "unexpected", "different", "result"):
        out.add_column(col)
    for v in results:
        out.add_row(v.table, str(v.expected_rows), str(v.actual_rows), str(v.missing), str(v.unexpected),
                    str(v.different), "[green]ok[/]" if v.ok else "[red]MISMATCH[/]")
    console.print(out)
    for v in results:
        for example in v.examples:
            console.print(f"  {v.table}: {example}")
    if not all(v.ok for v in results):
        raise typer.Exit(1)


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
    from ingest.source.topiclog import ProducerRecord, TopicLog, partition_for_key

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


@app.command()
def torture(
    seed: Annotated[int, typer.Option(help="seeds the workload and every kill, damage and delay")] = 1,
    kills: Annotated[int, typer.Option(help="SIGKILLs to deliver before the recovery run")] = 50,
    events: Annotated[int, typer.Option(help="row-change events in the simulated workload")] = 12_000,
    batch: Annotated[int, typer.Option(help="records per table and micro-batch")] = 300,
    tables: Annotated[int, typer.Option(
        help="tables in the workload: the shop's three, then ledger_001... found by topic pattern (whole database)",
        min=3)] = 3,
    workdir: Annotated[Path | None, typer.Option(help="fresh directory (default: a new one under /tmp)")] = None,
    damage: Annotated[float, typer.Option(help="chance of damaging a Spark checkpoint before a restart")] = 0.2,
    value_format: Annotated[str, typer.Option("--format", help="avro or json")] = "avro",
    engine: Annotated[str, typer.Option(help="apply engine of the killed runs: delta-rs or delta-spark")] = "delta-rs",
    plan_on: Annotated[str, typer.Option(
        help="delta-spark: where batches are planned (target.plan_on): driver or executors")] = "driver",
    lake: Annotated[str, typer.Option(
        help="where the tables live: local (the workdir) or s3 (a fresh prefix in the stack's MinIO, started "
        "if it is not running, and restarted during --store-restarts runs)")] = "local",
    store_restarts: Annotated[int, typer.Option(
        help="--lake s3: runs during which the S3 server is restarted (they must finish cleanly)", min=0)] = 1,
    stack: Annotated[bool, typer.Option(
        "--stack", help="on the real stack: PostgreSQL under load, `ingest run --continuous`, faults: ingest "
        "SIGKILLs and broker, Connect, registry and PostgreSQL restarts; verified against PostgreSQL")] = False,
    faults: Annotated[int, typer.Option(help="--stack: faults to inject")] = 30,
    rate: Annotated[float, typer.Option(help="--stack: row changes per second written to PostgreSQL")] = 100.0,
    schema: Annotated[str, typer.Option(help="--stack: PostgreSQL schema to reset and load")] = "shop",
    scale: Annotated[float, typer.Option(help="--stack: size of the initial SQL workload")] = 0.3,
    pause: Annotated[tuple[float, float], typer.Option(help="--stack: seconds between faults (min max)")] = (
        10.0, 30.0),
) -> None:
    """Kill the engine N times while it ingests a simulated source, then prove nothing diverged (exit 1 if so).

    With --stack: inject faults into the real stack and the engine while PostgreSQL keeps changing, then
    verify every table against PostgreSQL (exit 1 on any divergence).
    """
    import tempfile

    if stack:
        from ingest.cli_stack import exit_unless, torture_stack

        exit_unless(torture_stack(seed=seed, faults=faults, rate=rate, value_format=value_format,  # type: ignore[arg-type]
                                  workdir=workdir, schema=schema, scale=scale, pause=pause))
        return
    from ingest.proof.torture import Torture, TortureSpec

    if lake not in ("local", "s3"):
        raise typer.BadParameter("choose local or s3", param_hint="--lake")
    if plan_on not in ("driver", "executors"):
        raise typer.BadParameter("choose driver or executors", param_hint="--plan-on")
    where = workdir or Path(tempfile.mkdtemp(prefix="cdc-torture-"))
    spec = TortureSpec(workdir=where, seed=seed, kills=kills, events=events, batch=batch,
                       value_format=value_format, damage_probability=damage,  # type: ignore[arg-type]
                       extra_tables=tables - 3, engine=engine, plan_on=plan_on)  # type: ignore[arg-type]
    if lake == "s3":
        from ingest.cli_stack import stack_lake

        spec.lake_root, spec.storage, spec.restart_store = stack_lake(f"torture-seed{seed}-{int(time.time())}")
        spec.store_restarts = store_restarts
    console.rule(f"torture: seed {seed}, {kills} kills, engine {engine} (planned on the {plan_on}), "
                 f"lake {spec.lake_root or 'local'}")
    result = Torture(spec, say=lambda line: console.print(line, markup=False, highlight=False)).run()
    c = result.consistency
    out = Table(title=f"torture seed {seed} in {where}")
    out.add_column("measure")
    out.add_column("value", justify="right")
    for label, n in sorted(result.kills.items()):
        out.add_row(f"kills at {label}", str(n))
    out.add_row("kills in total", str(sum(result.kills.values())))
    for kind, n in sorted(result.damages.items()):
        out.add_row(f"checkpoints damaged: {kind}", str(n))
    for run, at, away in result.store_restarts:
        out.add_row(f"S3 server restarted in run {run}", f"{at:.1f} s in, away {away:.1f} s")
    out.add_row("runs (killed + clean + recovery)", str(result.runs))
    if c is not None:
        out.add_row("batches committed (all tables)", str(c.commits))
        out.add_row("records in topics / received in audit", f"{c.records} / {c.received}")
        out.add_row("quarantined / malformed injected", f"{c.quarantined} / {c.malformed}")
        add_consistency_rows(out, c)
    out.add_row("wall time", f"{result.seconds / 60:.1f} min")
    console.print(out)
    for problem in ([result.failure] if result.failure else []) + (c.problems if c else []):
        console.print(f"[red]{escape(problem)}[/]")
    console.print("[green]consistent[/]" if result.ok else "[red]DIVERGED[/]")
    if not result.ok:
        raise typer.Exit(1)


app.command("demo-stack")(demo_stack)
app.command("pg-load")(pg_load)


def main() -> None:
    from ingest.secrets import install_log_redaction, redact

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    install_log_redaction()  # no credential reaches a log line, whoever logs it
    try:
        app()
    except IngestError as exc:
        err.print(f"[red]error:[/] {escape(redact(exc))}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
