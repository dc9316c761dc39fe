"""The development harness's commands, added to ``ingest`` through its ``ingest.commands`` entry point.

``demo`` (a simulated source ingested and verified), ``torture`` (kills while it ingests, then the
consistency proof; ``--stack``: faults on the real stack), ``demo-stack`` (the real stack end to end)
and ``pg-load`` (steady load on the stack's PostgreSQL), listed under their own panel of
``ingest --help``. :func:`verify_truth` is ``ingest verify`` against the simulator's truth (the
``ingest.truth`` entry point). Every import that costs is inside the command that needs it.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from harness.cli_stack import add_consistency_rows, exit_unless, stack_lake, torture_stack
from ingest.cli.common import DEFAULT_CONFIG, ConfigOpt, WorkdirOpt, console, load, progress_printer, say
from ingest.config import IngestConfig, load_config
from ingest.errors import ConfigError

#: The ``ingest --help`` panel the harness's commands are listed under.
PANEL = "Demo and proofs (development harness)"


def register(app: typer.Typer) -> None:
    """Add the harness's commands to the ``ingest`` app."""
    app.command(rich_help_panel=PANEL)(demo)
    app.command(rich_help_panel=PANEL)(torture)
    app.command("demo-stack", rich_help_panel=PANEL)(demo_stack)
    app.command("pg-load", rich_help_panel=PANEL)(pg_load)


def verify_truth(config: IngestConfig) -> bool:
    """``ingest verify`` against the simulated source's truth: prints the report, returns whether all equal."""
    from harness.demo import truth_dir, verify_all
    from harness.simulator.truth import TRUTH_FILE

    if not (truth_dir(config) / TRUTH_FILE).exists():
        raise ConfigError(f"no simulated source under {config.workdir} (ingest demo writes its truth there): "
                          "give --source-db to compare the tables with their source database")
    results = verify_all(config)
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
    return all(v.ok for v in results)


