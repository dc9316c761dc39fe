"""A table whose topic was deleted and created again (docs/operations.md#a-topic-that-ends-before-its-table).

The new topic starts at offset 0, below the offsets the table applied. A resume by offset took it for
caught up, applied none of its records and, once the topic grew past the old offsets, would have
skipped as many: silently. Now the run stops that table at its start in one line and serves the
others, ``ingest status`` and ``ingest check`` say so, and the runbook's rebuild reads the new topic.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from deltalake import DeltaTable

from ingest.cli.outcome import Exit
from ingest.source.topiclog import TopicLog
from tests.dagster.conftest import produce, write_config
from tests.harness import ingest_cli

NOTES, TAGS = "app.public.notes", "app.public.tags"


def _ingest(*args: str) -> subprocess.CompletedProcess[str]:
    return ingest_cli(*args, env={"PYTHONUNBUFFERED": "1", "COLUMNS": "400"}, timeout=600)


def _rows(path: Path) -> dict[int, str]:
    return {r["id"]: r["body"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}


def test_a_recreated_topic_stops_its_table_and_the_runbook_rebuilds_it(tmp_path: Path) -> None:
    path, config = write_config(tmp_path / "work", batch=50, value_format="json", tables=[
        {"name": "notes", "topic": NOTES}, {"name": "tags", "topic": TAGS}])
    produce(config, NOTES, [("c", {"id": i, "body": f"v1 {i}"}, 10 + i) for i in range(10)], partitions=1)
    produce(config, TAGS, [("c", {"id": 1, "body": "red"}, 30)], partitions=1)
    assert _ingest("run", "-c", str(path)).returncode == 0
    notes = config.tables_root.local / "notes"
    version = DeltaTable(str(notes)).version()

    # the connector started afresh into a topic deleted and created again: its offsets start at 0
    TopicLog(config.log_dir).delete_topic(NOTES)
    produce(config, NOTES, [("r", {"id": i, "body": f"again {i}"}, 500 + i) for i in range(3)], partitions=1)
    produce(config, TAGS, [("u", {"id": 1, "body": "blue"}, 40)], partitions=1)
    stopped = _ingest("run", "-c", str(path))
    said = stopped.stdout + stopped.stderr
    assert stopped.returncode == Exit.TABLE_FAILED, said
    assert ("table notes stopped: table 'notes': topic app.public.notes ends before the offsets the table applied: "
            "partition 0 ends at offset 2, the table applied up to 9.") in said
    assert DeltaTable(str(notes)).version() == version  # nothing of the new topic applied by offset
    assert _rows(config.tables_root.local / "tags") == {1: "blue"}  # the other table was served

    status = _ingest("status", "-c", str(path))
    assert status.returncode == Exit.TABLE_FAILED, status.stdout + status.stderr
    assert "topic behind" in status.stdout and "topic behind: table 'notes': topic app.public.notes" in status.stderr
    check = _ingest("check", "-c", str(path))
    assert check.returncode == Exit.UNAVAILABLE
    assert [line for line in check.stdout.splitlines() if line.startswith("FAIL")] == [
        "FAIL tables: notes: table 'notes': topic app.public.notes ends before the offsets the table applied: "
        "partition 0 ends at offset 2, the table applied up to 9. A topic keeps its offsets, so it was deleted and "
        "created again, or it is another cluster's; its records are not the ones the table read, and none of them "
        "is applied. Point tables[].topic and source.kafka at the table's source or, if this topic is its source "
        "now, rebuild the table from it (docs/operations.md#a-topic-that-ends-before-its-table)"]

    # the runbook: this topic is the table's source now, so the table is rebuilt from it
    root = config.tables_root
    removed = subprocess.run(f"rm -rf {root}/notes {root}/_cdc_tombstones/notes {root}/_cdc_moves/notes",
                             shell=True, check=False)
    assert removed.returncode == 0
    rebuilt = _ingest("run", "-c", str(path))
    assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-2000:]
    assert _rows(notes) == {i: f"again {i}" for i in range(3)}
