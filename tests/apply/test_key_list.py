"""delta-spark's MERGE lists the batch's keys in its condition (``t.key IN (...)``): Spark must read
the list for every key type it writes, and the MERGE must do exactly what it does without it.

The statement's text is pinned in ``test_merge_sql``; here the list meets a real Spark session, with
typed integer literals (``7Y``, ``7S``, ``7``, ``7L``) and quoted strings, and delta-rs (which lists
nothing) writes the reference table from the same batches.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from ingest.apply.journey import apply_parts
from ingest.commit import spark_merge
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.commit.merge_sql import key_list
from ingest.commit.spark_merge import dialect_for
from ingest.commit.writer import ArrowRows
from ingest.config import TableSpec
from ingest.lake.delta import open_table, read_all, write_table
from ingest.model import ChangeEvent, ColumnSpec
from tests.factories import decoded_rows, pos
from tests.harness import paths_in

pytestmark = pytest.mark.spark
SPEC = TableSpec(name="t", topic="t")
KEYS = {"byte": [1, 5, -3], "short": [300, -2, 7], "integer": [70_000, 1, 2], "long": [2**40, 3, 4],
        "string": ["it's", "back\\slash", "plain"]}


def _change(op: str, key: Any, at: int, key_type: str, name: str) -> ChangeEvent:
    columns = (ColumnSpec("k", key_type, False), ColumnSpec("name", "string", True))
    row = {"k": key, "name": name}
    return ChangeEvent(op, {"k": key}, None if op == "d" else row, row if op in ("u", "d") else None,
                       pos(at), columns, ("k",), source_ts_ms=1_700_000_000_000 + at)


def _rows(paths: Any) -> list[dict[str, Any]]:
    table = read_all(open_table(paths.table)).select(["k", "name", "_cdc_op", "_cdc_position"])
    return sorted(table.to_pylist(), key=lambda r: str(r["k"]))


@pytest.mark.parametrize("key_type", list(KEYS))
def test_a_merge_with_listed_keys_of_each_type_writes_what_delta_rs_writes(tmp_path, spark, key_type,
                                                                            monkeypatch):
    a, b, c = KEYS[key_type]
    batches = [[_change("c", a, 1, key_type, "a"), _change("c", b, 2, key_type, "b")],
               # a stored key updated, another deleted, a new one inserted: the listed MERGE, not the append
               [_change("u", a, 3, key_type, "a2"), _change("d", b, 4, key_type, "b"),
                _change("c", c, 5, key_type, "c")]]
    monkeypatch.setattr(spark_merge, "ROWS_PER_LISTED_KEY", 0)  # list the keys however small the table
    tables = {}
    for name, engine in (("ds", DeltaSparkWriter(spark)), ("rs", DeltaRsWriter())):
        paths = paths_in(tmp_path / name)
        for i, items in enumerate(batches):
            record = apply_parts(SPEC, paths, decoded_rows(items, first_offset=10 * i), batch_id=i, run_id="test",
                                 writer=engine).record
            assert record is not None and record.balanced
        tables[name] = paths
    merge = open_table(tables["ds"].table).history(1)[0]
    assert merge["operation"] == "MERGE"
    assert " IN (" in merge["operationParameters"]["predicate"]  # the keys were listed
    assert _rows(tables["ds"]) == _rows(tables["rs"])
    assert {r["k"]: r["name"] for r in _rows(tables["ds"])} == {a: "a2", c: "c"}


def test_the_keys_are_listed_only_where_the_rows_they_keep_out_of_the_join_repay_them(tmp_path, monkeypatch):
    """No Spark needed: the choice reads the table's file statistics (delta-rs)."""
    path = tmp_path / "t"
    for first in range(0, 40_000, 10_000):  # four files of 10,000 keys each
        write_table(path, pa.table({"k": pa.array(range(first, first + 10_000), pa.int64())}), mode="append")
    table = open_table(path)

    def listed(keys: list[int]) -> bool:
        return dialect_for(table, ArrowRows(pa.table({"k": pa.array(keys, pa.int64())})), ("k",)).key_list_limit > 0

    assert listed(list(range(0, 40_000, 1_000)))  # 40 keys spread over all 40,000 rows: 1,000 rows a key
    assert not listed(list(range(0, 40_000, 50)))  # 800 keys over 40,000 rows: 50 rows a key
    assert listed(list(range(30_000, 30_100)))  # 100 keys in one file of 10,000 rows: 100 a key, the bar
    assert not listed(list(range(30_000, 30_101)))  # one key more: below it
    # no table yet: nothing to keep out
    assert not dialect_for(None, ArrowRows(pa.table({"k": [1]})), ("k",)).key_list_limit

    # However many rows each key would keep out, a batch of more keys than the limit lists none.
    monkeypatch.setattr(spark_merge, "ROWS_PER_LISTED_KEY", 0)
    for keys, lists in ((spark_merge.KEY_LIST_LIMIT, True), (spark_merge.KEY_LIST_LIMIT + 1, False)):
        batch = pa.table({"k": pa.array(range(keys), pa.int64())})
        assert (key_list(batch, "k", dialect_for(table, ArrowRows(batch), ("k",))) is not None) is lists


def test_an_scd2_merge_with_listed_keys_keeps_the_versions_delta_rs_keeps(tmp_path, spark, monkeypatch):
    spec = SPEC.model_copy(update={"history_mode": "scd2"})
    batches = [[_change("c", 1, 1, "long", "a"), _change("c", 2, 2, "long", "b")],
               [_change("u", 1, 3, "long", "a2"), _change("d", 2, 4, "long", "b"), _change("c", 3, 5, "long", "c")]]
    monkeypatch.setattr(spark_merge, "ROWS_PER_LISTED_KEY", 0)
    versions = {}
    for name, engine in (("ds", DeltaSparkWriter(spark)), ("rs", DeltaRsWriter())):
        paths = paths_in(tmp_path / name)
        for i, items in enumerate(batches):
            apply_parts(spec, paths, decoded_rows(items, first_offset=10 * i), batch_id=i, run_id="test",
                        writer=engine)
        rows = read_all(open_table(paths.table)).select(["k", "name", "_cdc_position", "_cdc_is_current",
                                                         "_cdc_deleted"]).to_pylist()
        versions[name] = sorted(rows, key=lambda r: (r["k"], r["_cdc_position"]))
        if name == "ds":
            assert " IN (" in open_table(paths.table).history(1)[0]["operationParameters"]["predicate"]
    assert versions["ds"] == versions["rs"]
    assert [(r["k"], r["name"], r["_cdc_is_current"]) for r in versions["ds"]] == [
        (1, "a", False), (1, "a2", True), (2, "b", False), (3, "c", True)]
