"""``ingest demo-stack``: the real path end to end, from a fresh source schema to verified Delta tables.

1. start the local stack (idempotent) and put its credentials into this process's environment;
2. reset: wait until Debezium has captured what is in flight, delete the configured topics, remove
   the configurations' workdirs, drop and recreate the ``shop`` schema;
3. run the seeded SQL workload (:mod:`harness.postgres.workload`);
4. wait until Debezium has captured it (replication slots past the workload's last LSN);
5. per configuration (Avro, then JSON): ``ingest run`` until caught up, then ``verify --source-db``;
6. with a MariaDB configuration, the same on the stack's MariaDB: reset its ``shop`` database and the
   topics, run its workload (:mod:`harness.mariadb.workload`), wait until Kafka Connect has committed
   the connector's offset past it (:mod:`harness.mariadb.capture`), ingest, ``verify --source-db
   mysql://...``.

Every run is a fresh run. Dropping the schema emits no change events, so the previous run's rows
would stay in the old topics and in the Delta tables forever (nothing deletes them); a second run
over the same keys would then compare against a mix of two runs. Deleting the topics (Debezium
recreates them with the first change) and the workdirs (tables, checkpoints, quality results) makes
run two exactly like run one. Replication slots, connectors and registered schemas are kept.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg

from harness.mariadb import capture as maria_capture
from harness.mariadb import workload as maria
from harness.postgres import schema as pg_schema
from harness.postgres.workload import WorkloadReport, WorkloadSpec, run_workload
from ingest.config import IngestConfig
from ingest.errors import IngestError
from ingest.ops.verify_source import SourceVerification, verify_source_db
from ingest.verify.capture import CaptureResult, delete_topics, wait_for_capture
from ingest.verify.source_db import source_table_of

Say = Callable[[str], None]
#: What an engine workdir holds; a directory with anything else in it is not removed.
_WORKDIR_ENTRIES: Final = frozenset({"tables", "checkpoints", "quality", "topics", "schemas"})


@dataclass
class FormatRun:
    """One configuration's ingestion and verification."""

    label: str
    config: IngestConfig
    report: Any = None  # ingest.stream.runner.RunReport
    verification: SourceVerification | None = None
    ingest_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.report is not None and not self.report.failed
                and self.verification is not None and self.verification.ok)


@dataclass
class DemoStackResult:
    """Everything ``demo-stack`` did, with its timings (seconds)."""

    workload: WorkloadReport | None = None
    capture: CaptureResult | None = None
    runs: list[FormatRun] = field(default_factory=list)
    deleted_topics: list[str] = field(default_factory=list)
    removed_workdirs: list[Path] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    mariadb_workload: maria.MariaWorkloadReport | None = None
    mariadb_capture: CaptureResult | None = None

    @property
    def ok(self) -> bool:
        captured = all(c is None or c.ok for c in (self.capture, self.mariadb_capture))
        return bool(self.runs) and self.capture is not None and captured and all(r.ok for r in self.runs)


def schema_of(configs: list[IngestConfig]) -> str:
    """The one source schema every configured table comes from.

    Raises:
        IngestError: the tables name more than one schema.
    """
    schemas = {source_table_of(t)[0] for c in configs for t in c.tables}
    if len(schemas) != 1:
        raise IngestError(f"demo-stack needs every table from one source schema; the configurations name {schemas}")
    return schemas.pop()