def demo(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    events: Annotated[int, typer.Option(help="change events to simulate")] = 20_000,
    seed: Annotated[int, typer.Option(help="simulator seed")] = 7,
    malformed: Annotated[float, typer.Option(help="fraction of extra malformed messages")] = 0.005,
    violations: Annotated[float, typer.Option(help="fraction of changes that break the expectations suites")] = 0.004,
) -> None:
    """Simulate a source database, ingest its changes, verify every table; exit 1 on any mismatch."""
    from harness.demo import run_demo

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
    from ingest.records import quarantine

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
    writer: Annotated[str, typer.Option("--writer", "--engine",
                                        help="writer of the killed runs: delta-rs or delta-spark")] = "delta-rs",
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
    if stack:
        exit_unless(torture_stack(seed=seed, faults=faults, rate=rate, value_format=value_format,  # type: ignore[arg-type]
                                  workdir=workdir, schema=schema, scale=scale, pause=pause))
        return
    from harness.torture.run import Torture, TortureSpec

    if lake not in ("local", "s3"):
        raise typer.BadParameter("choose local or s3", param_hint="--lake")
    if plan_on not in ("driver", "executors"):
        raise typer.BadParameter("choose driver or executors", param_hint="--plan-on")
    where = workdir or Path(tempfile.mkdtemp(prefix="cdc-torture-"))
    spec = TortureSpec(workdir=where, seed=seed, kills=kills, events=events, batch=batch,
                       value_format=value_format, damage_probability=damage,  # type: ignore[arg-type]
                       extra_tables=tables - 3, writer=writer, plan_on=plan_on)  # type: ignore[arg-type]
    if lake == "s3":
        spec.lake_root, spec.storage, spec.restart_store = stack_lake(f"torture-seed{seed}-{int(time.time())}")
        spec.store_restarts = store_restarts
    console.rule(f"torture: seed {seed}, {kills} kills, writer {writer} (planned on the {plan_on}), "
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


def demo_stack(
    avro: Annotated[Path, typer.Option(help="Avro configuration")] = Path("configs/stack.yaml"),
    json_config: Annotated[Path, typer.Option("--json", help="JSON configuration")] = Path("configs/stack-json.yaml"),
    mariadb: Annotated[Path | None, typer.Option(help="MariaDB configuration (--no-mariadb: PostgreSQL only)")]
    = Path("configs/stack-mariadb.yaml"),
    seed: Annotated[int, typer.Option(help="workload seed")] = 42,
    scale: Annotated[float, typer.Option(help="workload size (1.0: ~800 transactions, ~3,000 row changes)")] = 1.0,
    wait: Annotated[float, typer.Option(help="seconds to wait for Debezium and for each verification")] = 180.0,
) -> None:
    """The real stack end to end: SQL workloads ingested and verified against their databases.

    Resets the sources, runs the SQL workloads, ingests PostgreSQL's in Avro and JSON and MariaDB's
    in Avro, and verifies each against its database."""
    # the workload, the stack, the PostgreSQL client and Spark: loaded when the command runs
    from harness.postgres.workload import WorkloadSpec
    from harness.stack import StackError
    from harness.stack_proofs.demo import run_demo_stack
    from ingest.errors import EnvironmentProblem
    from ingest.verify import pg_source
    from ingest.verify.source_db import reached

    started = time.perf_counter()
    configs = [("avro", load_config(avro)), ("json", load_config(json_config))]
    maria_config = load_config(mariadb) if mariadb is not None else None
    console.rule("demo-stack: PostgreSQL, MariaDB -> Debezium -> Kafka -> Spark -> Delta, verified against the sources")
    try:
        with reached(pg_source, "the stack's PostgreSQL"):
            result = run_demo_stack(configs, spec=WorkloadSpec(seed=seed, scale=scale), wait=wait, say=say,
                                    progress=progress_printer(), mariadb=maria_config)
    except StackError as exc:
        raise EnvironmentProblem(f"the local stack could not start: {exc}") from None
    _summary(result)
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    if not result.ok:
        console.print("[red]demo-stack FAILED[/]")
        raise typer.Exit(1)
    console.print("[green]every table equals its source database, PostgreSQL's in Avro and in JSON"
                  + (", MariaDB's in Avro" if maria_config is not None else "") + "[/]")


def _summary(result: Any) -> None:
    workload = result.workload
    out = Table(title="Tables after demo-stack")
    out.add_column("table")
    for col in ("source rows", "inserted", "updated", "deleted"):
        out.add_column(col, justify="right")
    pg_runs = [r for r in result.runs if r.label != "mariadb"]
    for run in pg_runs:
        out.add_column(f"{run.label} records", justify="right")
        out.add_column(f"{run.label} Delta rows", justify="right")
        out.add_column(f"{run.label} verify")
    names = list(workload.tables) if workload else []
    for name in names:
        src = workload.tables[name]
        row = [name, str(src.rows), str(src.inserted), str(src.updated), str(src.deleted)]
        for run in pg_runs:
            row += _run_cells(run, name)
        out.add_row(*row)
    console.print(out)
    maria_run = next((r for r in result.runs if r.label == "mariadb"), None)
    if result.mariadb_workload is not None:
        maria = Table(title="MariaDB tables after demo-stack")
        for col in ("table", "source rows", "records", "Delta rows", "verify"):
            maria.add_column(col, justify="left" if col in ("table", "verify") else "right")
        for name, rows in result.mariadb_workload.rows.items():
            maria.add_row(name, str(rows), *(_run_cells(maria_run, name) if maria_run else ["-", "-", "not run"]))
        console.print(maria)
    for run in result.runs:
        for check in run.verification.tables if run.verification else []:
            for example in check.verification.examples if check.verification else []:
                console.print(f"  {run.label}: {escape(example)}", highlight=False)
            for note in check.notes:
                console.print(f"  [yellow]{run.label} {check.table}: {escape(note)}[/]", highlight=False)
        if run.verification and not run.verification.catch_up.ok:
            console.print(f"  [red]{run.label}: {escape(run.verification.catch_up.problem or 'not caught up')}[/]")
    for capture in (result.capture, result.mariadb_capture):
        if capture is not None and not capture.ok:
            console.print(f"[red]Debezium did not capture the workload: {escape(capture.problem or '')}[/]")
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


def _run_cells(run: Any, name: str) -> list[str]:
    """Records received, Delta rows and the verdict of table ``name`` in one run of demo-stack."""
    table_run = run.report.tables.get(name) if run.report else None
    check = next((c for c in (run.verification.tables if run.verification else []) if c.table == name), None)
    v = check.verification if check else None
    cells = [str(table_run.total("received")) if table_run else "-", str(v.actual_rows) if v else "-"]
    if table_run and table_run.error:
        return [*cells, f"[red]failed: {escape(table_run.error[:60])}[/]"]
    if check is None or v is None:
        return [*cells, f"[red]{escape(check.error if check and check.error else 'not verified')}[/]"]
    return [*cells, "[green]equal[/]" if v.ok else f"[red]-{v.missing} +{v.unexpected} ~{v.different}[/]"]


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
    from harness.postgres.load import LoadGenerator

    if source_db is None:
        from harness.stack import StackSettings

        source_db = StackSettings.from_env().pg_dsn()
    from ingest.verify import pg_source  # the PostgreSQL client: loaded when the command runs

    console.rule(f"load on {pg_source.describe(source_db)}: {rate:.0f} changes/s for {duration:.0f} s")
    report = LoadGenerator(source_db, rate=rate, duration=duration, seed=seed, schema=schema, say=say).run()
    console.print(f"committed {report.committed_changes} changes in {report.committed_transactions} transactions "
                  f"({report.rate:.0f}/s over {report.seconds:.1f} s); failed {report.failed_transactions}, "
                  f"uncertain {report.uncertain_transactions}, reconnects {report.reconnects}", highlight=False)
    if report.last_error:
        console.print(f"last error: {escape(report.last_error)}", highlight=False)
