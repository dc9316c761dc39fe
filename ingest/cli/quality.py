"""``ingest quality ...`` and ``ingest quarantine ...``: the operator's view of the quality stage."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any, get_args

import typer
from rich.table import Table

from ingest.cli.common import (
    DEFAULT_CONFIG,
    ConfigOpt,
    FormatOpt,
    TableOpt,
    TableOrJson,
    WorkdirOpt,
    console,
    load,
    print_json,
)
from ingest.config import IngestConfig
from ingest.errors import DecodeError, IngestError, shortened
from ingest.lake.layout import TablePaths
from ingest.model import ChangeEvent, KafkaCoordinates

quality_app = typer.Typer(help="Great Expectations suites and per-batch validation results.", no_args_is_help=True)
quarantine_app = typer.Typer(help="Messages held back: list, inspect, re-apply after a fix.", no_args_is_help=True)


def _short(value: Any, limit: int = 70) -> str:
    return shortened("" if value is None else str(value), limit)


# -- quality ------------------------------------------------------------------------------------------
@quality_app.command("check")
def quality_check(config: ConfigOpt = DEFAULT_CONFIG, workdir: WorkdirOpt = None) -> None:
    """Load every table's suite with GX and check it against the table (what `run` does at start-up)."""
    # the gate (Arrow; Great Expectations on its first suite load): loaded when the command runs
    from ingest.quality import QualityGate

    cfg = load(config, workdir)
    out = Table(title="Expectations per table")
    for col in ("table", "expectation (name)", "kind", "policy"):
        out.add_column(col)
    for spec in cfg.tables:
        gate = QualityGate.at_start(cfg, spec)
        if gate is None:
            out.add_row(spec.name, "(no suite)", "", "")
            continue
        for e in gate.suite.expectations:
            out.add_row(spec.name, e.name, "rows" if e.row_level else "batch", gate.policies[e.name])
    console.print(out)
    console.print("[green]every suite loads and fits its table[/]")


