"""delta-spark reads a large table's stored rows on Spark's executors (``spark_rows_of_keys``): the
driver then receives the rows found, not every row of the keys' range. It must give exactly what
the driver's read gives -- the same rows, columns and types -- on a table with deletion vectors,
for composite keys, with keys the table does not hold, for every column (scd2), and for the
remembered deletes of hard mode.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from ingest.apply.journey import apply_parts
from ingest.apply.stored import stored_rows
from ingest.commit import delta_spark
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.commit.remembered import RememberedDeletes
from ingest.config import TableSpec
from ingest.lake.delta import has_deletion_vectors, open_table
from ingest.lake.location import LakePath
from ingest.lake.lookup import rows_of_keys
from ingest.model import ChangeEvent, ColumnSpec
from ingest.rules.plan import STORED_SCHEMA, UNKNOWN_COLUMNS
from ingest.spark.reads import spark_rows_of_keys
from tests.factories import decoded_rows, pos
from tests.harness import paths_in

pytestmark = pytest.mark.spark
COLUMNS = (ColumnSpec("region", "string", False), ColumnSpec("id", "long", False), ColumnSpec("name", "string", True),
           ColumnSpec("amount", "decimal(10,2)", True))


def _change(op: str, region: str, key: int, at: int, name: str = "x") -> ChangeEvent:
    row = {"region": region, "id": key, "name": name, "amount": None}
    return ChangeEvent(op, {"region": region, "id": key}, None if op == "d" else row,
                       row if op in ("u", "d") else None, pos(at), COLUMNS, ("region", "id"),
                       source_ts_ms=1_700_000_000_000 + at)


def _table(tmp_path: Any, spark: Any) -> tuple[Any, Any]:
    """A delta-spark table of 40 keys, some updated and deleted by MERGEs (so it has deletion vectors)."""
    spec = TableSpec(name="t", topic="t", delete_mode="soft")
    paths = paths_in(tmp_path)
    engine = DeltaSparkWriter(spark)
    batches = [[_change("c", r, k, k + 100 * (r == "eu")) for r in ("eu", "us") for k in range(20)],
               [_change("u", "eu", k, 1000 + k, "later") for k in range(0, 20, 3)]
               + [_change("d", "us", k, 2000 + k) for k in range(0, 20, 4)]]
    for i, items in enumerate(batches):
        record = apply_parts(spec, paths, decoded_rows(items, first_offset=100 * i), batch_id=i, run_id="test",
                             writer=engine).record
        assert record is not None and record.balanced
    table = open_table(paths.table)
    assert table is not None and has_deletion_vectors(table)
    assert table.history(1)[0]["operationMetrics"]["numTargetDeletionVectorsAdded"] != "0"
    return paths, table


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["region"], r["id"], r.get("_cdc_position") or ""))


def test_the_executors_read_the_stored_rows_the_driver_reads(tmp_path, spark):
    paths, table = _table(tmp_path, spark)
    # held, updated, deleted (soft: still stored) and absent keys; a key of the other region
    keys = pa.table({"region": ["eu", "eu", "us", "us", "eu", "nowhere"], "id": pa.array([0, 1, 4, 5, 99, 0],
                                                                                          pa.int64())})
    key_columns = ("region", "id")
    wanted = [*key_columns, "_cdc_position", "_cdc_partition", "_cdc_offset", "_cdc_deleted", UNKNOWN_COLUMNS]
    for columns in (wanted, None):  # the plan's columns; every column (scd2's stored versions)
        driver = rows_of_keys(table, key_columns, keys, columns)
        executors = spark_rows_of_keys(spark, paths.table, table, key_columns, keys, columns)
        assert executors.schema == driver.schema
        assert _sorted(executors) == _sorted(driver)
        assert len(driver) == 4  # the four held keys, and nothing else
    found = {(r["region"], r["id"]): r["_cdc_deleted"] for r in _sorted(rows_of_keys(table, key_columns, keys))}
    assert found == {("eu", 0): False, ("eu", 1): False, ("us", 4): True, ("us", 5): False}


def test_a_large_range_is_read_on_the_executors_and_a_small_one_on_the_driver(tmp_path, spark, monkeypatch):
    """The engine's lookup picks by the rows the keys' range reaches (``target.driver_lookup_rows``)."""
    paths, table = _table(tmp_path, spark)
    keys = pa.table({"region": ["eu", "us"], "id": pa.array([3, 8], pa.int64())})
    calls: list[str] = []
    monkeypatch.setattr(delta_spark, "rows_of_keys", lambda *a: calls.append("driver") or rows_of_keys(*a))
    monkeypatch.setattr(delta_spark, "spark_rows_of_keys",
                        lambda *a: calls.append("executors") or spark_rows_of_keys(*a))
    engine = DeltaSparkWriter(spark)
    assert engine.driver_lookup_rows == 1_000_000  # the default: the driver reads a small table
    lookup = engine.lookup(paths.table)
    small = stored_rows(table, ("region", "id"), keys, lookup=lookup)
    engine.driver_lookup_rows = 39  # the range reaches all 40 stored rows
    large = stored_rows(table, ("region", "id"), keys, lookup=lookup)
    assert calls == ["driver", "executors"]
    assert small.column_names == ["region", "id", *(name for name, _ in STORED_SCHEMA)]
    assert _sorted(large) == _sorted(small) and len(small) == 2


def test_the_remembered_deletes_of_a_batch_are_read_alike_on_the_executors(tmp_path, spark, monkeypatch):
    """Hard mode: the plan reads the deletes remembered for the batch's keys through the same lookup."""
    spec = TableSpec(name="t", topic="t", delete_mode="hard")
    paths = paths_in(tmp_path)
    engine = DeltaSparkWriter(spark)
    batches = [[_change("c", "eu", k, k) for k in range(10)],
               [_change("d", "eu", k, 100 + k) for k in range(0, 10, 2)]]
    for i, items in enumerate(batches):
        apply_parts(spec, paths, decoded_rows(items, first_offset=100 * i), batch_id=i, run_id="test", writer=engine)
    remembered = RememberedDeletes(paths.tombstones, "t")
    key_columns, key_types = ("region", "id"), {"region": "string", "id": "long"}
    keys = pa.table({"region": ["eu", "eu", "eu", "us"], "id": pa.array([2, 3, 4, 2], pa.int64())})
    lookup = engine.lookup(LakePath.of(paths.tombstones))
    driver = remembered.read(key_columns, key_types, keys, lookup=lookup)
    engine.driver_lookup_rows = 0
    monkeypatch.setattr(delta_spark, "rows_of_keys", None)  # the driver's read is not called again
    executors = remembered.read(key_columns, key_types, keys, lookup=lookup)
    assert driver is not None and executors is not None and executors.schema == driver.schema
    assert sorted(executors.to_pylist(), key=str) == sorted(driver.to_pylist(), key=str)
    assert {(r["region"], r["id"]) for r in driver.to_pylist()} == {("eu", 2), ("eu", 4)}  # deleted, asked for
