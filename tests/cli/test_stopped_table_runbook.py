"""The runbook "A table stopped" (docs/operations.md), step by step, with the commands it shows.

Two tables in one run; a batch of ``items`` breaks its suite under policy ``fail``: the run exits 4
naming the table and the expectation while ``notes`` applies its batch. ``ingest status`` shows the
stopped table's lag and its last good batch. The cause is fixed (the policy becomes ``quarantine``),
``ingest run --table items`` catches that table up alone, and ``ingest status`` shows every table
with no lag, the bad change in quarantine and nothing applied twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.cli.outcome import Exit
from ingest.config import load_config
from ingest.lake.delta import open_table, read_all
from tests.dagster.conftest import produce
from tests.harness import ingest_cli
from tests.quality.helpers import write_suite


def _status(path: Path) -> dict[str, dict[str, Any]]:
    done = ingest_cli("status", "-c", str(path), "--format", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    return {row["table"]: row for row in map(json.loads, done.stdout.splitlines()) if "table" in row}


@pytest.mark.spark
def test_a_stopped_table_is_found_fixed_and_caught_up_alone(tmp_path: Path) -> None:
    write_suite(tmp_path / "expectations", "small_qty", [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "qty", "min_value": 0, "max_value": 10}}])
    items = {"name": "items", "topic": "app.public.items", "expectations": "small_qty", "quality_policy": "fail"}
    raw = {"workdir": str(tmp_path / "work"), "source": {"value_format": "json"},
           "quality": {"expectations_dir": str(tmp_path / "expectations")},
           "spark": {"master": "local[1]", "shuffle_partitions": 1},
           "tables": [items, {"name": "notes", "topic": "app.public.notes"}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    for topic in ("app.public.items", "app.public.notes"):
        produce(config, topic, [("c", {"id": i, "qty": i}, 100 + i) for i in range(1, 5)])
    produce(config, "app.public.items", [("u", {"id": 2, "qty": 99}, 200), ("c", {"id": 5, "qty": 5}, 201)])
    produce(config, "app.public.notes", [("u", {"id": 2, "qty": 7}, 200)])

    # The run: items stops on its suite, notes goes on.
    stopped = ingest_cli("run", "-c", str(path))
    assert stopped.returncode == Exit.TABLE_FAILED, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    said = [line for line in stopped.stderr.splitlines() if "table items stopped:" in line]
    assert len(said) == 1 and "expect_column_values_to_be_between" in said[0], stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "table notes stopped" not in stopped.stderr, stopped.stderr[-3000:]

    # Step 1: which table, how far behind.
    status = _status(path)
    assert status["notes"]["lag"] == 0
    assert status["items"]["lag"] == 6 and status["items"]["delta_version"] is None  # nothing of the batch

    # Steps 2-3: the cause is the suite's policy; relax it for this table.
    items["quality_policy"] = "quarantine"
    path.write_text(yaml.safe_dump(raw))

    # Step 4: catch that table up alone.
    caught_up = ingest_cli("run", "-c", str(path), "--table", "items")
    assert caught_up.returncode == 0, caught_up.stdout[-3000:] + caught_up.stderr[-3000:]
    assert "notes" not in caught_up.stdout

    # Step 5: every table is current; key 2's changes of the batch (its insert and the bad update) wait
    # in quarantine together, to be replayed in order; notes applied nothing twice.
    status = _status(path)
    assert {name: s["lag"] for name, s in status.items()} == {"items": 0, "notes": 0}
    assert status["items"]["last_batch"]["quarantined"] == 2
    rows = {r["id"]: r["qty"] for r in read_all(open_table(config.table_path("items"))).to_pylist()}  # type: ignore[arg-type]
    assert rows == {1: 1, 3: 3, 4: 4, 5: 5}
    notes = read_all(open_table(config.table_path("notes"))).to_pylist()  # type: ignore[arg-type]
    assert {r["id"]: r["qty"] for r in notes} == {1: 1, 2: 7, 3: 3, 4: 4}
