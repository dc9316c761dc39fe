"""The delta-rs writer's checkpoints are written after its commits return, and are delta-rs's own.

delta-rs writes a checkpoint inside the commit that reaches it; the writer turns that off and writes
the same checkpoint in the background (:mod:`ingest.lake.checkpoints`), so that the micro-batch that
reaches it does not wait. What the log holds afterwards must be what delta-rs's hook would have left:
the same checkpoints, at the same versions, with the same expired files removed.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from harness.latency import checkpoint_versions

from ingest.apply.journey import apply_parts
from ingest.behind import maintenance_failures
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.config import TableSpec
from ingest.lake import checkpoints
from ingest.lake.checkpoints import AFTER_COMMIT, Checkpoints
from ingest.lake.delta import open_table, read_all
from ingest.lake.location import LakePath
from tests.factories import change, decoded_rows
from tests.harness import paths_in

SPEC = TableSpec(name="t", topic="t")
#: a checkpoint every fifth commit, and every log file before it expired at once
SHORT = {"delta.checkpointInterval": "5", "delta.logRetentionDuration": "interval 0 seconds"}


def _log(table: Path) -> list[str]:
    return sorted(p.name for p in (table / "_delta_log").iterdir() if not p.name.startswith("."))


def _local(paths: Any) -> Path:
    assert paths.table.local is not None
    return paths.table.local


def _batch(writer: DeltaRsWriter, paths: Any, i: int) -> int:
    """Batch ``i`` (an insert of key ``i``, then updates of it: appends and MERGEs); the version it made."""
    items = [change("c", i, 10 * i, name=f"n{i}"), change("u", i, 10 * i + 1, name=f"m{i}")]
    apply_parts(SPEC, paths, decoded_rows(items, first_offset=10 * i), batch_id=i, run_id="test", writer=writer)
    table = open_table(paths.table)
    assert table is not None
    return table.version()


def test_the_commit_that_reaches_a_checkpoint_returns_before_it_is_written(tmp_path, monkeypatch):
    paths = paths_in(tmp_path)
    writer = DeltaRsWriter()
    release = threading.Event()
    real = checkpoints.write_checkpoint

    def held(where: LakePath, version: int) -> None:
        assert release.wait(30), "the test never released the checkpoint"
        real(where, version)

    monkeypatch.setattr(checkpoints, "write_checkpoint", held)
    _batch(writer, paths, 0)
    created = open_table(paths.table)
    assert created is not None
    created.alter.set_table_properties({"delta.checkpointInterval": "5"})
    try:
        versions = [_batch(writer, paths, i) for i in range(1, 6)]
        assert 4 in versions, versions  # a batch's commit reached the checkpoint's version
        assert checkpoint_versions(_local(paths)) == set(), "the checkpoint was written inside the commit"
    finally:
        release.set()
    writer.settle()
    assert checkpoint_versions(_local(paths)) == {4, 9} & set(range(versions[-1] + 1))
    assert DeltaTable(paths.table.uri).version() == versions[-1]
    assert sorted(r["id"] for r in read_all(open_table(paths.table)).to_pylist()) == list(range(6))


def test_the_log_holds_what_delta_rs_own_hook_would_have_left(tmp_path):
    """Two tables take the same commits, one with delta-rs's hook, one with the background checkpoints."""
    rows = pa.table({"a": [1, 2, 3]})
    own, ours = tmp_path / "own", tmp_path / "ours"
    write_deltalake(str(own), rows, configuration=SHORT)
    write_deltalake(str(ours), rows, configuration=SHORT)
    later = Checkpoints()
    # Kept open, as the writer keeps its tables: a table opened afresh reads the newest checkpoint, which
    # the clean-up behind the next one may remove meanwhile when, as here, every log file expires at once.
    kept = DeltaTable(str(ours))
    for _ in range(12):
        write_deltalake(str(own), rows, mode="append")
        write_deltalake(kept, rows, mode="append", post_commithook_properties=AFTER_COMMIT)
        later.after_commit(kept, LakePath.of(ours))
    later.wait()
    # delta-rs's rule: checkpoints at versions 4 and 9 (the interval's every commit, counting version 0);
    # at 9 the files before it, the checkpoint at 4 included, had expired and were removed
    assert _log(own) == ["00000000000000000009.checkpoint.parquet",
                         *(f"{v:020d}.json" for v in range(9, 13)), "_last_checkpoint"]
    assert _log(ours) == _log(own)  # the same checkpoints, and the files before the last one removed alike
    assert DeltaTable(str(ours)).to_pyarrow_table().num_rows == 39


def test_a_checkpoint_that_fails_is_logged_and_the_commits_go_on(tmp_path, monkeypatch, caplog):
    paths = paths_in(tmp_path)
    writer = DeltaRsWriter()

    def refused(where: LakePath, version: int) -> None:
        raise OSError("the store refused the write")

    monkeypatch.setattr(checkpoints, "write_checkpoint", refused)
    _batch(writer, paths, 0)
    created = open_table(paths.table)
    assert created is not None
    created.alter.set_table_properties({"delta.checkpointInterval": "2"})
    counted = maintenance_failures()["checkpoint"]
    with caplog.at_level(logging.WARNING, logger="ingest.lake.checkpoints"):
        versions = [_batch(writer, paths, i) for i in range(1, 4)]
        writer.settle()
    failed = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert failed and all("was not written" in m and "the store refused the write" in m for m in failed), failed
    assert maintenance_failures()["checkpoint"] == counted + len(failed)  # what --metrics-port shows
    assert versions == [2, 3, 4]
    # the property change's own commit wrote one (delta-rs's hook); the writer's at 3 failed
    assert checkpoint_versions(_local(paths)) == {1}
    assert open_table(paths.table).version() == versions[-1]
    assert len(read_all(open_table(paths.table))) == 4
