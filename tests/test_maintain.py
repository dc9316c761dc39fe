"""``ingest maintain``: the dry run tells what maintenance then does; the lock, failures, discovery, exit codes.

Beside a live continuous run (a subprocess), locally and on S3: tests/proof/torture/test_maintain_beside_a_run.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ingest.cli import app
from ingest.commit.state import load_state
from ingest.config import IngestConfig, load_config
from ingest.errors import SourceUnavailableError
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.ops.maintain import MaintenanceOptions
from ingest.ops.maintain_tables import maintain_tables
from tests.factories import hold_lock_in_another_process
from tests.harness import Topic, ingest_in_batches, key, pg, user_columns


def _config(workdir: Path, tables: list[dict[str, Any]], **extra: Any) -> tuple[Path, IngestConfig]:
    raw = {"workdir": str(workdir), "source": {"value_format": "json"}, "tables": tables, **extra}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def _ingest(config: IngestConfig, name: str, *, creates: int = 12, deletes: int = 3) -> None:
    """Creates, then deletes of the first keys, in batches of three: a MERGE commit and a file each."""
    topic = Topic(config.table(name).topic)
    for i in range(creates):
        topic.send(key(i), pg("c", {"id": i, "body": f"v{i}"}, lsn=100 + i), partition=i % 2)
    for i in range(deletes):
        topic.send(key(i), pg("d", {"id": i}, lsn=200 + i), partition=i % 2)
    ingest_in_batches(config.table(name), TablePaths.of(config, name), topic,
                      list(range(3, creates + deletes, 3)))


def _maintain(path: Path, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    result = CliRunner().invoke(app, ["maintain", "-c", str(path), "--format", "json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, {t["table"]: t for t in json.loads(result.stdout)["tables"]}


def _on_disk(table: Path) -> set[str]:
    return {p.relative_to(table).as_posix() for p in table.rglob("*") if p.is_file()}


def _live(config: IngestConfig, name: str) -> dict[Any, dict[str, Any]]:
    return {r["id"]: user_columns(r) for r in read_all(open_table(config.table_path(name))).to_pylist()
            if not r["_cdc_deleted"]}


def _offsets(config: IngestConfig, name: str) -> dict[int, int | None]:
    state = load_state(config.table_path(name))
    return {p: state.applied_offset(config.table(name).topic, p) for p in (0, 1)}


@pytest.mark.spark
def test_a_dry_run_says_what_maintenance_then_does_and_changes_nothing(tmp_path: Path, apply_engine: Any) -> None:
    path, config = _config(tmp_path, [{"name": "notes", "topic": "app.notes", "tombstone_retention": "0s"}])
    _ingest(config, "notes")
    time.sleep(1.1)  # the deletes are now older than the zero retention (counted in whole seconds)
    table = config.table_path("notes").local
    referenced = {f.removeprefix(table.as_uri() + "/").removeprefix(str(table) + "/")
                  for f in open_table(table).file_uris()}
    disk, version = _on_disk(table), open_table(table).version()
    rows, offsets = _live(config, "notes"), _offsets(config, "notes")
    assert len(referenced) > 1 and len(rows) == 9

    code, dry = _maintain(path, "--dry-run", "--vacuum-retention-hours", "0")
    assert code == 0
    plan = dry["notes"]["plan"]
    assert dry["notes"]["status"] == "planned", dry["notes"]
    assert plan["maintained_by"] == ("delta-spark" if type(apply_engine).__name__ == "DeltaSparkWriter"
                                     else "delta-rs")
    # every file is far below the target size: compaction packs them all into one
    assert {f["path"] for f in plan["compact"]} == referenced
    assert plan["compact_bytes"] == sum((table / f).stat().st_size for f in referenced)
    # the files the MERGEs replaced are on disk and no version refers to them any more
    assert plan["vacuum"] and set(plan["vacuum"]) <= disk - referenced
    assert plan["tombstones_to_purge"] == 3
    assert dry["_cdc_audit"]["status"] == "planned" and dry["_cdc_quarantine"]["status"] == "absent"
    assert _on_disk(table) == disk and open_table(table).version() == version  # nothing changed

    code, done = _maintain(path, "--vacuum-retention-hours", "0")
    assert code == 0
    report = done["notes"]["report"]
    assert done["notes"]["status"] == "done", done["notes"]
    assert report["files_removed"] == len(plan["compact"]) and report["files_added"] == 1
    assert report["tombstones_purged"] == 3
    assert not set(plan["vacuum"]) & _on_disk(table)
    assert _live(config, "notes") == rows and _offsets(config, "notes") == offsets

    code, again = _maintain(path, "--dry-run", "--vacuum-retention-hours", "0")
    assert code == 0
    assert again["notes"]["plan"]["compact"] == [] and again["notes"]["plan"]["vacuum"] == []
    assert again["notes"]["plan"]["tombstones_to_purge"] == 0


def test_a_table_a_run_holds_is_skipped_after_the_wait_and_maintained_once_it_is_free(tmp_path: Path) -> None:
    path, config = _config(tmp_path, [{"name": "notes", "topic": "app.notes"},
                                      {"name": "other", "topic": "app.other"}])
    _ingest(config, "notes")
    _ingest(config, "other")
    table = config.table_path("notes").local
    disk, version = _on_disk(table), open_table(table).version()
    holder = hold_lock_in_another_process(config.tables_root.local, "notes")
    try:
        started = time.monotonic()
        code, held = _maintain(path, "--wait", "1")
        assert 1 <= time.monotonic() - started < 30
        assert code == 4
        assert held["notes"]["status"] == "skipped" and f"pid {holder.pid}" in held["notes"]["reason"]
        assert held["notes"]["report"] is None
        assert _on_disk(table) == disk and open_table(table).version() == version  # untouched
        assert held["other"]["status"] == "done" and held["_cdc_audit"]["status"] == "done"

        # A run that lets go within the wait: maintenance goes ahead then.
        outcomes: list[Any] = []
        waiting = threading.Thread(target=lambda: outcomes.extend(
            maintain_tables(config, MaintenanceOptions(), tables=["notes"], wait=60)))
        waiting.start()
        time.sleep(1.5)
        assert waiting.is_alive()
    finally:
        holder.kill()
        holder.wait()
    waiting.join(timeout=60)
    [outcome] = outcomes
    assert outcome.status == "done" and outcome.seconds >= 1.5 and outcome.report.files_removed > 1


def test_a_table_that_fails_is_reported_in_its_row_and_the_others_are_maintained(tmp_path: Path) -> None:
    path, config = _config(tmp_path, [{"name": "notes", "topic": "app.notes"},
                                      {"name": "broken", "topic": "app.broken"}])
    _ingest(config, "notes")
    log = config.table_path("broken").local / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("not a Delta log\n")
    code, out = _maintain(path)
    assert code == 4
    assert out["broken"]["status"] == "failed" and out["broken"]["reason"]
    assert out["notes"]["status"] == "done" and out["notes"]["report"]["files_removed"] > 1
    table = CliRunner().invoke(app, ["maintain", "-c", str(path)])
    assert table.exit_code == 4 and "failed" in table.stdout and "done" in table.stdout


def test_a_lake_that_does_not_answer_fails_the_first_table_and_the_others_are_not_tried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_port: int) -> None:
    port = refused_port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    path, _ = _config(tmp_path, [{"name": "notes", "topic": "app.notes"}, {"name": "other", "topic": "app.other"}],
                      target={"root": "s3://lake/cdc", "storage": {"endpoint_url": f"http://127.0.0.1:{port}",
                                                                   "retry_seconds": 1}})
    code, out = _maintain(path, "--dry-run")
    assert code == 4 and list(out) == ["notes", "other", "_cdc_audit", "_cdc_quarantine"]
    assert out["notes"]["status"] == "failed" and "the store's endpoint does not answer" in out["notes"]["reason"]
    for name in ("other", "_cdc_audit", "_cdc_quarantine"):  # the same store: each would ride it out in turn
        assert out[name] == {"table": name, "status": "failed", "seconds": 0.0, "report": None, "plan": None,
                             "reason": "not tried: the lake failed table notes"}


def test_only_the_named_tables_and_an_unknown_name_is_refused(tmp_path: Path) -> None:
    path, config = _config(tmp_path, [{"name": "notes", "topic": "app.notes"},
                                      {"name": "other", "topic": "app.other"}])
    _ingest(config, "notes")
    code, out = _maintain(path, "-t", "notes", "--dry-run")
    assert code == 0 and list(out) == ["notes"]  # neither the other table nor the shared ones
    refused = CliRunner().invoke(app, ["maintain", "-c", str(path), "-t", "nope"])
    assert refused.exit_code == 2 and "no table named 'nope'" in refused.output
    cli = subprocess.run([sys.executable, "-m", "ingest.cli", "maintain", "-c", str(path), "-t", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "no table named 'nope' in the configuration (its tables: notes, other)" in cli.stderr


def test_discovered_tables_are_maintained_and_a_source_that_cannot_list_them_exits_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ingest.source.topiclog import ProducerRecord, TopicLog

    path, config = _config(tmp_path, [{"name": "notes", "topic": "app.notes"}],
                           discover={"topic_pattern": r"shop\.public\.[^.]+"})
    log = TopicLog(config.log_dir)
    for topic in ("shop.public.items", "shop.public.carts", "other.public.skipped"):
        log.create_topic(topic, 1)
        log.append(topic, [ProducerRecord(0, key(1), pg("c", {"id": 1}, lsn=1), 0)])
    _ingest(config, "notes")
    code, out = _maintain(path, "--dry-run")
    assert code == 0
    assert list(out) == ["notes", "public_carts", "public_items", "_cdc_audit", "_cdc_quarantine"]
    assert out["public_items"]["status"] == "absent"  # discovered, not ingested yet

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise SourceUnavailableError("the topic log does not answer (test)")

    monkeypatch.setattr("ingest.source.discovery.with_discovered", unreachable)
    result = CliRunner().invoke(app, ["maintain", "-c", str(path), "--format", "json"])
    assert result.exit_code == 3
    document = json.loads(result.stdout)
    assert "does not answer" in document["discovered_tables_left_out"]
    assert {t["table"] for t in document["tables"]} == {"notes", "_cdc_audit", "_cdc_quarantine"}
    assert {t["status"] for t in document["tables"]} == {"done", "absent"}
