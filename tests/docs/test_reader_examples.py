"""The reader examples docs/reading.md quotes (scripts/reader_examples.py) run: every reader but
Spark's, on a small table with the framework's columns, two versions and its change feed."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import reader_examples as rx


def test_each_reader_gives_the_live_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "customers")
    rows = pa.table({
        "id": [1, 2, 3, 4],
        "_cdc_op": ["c", "u", "d", "c"],
        "_cdc_deleted": [False, False, True, None],
        "_cdc_valid_from": [datetime(2026, 1, 1), datetime(2026, 1, 2), datetime(2026, 1, 3), datetime(2026, 1, 6)],
        "_cdc_valid_to": [datetime(2026, 1, 5), None, datetime(2026, 1, 4), None],
    })
    write_deltalake(path, rows, configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(path, rows.slice(0, 1), mode="append")  # version 1: a second row of key 1
    assert rx.live_rows_deltalake(path).num_rows == 4
    assert rx.live_rows_polars(path).height == 4
    assert rx.live_rows_duckdb(path).to_pylist() == [{"n": 4}]
    assert rx.as_of_version(path, 0).height == 3
    assert sorted(rx.scd2_as_of(path, datetime(2026, 1, 4, 12)).get_column("id").to_list()) == [1, 1, 2]
    assert rx.changes_deltalake(path, 1).num_rows == 1
