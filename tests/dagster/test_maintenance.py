"""The maintenance job: compaction, vacuum, checkpoint, tombstone purge, and the engine still resumes."""

from __future__ import annotations

import shutil

import dagster as dg
import pytest

from assets.constants import table_key
from assets.definitions import build_definitions
from assets.jobs import MAINTENANCE_JOB
from assets.resources import SparkIngestPipeline
from ingest.commit.state import load_state
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce, write_config

pytestmark = pytest.mark.spark


def _live(config) -> dict[int, str]:
    rows = read_all(open_table(config.table_path("notes")), where="NOT coalesce(_cdc_deleted, false)")
    return {r["id"]: r["body"] for r in rows.to_pylist()}


@pytest.mark.parametrize("engine_name", ["delta-rs", "delta-spark"])
def test_maintenance_compacts_and_the_engine_still_reads_its_progress(tmp_path, spark, engine_name):
    path, config = write_config(tmp_path / "work", batch=8, value_format="json", engine=engine_name,
                                tables=[{"name": "notes", "topic": "app.notes", "tombstone_retention": "1d"}])
    produce(config, "app.notes", [("c", {"id": i, "body": f"v{i}"}, 100 + i) for i in range(20)]
            + [("d", {"id": i}, 200 + i) for i in range(3)])
    assert not Runner(config, spark=spark).run().failed
    paths = TablePaths.of(config, "notes")
    before = load_state(paths.table)
    files_before = len(before.table.file_uris())
    assert files_before > 1  # eight records per batch: several MERGE commits and files
    offsets = {p: before.applied_offset("app.notes", p) for p in (0, 1)}
    rows_before = _live(config)

    engine = SparkIngestPipeline(config_path=str(path))
    defs = build_definitions(config, engine)
    result = defs.get_job_def(MAINTENANCE_JOB).execute_in_process(
        run_config={"ops": {op: {"config": {"vacuum_retention_hours": 0}}
                            for op in ("maintain_notes", "maintain_audit_and_quarantine")}},
        instance=dg.DagsterInstance.ephemeral())
    assert result.success
    [observation] = [e.asset_observation_data.asset_observation for e in result.all_events
                     if e.event_type_value == "ASSET_OBSERVATION"]
    meta = {k: v.value for k, v in observation.metadata.items()}
    assert observation.asset_key == table_key("notes")
    assert meta["files_removed"] == files_before and meta["files_added"] == 1
    assert meta["vacuumed_files"] >= files_before - 1
    if engine_name == "delta-rs":
        assert meta["checkpoint_version"] == meta["version_after"] > meta["version_before"]
    else:  # delta-spark writes its checkpoints itself (every ten commits)
        assert meta["checkpoint_version"] == -1 and meta["version_after"] > meta["version_before"]
    # The deletes' source time is long past the one-day retention, but retention counts from when a
    # delete was applied (moments ago): nothing is purged yet.
    assert meta["tombstones_purged"] == 0

    after = load_state(paths.table)
    assert len(after.table.file_uris()) == 1
    assert {p: after.applied_offset("app.notes", p) for p in (0, 1)} == offsets
    assert after.key_columns == before.key_columns == ("id",)
    assert _live(config) == rows_before

    # Without its Spark checkpoint the engine resumes from the offsets in the compacted table's log:
    # nothing is re-read, and new changes apply once. (delta-rs: the driver applied the backlog
    # alone, source.driver_seconds, and left no Spark checkpoint.)
    shutil.rmtree(config.checkpoint_root, ignore_errors=engine_name == "delta-rs")
    produce(config, "app.notes", [("u", {"id": 5, "body": "changed"}, 300), ("c", {"id": 99, "body": "new"}, 301)])
    run = Runner(config, spark=spark).run().tables["notes"]
    assert run.already_applied == 0 and run.total("updated") == 1 and run.total("inserted") == 1
    assert _live(config) == {**rows_before, 5: "changed", 99: "new"}