def run_demo_stack(configs: list[tuple[str, IngestConfig]], *, spec: WorkloadSpec | None = None,
                   wait: float = 180.0, say: Say | None = None, progress: Any = None, spark: Any = None,
                   stack: Any = None, mariadb: IngestConfig | None = None) -> DemoStackResult:
    """Reset, run the workload, ingest and verify (see the module docstring).

    Args:
        configs: ``(label, configuration)`` pairs, ingested in this order (e.g. Avro, then JSON).
        spec: the workload (seed, scale); its schema is taken from the configurations' tables.
        wait: seconds to wait for Debezium, and for each verification.
        say: receives progress lines.
        progress: the engine's per-batch progress callback.
        spark: a SparkSession to use (default: the engine's own).
        stack: an :class:`harness.stack.Stack` (default: ``Stack.from_env()``).
        mariadb: a configuration of the MariaDB workload's tables (configs/stack-mariadb.yaml), run
            after the PostgreSQL ones with the same seed and scale.

    Returns:
        The result; ``ok`` when every configuration ingested without error and verified equal.
    """
    from harness.stack import CDC_COMPONENTS, Stack

    say = say or (lambda _line: None)
    result = DemoStackResult()
    started = time.monotonic()
    cfgs = [c for _, c in configs]
    schema = schema_of(cfgs)
    spec = WorkloadSpec(seed=(spec or WorkloadSpec()).seed, scale=(spec or WorkloadSpec()).scale, schema=schema)

    with _timed(result, "stack up"):
        stack = stack or Stack.from_env()
        stack.up(CDC_COMPONENTS)
        stack.wait_connectors()
        # The engine reads the registry's and Kafka's credentials from the environment.
        os.environ.update(stack.engine_env())
    dsn = stack.pg_dsn()

    with _timed(result, "reset"):
        say(f"reset: schema {schema}, topics and workdirs of {len(cfgs)} configuration(s)")
        drained = wait_for_capture(dsn, timeout=wait, say=say, on_stall=stack.unstick_capture)
        if not drained.ok:
            raise IngestError(f"Debezium has not captured the source before the reset: {drained.problem}")
        topics = sorted({t.topic for c in cfgs for t in c.tables})
        result.deleted_topics = delete_topics(stack.bootstrap_servers(), topics)
        say(f"  deleted {len(result.deleted_topics)} topic(s) of the previous run")
        for cfg in cfgs:
            if remove_workdir(cfg.workdir):
                result.removed_workdirs.append(cfg.workdir)
                say(f"  removed {cfg.workdir}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            pg_schema.reset(conn, schema)
        say(f"  schema {schema} dropped and created")

    with _timed(result, "workload"):
        result.workload = run_workload(dsn, spec, say)
        w = result.workload
        say(f"workload: {w.transactions} transactions, {w.changes} row changes in {w.seconds:.1f} s")

    with _timed(result, "capture"):
        say("waiting until Debezium has captured the workload")
        result.capture = wait_for_capture(dsn, timeout=wait, say=say, on_stall=stack.unstick_capture)
        if not result.capture.ok:
            say(f"  NOT captured: {result.capture.problem}")
            result.timings["total"] = time.monotonic() - started
            return result
        say(f"  captured up to {result.capture.target_lsn} after {result.capture.seconds:.1f} s")

    for label, cfg in configs:
        _ingest_and_verify(result, label, cfg, dsn, wait=wait, say=say, progress=progress, spark=spark,
                           on_stall=stack.unstick_capture)
    if mariadb is not None:
        maria_spec = maria.MariaWorkloadSpec(seed=spec.seed, scale=spec.scale, database=schema_of([mariadb]))
        _mariadb_part(result, mariadb, maria_spec, stack=stack, wait=wait, say=say, progress=progress, spark=spark)
    result.timings["total"] = time.monotonic() - started
    return result


def _mariadb_part(result: DemoStackResult, config: IngestConfig, spec: maria.MariaWorkloadSpec, *, stack: Any,
                  wait: float, say: Say, progress: Any, spark: Any) -> None:
    """Step 6 of the module docstring, into ``result`` (a run labelled ``mariadb``)."""

    s = stack.settings
    with _timed(result, "reset mariadb"):
        say(f"reset: MariaDB database {spec.database}, topics and workdir")
        topics = sorted(t.topic for t in config.tables)
        result.deleted_topics += delete_topics(stack.bootstrap_servers(), topics)
        if remove_workdir(config.workdir):
            result.removed_workdirs.append(config.workdir)
        conn = stack.component("mariadb").connect()
    with conn:
        maria.reset(conn, spec.database)
        with _timed(result, "workload mariadb"):
            result.mariadb_workload = w = maria.run_workload(conn, spec, say)
            say(f"workload (MariaDB): {w.transactions} transactions, {w.statements} statements in {w.seconds:.1f} s")
    with _timed(result, "capture mariadb"):
        result.mariadb_capture = maria_capture.wait_for_capture(stack, timeout=wait, say=say)
        if not result.mariadb_capture.ok:
            say(f"  NOT captured: {result.mariadb_capture.problem}")
            return
        say(f"  captured past {result.mariadb_capture.target_lsn} after {result.mariadb_capture.seconds:.1f} s")
    _ingest_and_verify(result, "mariadb", config, s.mariadb_url(spec.database), wait=wait, say=say,
                       progress=progress, spark=spark)


def _ingest_and_verify(result: DemoStackResult, label: str, config: IngestConfig, dsn: str, *, wait: float,
                       say: Say, progress: Any, spark: Any, on_stall: Callable[[], object] | None = None) -> None:
    """``ingest run`` until caught up, then ``verify --source-db`` against ``dsn``: one run of ``result``."""
    from ingest.stream.runner import Runner  # Spark: loaded when a run starts

    run = FormatRun(label, config)
    result.runs.append(run)
    say(f"ingest ({label}): {len(config.tables)} tables into {config.tables_root}")
    t0 = time.monotonic()
    run.report = Runner(config, spark=spark).run(progress=progress)
    run.ingest_seconds = time.monotonic() - t0
    say(f"verify ({label}) against the source database")
    t0 = time.monotonic()
    run.verification = verify_source_db(config, dsn, wait=wait, say=say, on_stall=on_stall)
    run.verify_seconds = time.monotonic() - t0
    result.timings[f"ingest {label}"] = run.ingest_seconds
    result.timings[f"verify {label}"] = run.verify_seconds


def remove_workdir(path: Path) -> bool:
    """Delete an engine workdir; returns False if there was none.

    Raises:
        IngestError: ``path`` holds anything an engine workdir does not, or contains the current
            directory (a misconfigured ``workdir`` must not cost a repository).
    """
    path = path.resolve()
    if not path.exists():
        return False
    cwd = Path.cwd().resolve()
    if path == cwd or path in cwd.parents or path == Path.home() or len(path.parts) < 3:
        raise IngestError(f"refusing to remove workdir {path}: it contains the current directory or is too high up")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in _WORKDIR_ENTRIES)
    if foreign:
        raise IngestError(f"refusing to remove workdir {path}: it holds {foreign[:5]}, which the engine does not "
                          "write; remove it by hand if it is really the demo's")
    shutil.rmtree(path)
    return True


class _timed:
    """Adds the block's wall time to ``result.timings[name]``."""

    def __init__(self, result: DemoStackResult, name: str) -> None:
        self.result, self.name = result, name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *_exc: object) -> None:
        self.result.timings[self.name] = time.monotonic() - self.start
