"""The runbook "Rebuilding a table" (docs/operations.md#rebuilding-a-table), step by step, as a user
runs it: a table written in scd1 whose configuration now says scd2 is refused in one line that
names the steps; after them (the documented ``rm -r``), a run rebuilds it in scd2 from the topic,
and its current rows are the source's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from ingest.config import load_config
from tests.dagster.conftest import produce, write_config
from tests.harness import ingest_cli

pytestmark = pytest.mark.spark
TOPIC = "app.public.notes"


def _ingest(*args: str) -> subprocess.CompletedProcess[str]:
    return ingest_cli(*args, env={"PYTHONUNBUFFERED": "1"}, timeout=600)


def test_a_table_is_rebuilt_in_another_history_mode_by_the_runbooks_steps(tmp_path: Path) -> None:
    path, config = write_config(tmp_path / "work", batch=50, value_format="json",
                                tables=[{"name": "notes", "topic": TOPIC}])
    produce(config, TOPIC, [("c", {"id": i, "body": f"v1 {i}"}, 10 + i) for i in range(10)])
    produce(config, TOPIC, [("u", {"id": i, "body": f"v2 {i}"}, 100 + i) for i in range(0, 10, 2)])
    assert _ingest("run", "-c", str(path)).returncode == 0

    raw = yaml.safe_load(path.read_text())
    raw["tables"][0]["history_mode"] = "scd2"
    path.write_text(yaml.safe_dump(raw))
    produce(config, TOPIC, [("u", {"id": 1, "body": "v3 1"}, 200)])  # the next change meets the new mode
    refused = _ingest("run", "-c", str(path))
    assert refused.returncode != 0
    assert "history_mode scd1" in refused.stdout + refused.stderr
    assert "docs/operations.md#rebuilding-a-table" in (refused.stdout + refused.stderr).replace("\n", "")

    # the runbook's step 2, as written there
    root = load_config(path).tables_root
    removed = subprocess.run(f"rm -rf {root}/notes {root}/_cdc_tombstones/notes {root}/_cdc_moves/notes",
                             shell=True, check=False)
    assert removed.returncode == 0
    rebuilt = _ingest("run", "-c", str(path))
    assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-2000:]
    rows = DeltaTable(str(root / "notes")).to_pyarrow_table().to_pylist()
    current = {r["id"]: r["body"] for r in rows if r["_cdc_is_current"]}
    assert current == {i: f"v2 {i}" if i % 2 == 0 else f"v1 {i}" for i in range(10)} | {1: "v3 1"}
    assert sum(1 for r in rows if not r["_cdc_is_current"]) == 6  # the history the topic held: back