@quality_app.command("list")
def quality_list(table: TableOpt, config: ConfigOpt = DEFAULT_CONFIG, workdir: WorkdirOpt = None,
                 output: FormatOpt = TableOrJson.table) -> None:
    """The table's stored validation results, newest last."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.quality import ResultStore

    cfg = load(config, workdir)
    store = ResultStore(cfg.quality_results_dir / cfg.table(table).name)
    if output == TableOrJson.json:
        for stored in store.list():
            doc = stored.load()
            print_json({"at": stored.at, "run_id": stored.run_id, "batch_id": stored.batch_id,
                        **{k: doc.get(k) for k in ("status", "rows_validated", "rows_held", "failures")}})
        return
    out = Table(title=f"Validation results of {table} (newest last)")
    for col in ("at (UTC)", "run", "batch", "status", "rows", "held", "failures"):
        out.add_column(col)
    for stored in store.list():
        doc = stored.load()
        out.add_row(f"{stored.at:%Y-%m-%d %H:%M:%S}", stored.run_id, str(stored.batch_id), doc.get("status", "?"),
                    str(doc.get("rows_validated", "")), str(doc.get("rows_held", "")),
                    _short(json.dumps(doc.get("failures", {})), 80))
    console.print(out)


@quality_app.command("show")
def quality_show(
    table: TableOpt,
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    batch: Annotated[int | None, typer.Option("--batch", "-b", help="stream batch id (default: newest)")] = None,
    run: Annotated[str | None, typer.Option(help="run id")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the full GX validation result JSON")] = False,
) -> None:
    """One batch's validation result: a summary, or GX's full result JSON (e.g. for Data Docs)."""
    # Delta and DuckDB: loaded when the command runs, not when the CLI starts
    from ingest.quality import ResultStore

    cfg = load(config, workdir)
    stored = ResultStore(cfg.quality_results_dir / cfg.table(table).name).find(batch_id=batch, run_id=run)
    if stored is None:
        raise IngestError(f"no stored validation result for table {table!r}"
                          + (f" batch {batch}" if batch is not None else ""))
    doc = stored.load()
    if as_json:
        print(json.dumps(doc["validation_result"], indent=2, default=str))
        return
    console.print(f"table {table}, suite {doc['suite']}, run {doc['run_id']}, batch {doc['batch_id']}: "
                  f"[bold]{doc['status']}[/] ({doc['rows_validated']} rows validated, {doc['rows_held']} held)")
    out = Table()
    for col in ("expectation", "policy", "success", "unexpected", "observed / sample"):
        out.add_column(col)
    names = doc.get("names", {})
    for r in doc["validation_result"]["results"]:
        config_ = r["expectation_config"]
        name = names.get(config_.get("id"), config_["type"])
        res = r.get("result") or {}
        sample = res.get("observed_value", res.get("partial_unexpected_list", ""))
        out.add_row(name, doc["policies"].get(name, "?"), "yes" if r["success"] else "[red]no[/]",
                    str(res.get("unexpected_count", "")), _short(sample))
    console.print(out)


# -- quarantine ---------------------------------------------------------------------------------------
def _names(expectations: str | None) -> str:
    """The JSON list of expectation names a quality hold carries, as text."""
    if not expectations:
        return ""
    try:
        return ", ".join(json.loads(expectations))
    except ValueError:
        return expectations


def _message_id(row: dict[str, Any]) -> str:
    return f"{row['topic']}:{row['partition']}:{row['offset']}"


def _parse_id(text: str) -> tuple[str, int, int]:
    topic, _, rest = text.rpartition(":")
    topic, _, partition = topic.rpartition(":")
    try:
        return topic, int(partition), int(rest)
    except ValueError:
        raise IngestError(f"not a message id {text!r}: expected <topic>:<partition>:<offset>") from None


@quarantine_app.command("list")
def quarantine_list(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    table: Annotated[str | None, typer.Option("--table", "-t", help="only this table")] = None,
    stage: Annotated[str | None, typer.Option(help="only this stage: decode, key, quality")] = None,
    all_: Annotated[bool, typer.Option("--all", help="include rows already replayed")] = False,
    limit: Annotated[int, typer.Option(min=1, help="rows to print in table format")] = 50,
    output: FormatOpt = TableOrJson.table,
) -> None:
    """Quarantined messages (pending ones unless --all)."""
    cfg = load(config, workdir)
    if table is not None:
        cfg.table(table)  # an unknown name is refused, not answered with an empty list
    _check_stage(stage)
    path = TablePaths.of(cfg, cfg.tables[0].name).quarantine
    rows = _quarantined(path, table=table, stage=stage, pending=not all_)
    rows.sort(key=lambda r: (r["table"], r["topic"], r["partition"], r["offset"]))
    if output == TableOrJson.json:
        for r in rows:
            raw = {k: base64.b64encode(r[k]).decode() if r[k] is not None else None for k in ("raw_key", "raw_value")}
            print_json({**r, **raw, "id": _message_id(r)})
        return
    out = Table(title=f"{len(rows)} quarantined messages" + ("" if all_ else " pending replay"))
    for col in ("table", "id (topic:partition:offset)", "stage", "batch", "key", "why", "replayed"):
        out.add_column(col)
    for r in rows[:limit]:
        replayed = f"v{r['replay_version']}" if r["replayed_at"] and r["replay_version"] is not None else (
            "yes" if r["replayed_at"] else "")
        out.add_row(r["table"], _message_id(r), r["stage"], str(r["batch_id"]), r["row_key"] or "",
                    _short(_names(r["expectations"]) or r["reason"], 60), replayed)
    console.print(out)


def _check_stage(stage: str | None) -> None:
    from ingest.records.quarantine import Stage  # loads delta-rs: only when a command reads the quarantine

    if stage is not None and stage not in get_args(Stage):
        raise typer.BadParameter(f"{stage!r} is not a stage: {', '.join(get_args(Stage))}", param_hint="--stage")


def _quarantined(path: Any, **filters: Any) -> list[dict[str, Any]]:
    from ingest.records import quarantine  # loads delta-rs: only when a command reads the quarantine

    return quarantine.read(path, **filters).to_pylist()


@quarantine_app.command("show")
def quarantine_show(
    message: Annotated[str, typer.Argument(help="message id <topic>:<partition>:<offset> (from `list`)")],
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    table: Annotated[str | None, typer.Option("--table", "-t", help="table (if the topic feeds several)")] = None,
) -> None:
    """Everything about one quarantined message, with its raw bytes and the change it decodes to."""
    cfg = load(config, workdir)
    topic, partition, offset = _parse_id(message)
    path = TablePaths.of(cfg, cfg.tables[0].name).quarantine
    rows = [r for r in _quarantined(path, table=table)
            if (r["topic"], r["partition"], r["offset"]) == (topic, partition, offset)]
    if not rows:
        raise IngestError(f"no quarantined message {message}")
    for r in rows:
        for name in ("table", "topic", "partition", "offset", "kafka_timestamp", "stage", "reason", "expectations",
                     "row_key", "batch_id", "run_id", "quarantined_at", "replayed_at", "replay_version"):
            console.print(f"[bold]{name:>15}[/]: {r[name]}", highlight=False)
        for name in ("raw_key", "raw_value"):
            raw = r[name]
            text = "null" if raw is None else f"{len(raw)} bytes, base64 {base64.b64encode(raw).decode()}"
            console.print(f"[bold]{name:>15}[/]: {_short(text, 400)}", highlight=False)
        console.print(f"[bold]{'decodes to':>15}[/]: {_decoded(cfg, r)}", highlight=False)


def _decoded(cfg: IngestConfig, row: dict[str, Any]) -> str:
    # the decoders (fastavro, orjson): loaded when a message is shown
    from ingest.decode.columnar import DecoderSpec

    decoder = DecoderSpec.for_table(cfg, cfg.table(row["table"]), keep_before=True)()
    try:
        result = decoder.decode(row["raw_key"], row["raw_value"],
                                KafkaCoordinates(row["topic"], row["partition"], row["offset"]))
    except DecodeError as exc:
        return f"(does not decode: {exc.reason})"
    if not isinstance(result, ChangeEvent):
        return repr(result)
    shown = {"op": result.op, "key": result.key, "after": result.after, "before": result.before,
             "position": result.position.encode()}
    if result.moved_from is not None:  # applied as a delete of this key, then the row under the new one
        shown["moved_from"] = result.moved_from
    return json.dumps(shown, default=str)


@quarantine_app.command("replay")
def quarantine_replay(
    table: TableOpt,
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    stage: Annotated[str | None, typer.Option(help="only messages held at this stage")] = None,
    batch: Annotated[int | None, typer.Option("--batch", "-b", help="only messages held by this batch")] = None,
    message: Annotated[list[str] | None, typer.Option("--id", help="only these <topic>:<partition>:<offset>")] = None,
    recheck: Annotated[bool, typer.Option(help="validate again with the table's current suite")] = True,
) -> None:
    """Re-apply pending quarantined messages after a fix (idempotent; stale ones never win)."""
    # the journey brings Delta and the decoders: loaded when a replay runs
    from ingest.ops.replay import replay_quarantine

    cfg = load(config, workdir)
    _check_stage(stage)
    ids = [_parse_id(m) for m in message] if message else None
    report = replay_quarantine(cfg, table, stage=stage, batch_id=batch, ids=ids, recheck=recheck)
    rec = report.record
    console.print(f"{table}: {report.selected} pending messages selected, {report.replayed} replayed, "
                  f"{len(report.still_held)} still held")
    if rec is not None:
        console.print(f"  applied in Delta version {rec.delta_version}: +{rec.inserted} ~{rec.updated} -{rec.deleted}, "
                      f"stale (older than the table) {rec.stale}, superseded {rec.superseded}; "
                      f"quality {rec.quality_status}")
    for (topic, partition, offset, stage_), reason in report.still_held[:20]:
        console.print(f"  still held {topic}:{partition}:{offset} ({stage_}): {_short(reason, 100)}")
