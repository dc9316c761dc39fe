"""``ingest init`` and ``ingest check``: a pipeline's first files, and a deployment's pre-flight."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ingest.cli.common import DEFAULT_CONFIG, ConfigOpt, FormatOpt, TableOrJson, WorkdirOpt, console, load, print_json
from ingest.cli.outcome import Exit
from ingest.ops.init import Stack, write_pipeline

_DEFAULT = Stack()


def init(
    path: Annotated[Path, typer.Argument(help="the configuration file to write")] = Path("ingest.yaml"),
    bootstrap_servers: Annotated[str, typer.Option(help="Kafka brokers, host:port,...")] = _DEFAULT.bootstrap_servers,
    registry_url: Annotated[str, typer.Option(help="Confluent-compatible schema registry URL")] = _DEFAULT.registry_url,
    lake: Annotated[str, typer.Option(help="s3://bucket/prefix for the tables and the checkpoints")] = _DEFAULT.lake,
    region: Annotated[str, typer.Option(help="the bucket's region")] = _DEFAULT.region,
    topic_pattern: Annotated[str, typer.Option(
        help="regular expression of the topics to ingest (Debezium's <prefix>.<schema>.<table>)"),
    ] = _DEFAULT.topic_pattern,
    value_format: Annotated[str, typer.Option(help="avro or json")] = _DEFAULT.value_format,
    dagster: Annotated[Path | None, typer.Option(
        help="also write a Dagster code location into this directory")] = None,
    force: Annotated[bool, typer.Option(help="replace files that exist")] = False,
) -> None:
    """Write a commented configuration for your own stack and a first quality suite.

    The stack: Kafka with SASL, a schema registry, Avro, S3. With --dagster, also a Dagster code
    location. Secrets stay in the environment: the file names their variables."""
    if value_format not in ("avro", "json"):
        raise typer.BadParameter("choose avro or json", param_hint="--value-format")
    stack = Stack(bootstrap_servers, registry_url, lake, region, topic_pattern, value_format)
    written = write_pipeline(path, stack, force=force, dagster=dagster)
    for file in written.files:
        console.print(f"wrote {file}", highlight=False)
    console.print(f"it loads: {len(written.config.tables)} listed table(s), topics matching "
                  f"{topic_pattern!r}; secrets from KAFKA_SASL_JAAS_CONFIG, SCHEMA_REGISTRY_USER_INFO, "
                  f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", highlight=False)
    console.print(f"next: replace the example addresses, then `ingest check -c {path}`", highlight=False)


def check(
    config: ConfigOpt = DEFAULT_CONFIG,
    workdir: WorkdirOpt = None,
    output: FormatOpt = TableOrJson.table,
) -> None:
    """Check a deployment before its first run: one line per check, ok or its cause and fix.

    Java and the JVM artifacts, the broker (and its credentials), the topics, the registry and the
    columns each table names, the lake and checkpoint locations (a real write), each table's state,
    its suite and the columns the suite reads.
    Exit 0: ready; 3: something is missing or refused (each line says what to do)."""
    from ingest.ops.check import run_checks  # loads delta-rs: not before a command runs

    cfg = load(config, workdir)
    failed = False
    for found in run_checks(cfg):
        failed = failed or not found.ok
        if output == TableOrJson.json:
            print_json({"check": found.name, "ok": found.ok, "detail": found.detail, "fix": found.fix})
            continue
        mark = "[green]ok  [/]" if found.ok else "[red]FAIL[/]"
        line = f"{mark} {escape(found.name)}: {escape(found.detail)}"
        if not found.ok and found.fix:
            line += f" [dim]-> {escape(found.fix)}[/]"
        console.print(line, highlight=False, soft_wrap=True)
    if failed:
        raise typer.Exit(Exit.UNAVAILABLE)


def jars(
    connector: Annotated[list[str] | None, typer.Option(
        "--connector", "-k", help="spark-kafka, delta-spark or hadoop-aws (repeat it); default: all three")] = None,
    copy_to: Annotated[Path | None, typer.Option(
        help="also copy the jars into this directory, for spark.jars on a machine that cannot resolve them")] = None,
) -> None:
    """Resolve the JVM connectors Spark needs (Kafka source, delta-spark, S3A) into the jars cache now.

    The cache ($INGEST_JARS_CACHE, default ~/.cache/cdc-lakehouse-ingest/jars) can be copied to a
    machine without network access; or --copy-to gathers the jars in one directory to name in
    spark.conf (spark.jars: <dir>/*.jar).
    """
    # Spark's Ivy, in a JVM of its own: loaded when the command runs
    from ingest.spark.jars import CONNECTORS, Connector, cache_dir, connector_jars, copy_jars

    unknown = sorted(set(connector or ()) - set(CONNECTORS))
    if unknown:
        raise typer.BadParameter(f"unknown connector(s) {', '.join(unknown)}; the connectors are "
                                 f"{', '.join(CONNECTORS)}", param_hint="--connector")
    chosen: list[Connector] = [c for c in CONNECTORS if not connector or c in connector]
    for name in chosen:
        found = connector_jars(name)
        console.print(f"{name}: {len(found)} jars, {sum(j.stat().st_size for j in found) / 1e6:.1f} MB",
                      markup=False, highlight=False)
    console.print(f"cache: {cache_dir()}", markup=False, highlight=False)
    if copy_to is not None:
        copies = copy_jars(chosen, copy_to)
        where = copy_to.resolve()
        console.print(f"copied {len(copies)} jars into {where}; name them in the configuration with\n"
                      f"  spark:\n    conf:\n      spark.jars: {where}/*.jar", markup=False, highlight=False)
