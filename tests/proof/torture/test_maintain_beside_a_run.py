"""``ingest maintain`` beside a live ``ingest run --continuous``: delta-rs on S3, delta-spark on a local lake.

The run (a subprocess) ingests ``notes`` while records keep arriving; ``ingest maintain`` runs
meanwhile (twice beside the delta-rs run, as cron would start it). It must leave the run's table alone (the run holds
its writer lock: the table is reported as skipped, naming the run), maintain the table no run
holds, and maintain the audit table the run keeps appending to (under the shared lock both take).
Once the run is stopped, ``notes`` equals what a run of the same records without maintenance
gives -- its rows and the per-partition offsets its Delta log records -- and every batch the run
committed has its audit row.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commit.state import load_state
from ingest.config import IngestConfig, load_config
from ingest.lake.delta import open_table, read_all
from ingest.read.query import history
from ingest.records import audit
from ingest.source.topiclog import TopicLog
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce
from tests.harness import user_columns

pytestmark = pytest.mark.spark

NOTES, IDLE = "app.notes", "app.idle"


def _write_config(workdir: Path, writer: str, target: dict[str, Any] | None = None) -> tuple[Path, IngestConfig]:
    raw = {"workdir": str(workdir), "source": {"value_format": "json", "max_records_per_batch": 100},
           "target": {"writer": writer, **(target or {})},
           "tables": [{"name": "notes", "topic": NOTES},
                      {"name": "idle", "topic": IDLE, "tombstone_retention": "0s"}]}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


class Changes:
    """Creates, updates and deletes of ``notes``, with growing LSNs."""

    def __init__(self, config: IngestConfig) -> None:
        self.config, self.lsn, self.next_id = config, 1000, 0

    def round(self, creates: int = 12) -> None:
        batch = []
        for _ in range(creates):
            self.lsn += 1
            batch.append(("c", {"id": self.next_id, "body": f"created {self.lsn}"}, self.lsn))
            self.next_id += 1
        for k in range(max(0, self.next_id - creates - 6), self.next_id - creates):  # older keys
            self.lsn += 1
            batch.append(("u", {"id": k, "body": f"updated {self.lsn}"}, self.lsn))
        for k in range(max(0, self.next_id - creates - 9), max(0, self.next_id - creates - 6)):
            self.lsn += 1
            batch.append(("d", {"id": k}, self.lsn))
        produce(self.config, NOTES, batch)


def _applied(config: IngestConfig) -> dict[int, int | None]:
    state = load_state(config.table_path("notes"))
    return {p: state.applied_offset(NOTES, p) for p in (0, 1)}


def _end(config: IngestConfig) -> dict[int, int]:
    return {p: n - 1 for p, n in TopicLog(config.log_dir).end_offsets(NOTES).items()}


def _wait_for(condition: Any, run: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert run.poll() is None, f"the run ended ({run.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(1)


def _maintain(path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """``ingest maintain`` as cron would start it: its own process, JSON on stdout."""
    done = subprocess.run([sys.executable, "-m", "ingest.cli", "maintain", "-c", str(path), "--wait", "2",
                           "--vacuum-retention-hours", "0", "--format", "json"],
                          capture_output=True, text=True, timeout=600)
    assert done.stdout.lstrip().startswith("{"), done.stdout[-2000:] + done.stderr[-3000:]
    return done.returncode, {t["table"]: t for t in json.loads(done.stdout)["tables"]}


def _rows(config: IngestConfig) -> dict[Any, dict[str, Any]]:
    return {r["id"]: user_columns(r) for r in read_all(open_table(config.table_path("notes"))).to_pylist()
            if not r["_cdc_deleted"]}


@pytest.mark.parametrize(("writer", "lake"), [("delta-rs", "s3"), ("delta-spark", "local")])
def test_maintenance_beside_a_continuous_run_leaves_its_table_as_a_run_alone_makes_it(
        tmp_path: Path, request: pytest.FixtureRequest, writer: str, lake: str) -> None:
    target: dict[str, Any] = {}
    if lake == "s3":
        s3 = request.getfixturevalue("s3")
        bucket = f"beside-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(bucket)
        target = {"root": f"s3://{bucket}/lake", "storage": s3.storage(), "checkpoint_dir": f"s3://{bucket}/ckpt"}
    # A table no run holds, with a file per run and three remembered deletes: written on the driver by
    # delta-rs, whichever writer then maintains it (tests/apply/test_engines_interchange.py).
    _, filler = _write_config(tmp_path / "work", "delta-rs", target)
    for step in range(3):
        produce(filler, IDLE, [("c", {"id": 4 * step + i, "body": "x"}, 10 * step + i) for i in range(4)]
                + [("d", {"id": 4 * step}, 10 * step + 5)])
        report = Runner(filler).run(tables=["idle"])
        assert report.on_driver and not report.failed
    path, config = _write_config(tmp_path / "work", writer, target)
    idle_before = {r["id"]: user_columns(r) for r in read_all(open_table(config.table_path("idle"))).to_pylist()
                   if not r["_cdc_deleted"]}
    changes = Changes(config)
    changes.round()

    log = tmp_path / "run.log"
    with log.open("wb") as out:
        run = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "-c", str(path), "--continuous",
                                "-t", "notes"], stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        _wait_for(lambda: open_table(config.table_path("notes")) is not None and _applied(config) == _end(config),
                  run, log, "first records applied")
        for attempt in range(2 if writer == "delta-rs" else 1):  # delta-spark's maintain starts a JVM each time
            changes.round()
            code, report = _maintain(path)
            assert code == 4, report  # a table was skipped: the run holds it
            notes = report["notes"]
            assert notes["status"] == "skipped" and f"pid {run.pid}" in notes["reason"], notes
            assert report["idle"]["status"] == "done", report["idle"]
            assert report["_cdc_audit"]["status"] == "done", report["_cdc_audit"]
            if attempt == 0:
                assert report["idle"]["report"]["files_removed"] > 1, report["idle"]
                assert report["idle"]["report"]["tombstones_purged"] == 3, report["idle"]
        changes.round()
        _wait_for(lambda: _applied(config) == _end(config), run, log, "every record applied")
    finally:
        run.send_signal(signal.SIGINT)  # the run stops after its current batch
        try:
            run.wait(timeout=180)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
    assert run.returncode == 0, log.read_text()[-4000:]

    # The same records, ingested by a run alone in a workdir of its own (on the driver: both writers
    # leave the same rows, tests/apply/test_writers_agree.py).
    _, alone = _write_config(tmp_path / "alone", "delta-rs")
    shutil.copytree(config.log_dir, alone.log_dir)
    report = Runner(alone).run(tables=["notes"])
    assert report.on_driver and not report.failed
    assert _rows(config) == _rows(alone) and len(_rows(config)) >= 24  # three rounds or more
    assert _applied(config) == _applied(alone) == _end(config)

    commits = history(config, "notes")
    assert not [c for c in commits if c.kind == "maintenance"]  # the run's table was never touched
    audited = audit.read(config.tables_root / config.target.audit_table, table="notes")["delta_version"].to_pylist()
    assert sorted(audited) == sorted({c.version for c in commits if c.kind == "cdc"})  # each batch once
    assert {r["id"]: user_columns(r) for r in read_all(open_table(config.table_path("idle"))).to_pylist()
            if not r["_cdc_deleted"]} == idle_before
