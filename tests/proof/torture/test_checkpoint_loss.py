"""A Spark checkpoint lost, truncated, garbled, rewound or lying: resume from the Delta log, never lose data.

Unit tests check :func:`ingest.stream.checkpoint.inspect` on real checkpoint files; end-to-end tests damage
the checkpoint of a live table between two runs and check that the second run leaves the table
equal to its source with every record received exactly once, and says what it did.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.torture.faults import DAMAGES, damage_checkpoint

from ingest.config import IngestConfig, load_config
from ingest.lake.delta import open_table, read_all
from ingest.records import audit
from ingest.source.topiclog import ProducerRecord, TopicLog
from ingest.stream.checkpoint import inspect
from ingest.stream.runner import Runner

TOPIC = "app.notes"


def _value(op: str, row: dict[str, Any], lsn: int) -> bytes:
    return json.dumps({"before": row if op == "d" else None, "after": None if op == "d" else row, "op": op,
                       "source": {"connector": "postgresql", "lsn": lsn,
                                  "sequence": json.dumps([str(lsn - 1), str(lsn)])}}).encode()


def _produce(log: TopicLog, changes: list[tuple[str, int, str | None, int]]) -> None:
    if not log.exists(TOPIC):
        log.create_topic(TOPIC, 2)
    log.append(TOPIC, [ProducerRecord(k % 2, json.dumps({"id": k}).encode(),
                                      _value(op, {"id": k, "body": body}, lsn), 1_700_000_000_000)
                       for op, k, body, lsn in changes])


def _config(workdir: Path, batch: int = 4) -> IngestConfig:
    path = workdir / "config.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    # driver_seconds 0: every run goes through Spark's query, whose checkpoint is the subject here
    path.write_text(yaml.safe_dump({"workdir": str(workdir), "source": {"value_format": "json",
                                                                        "max_records_per_batch": batch,
                                                                        "driver_seconds": 0},
                                    "tables": [{"name": "notes", "topic": TOPIC}]}))
    return load_config(path)


def _rows(config: IngestConfig) -> dict[int, str]:
    rows = read_all(open_table(config.table_path("notes"))).to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "duplicate keys"
    return {r["id"]: r["body"] for r in rows}


def _received(config: IngestConfig) -> int:
    rows = audit.read(config.tables_root / "_cdc_audit", table="notes").to_pylist()
    assert all(r["balanced"] for r in rows)
    return sum(r["received"] for r in rows)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Path:
    """A table with several batches (hence a checkpoint with several offsets and commits files)."""
    config = _config(tmp_path_factory.mktemp("checkpoint-template"))
    _produce(TopicLog(config.log_dir), [("c", i, f"v{i}", 100 + i) for i in range(16)])
    report = Runner(config, spark=spark).run()
    assert not report.failed and len(report.tables["notes"].batches) >= 3
    return config.workdir


@pytest.fixture
def ingested(template: Path, tmp_path: Path) -> IngestConfig:
    """A private copy of the template: table, topic log, audit and checkpoint."""
    workdir = tmp_path / "work"
    shutil.copytree(template, workdir, ignore=shutil.ignore_patterns("config.yaml"))
    return _config(workdir)


# -- inspect ----------------------------------------------------------------------------------------
def _verdict(config: IngestConfig, applied: dict[int, int] | None = None) -> Any:
    from ingest.commit.state import load_state

    state = load_state(config.table_path("notes"))
    done = applied if applied is not None else {p: state.applied_offset(TOPIC, p) for p in (0, 1)}
    return inspect(config.checkpoint_root / "notes", topic=TOPIC, applied=lambda p: done.get(p),
                   audit_path=config.tables_root / "_cdc_audit", table="notes")


def test_a_healthy_or_missing_checkpoint_passes(ingested: IngestConfig) -> None:
    assert _verdict(ingested).ok
    shutil.rmtree(ingested.checkpoint_root)
    assert _verdict(ingested).ok


@pytest.mark.parametrize(("kind", "problem"), [
    ("truncate-offsets", r"checksum mismatch|truncated|not valid JSON"),
    ("garbage-commit", r"checksum mismatch|not text|truncated|not valid JSON|not a commit record"),
    ("corrupt-metadata", r"metadata"),
    ("claim-ahead", r"claims partition \d is read up to offset \d+, but the table has applied only up to"),
])
def test_damage_is_detected_and_named(ingested: IngestConfig, kind: str, problem: str) -> None:
    for seed in range(4):  # different truncation points and garbage, with and without checksums
        shutil.copytree(ingested.checkpoint_root, ingested.workdir / f"backup{seed}")
        assert damage_checkpoint(ingested.checkpoint_root / "notes", kind, random.Random(seed))
        verdict = _verdict(ingested)
        assert not verdict.ok and verdict.problem
        assert re.search(problem, verdict.problem), verdict.problem
        shutil.rmtree(ingested.checkpoint_root)
        shutil.move(ingested.workdir / f"backup{seed}", ingested.checkpoint_root)


def test_a_rewound_checkpoint_is_fine_replay_is_idempotent(ingested: IngestConfig) -> None:
    assert damage_checkpoint(ingested.checkpoint_root / "notes", "rewind", random.Random(1))
    assert _verdict(ingested).ok


def test_a_checkpoint_ahead_of_a_table_that_was_rebuilt_is_refused(ingested: IngestConfig) -> None:
    """The operator deleted the table to rebuild it but kept the checkpoint: resuming would skip everything."""
    verdict = _verdict(ingested, applied={})
    assert not verdict.ok and "would skip records" in verdict.problem


def test_gaps_in_the_offsets_log_are_refused(ingested: IngestConfig) -> None:
    offsets = sorted((ingested.checkpoint_root / "notes" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    offsets[1].unlink()
    assert "gaps" in (_verdict(ingested).problem or "")


# -- end to end -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", DAMAGES)
def test_damaged_checkpoint_resumes_from_delta_without_loss_or_duplicates(
        ingested: IngestConfig, spark: Any, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    what = damage_checkpoint(ingested.checkpoint_root / "notes", kind, random.Random(7))
    assert what
    log = TopicLog(ingested.log_dir)
    _produce(log, [("u", 1, "changed", 300), ("d", 2, None, 301), ("c", 40, "new", 302), ("c", 41, "new", 303)])
    with caplog.at_level(logging.WARNING, logger="ingest.stream"):
        report = Runner(ingested, spark=spark).run()
    assert not report.failed, report.tables["notes"].error
    expected = {i: f"v{i}" for i in range(16) if i != 2} | {1: "changed", 40: "new", 41: "new"}
    assert _rows(ingested) == expected
    assert _received(ingested) == sum(log.end_offsets(TOPIC).values())  # each record exactly once
    if kind not in ("delete", "rewind"):
        assert any("checkpoint" in r.getMessage() and "notes" in r.getMessage() for r in caplog.records)


def test_checkpoint_spark_cannot_read_falls_back_at_runtime(ingested: IngestConfig, spark: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A well-formed file of a log version Spark does not know: our check passes it, Spark fails, we recover."""
    offsets = ingested.checkpoint_root / "notes" / "offsets"
    last = max(offsets.glob("[0-9]*"), key=lambda p: int(p.name))
    last.write_text("v99" + last.read_text()[2:])
    (offsets / f".{last.name}.crc").unlink(missing_ok=True)  # checkpoints written before the raw local files
    _produce(TopicLog(ingested.log_dir), [("c", 50, "after", 400)])
    with caplog.at_level(logging.WARNING, logger="ingest.stream"):
        report = Runner(ingested, spark=spark).run()
    assert not report.failed, report.tables["notes"].error
    assert _rows(ingested)[50] == "after"
    assert any("restarting it from the offsets" in r.getMessage() or "cannot start" in r.getMessage()
               for r in caplog.records)


def test_a_truncated_offsets_file_says_what_became_of_its_checksum(tmp_path: Path) -> None:
    """The engine writes local checkpoints without Hadoop's .crc files; earlier ones have them."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":5}}\n')
    assert damage_checkpoint(tmp_path, "truncate-offsets", random.Random(1)).endswith("(no checksum)")
    said = set()
    for seed in range(20):
        (offsets / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":5}}\n')
        (offsets / ".0.crc").write_bytes(b"crc")
        text = damage_checkpoint(tmp_path, "truncate-offsets", random.Random(seed))
        kept = (offsets / ".0.crc").exists()
        assert text.endswith("(checksum kept)" if kept else "(checksum removed)"), text
        said.add(kept)
    assert said == {True, False}
