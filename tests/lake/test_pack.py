"""Packing the small files of the tables the engine adds a file to with most batches."""

from __future__ import annotations

import json

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableOptimizer

from ingest.lake.delta import MAINTENANCE_KEY, PACK_AFTER_FILES, pack_small_files, read_all


def _appended(path, count: int, *, first: int = 0, width: int = 1) -> DeltaTable:
    """A table of ``count`` appended files, ``width`` rows each, ids from ``first``."""
    for i in range(count):
        ids = list(range(first + i * width, first + (i + 1) * width))
        write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{n}" for n in ids]}),
                        mode="append")
    return DeltaTable(str(path))


def _ids(table: DeltaTable) -> list[int]:
    return sorted(read_all(table)["id"].to_pylist())


def _sizes(table: DeltaTable) -> list[int]:
    return pa.table(table.get_add_actions(flatten=True))["size_bytes"].to_pylist()


def test_up_to_the_bound_small_files_are_left_alone(tmp_path):
    table = _appended(tmp_path / "t", PACK_AFTER_FILES)
    version = table.version()
    assert pack_small_files(table) == 0
    assert table.version() == version and len(_sizes(table)) == PACK_AFTER_FILES


def test_past_the_bound_the_small_files_become_one_and_keep_their_rows(tmp_path):
    table = _appended(tmp_path / "t", PACK_AFTER_FILES + 1)
    assert pack_small_files(table) == PACK_AFTER_FILES + 1
    assert len(_sizes(table)) == 1
    assert _ids(table) == list(range(PACK_AFTER_FILES + 1))
    # a layout commit, which the engine's progress readers pass over
    newest = table.history(1)[0]
    assert newest.get(MAINTENANCE_KEY) == "pack" or json.loads(newest.get("userMetadata", "{}")).get(
        MAINTENANCE_KEY) == "pack"


def test_files_of_half_a_tier_or_more_do_not_count_toward_it(tmp_path, monkeypatch):
    table = _appended(tmp_path / "t", 5, width=200)
    size = min(_sizes(table))
    # each file is at least half the tier: no two of them fit one file of it, so none is small for
    # it and no compaction is even planned (which would cost every batch a look at the table)
    planned = []
    compact = TableOptimizer.compact
    monkeypatch.setattr(TableOptimizer, "compact", lambda self, **kw: planned.append(kw) or compact(self, **kw))
    assert pack_small_files(table, after=2, tiers=(2 * size,)) == 0
    assert planned == [] and len(_sizes(table)) == 5
    # two bytes more and they are all small for it: two packs of two (a fifth file alone is not rewritten)
    assert pack_small_files(table, after=2, tiers=(2 * max(_sizes(table)) + 2,)) == 4
    assert len(_sizes(table)) == 3 and _ids(table) == list(range(1000))


def test_each_tier_packs_what_the_tier_below_it_packed(tmp_path):
    table = _appended(tmp_path / "t", 9)
    one = max(_sizes(table))
    # tier one packs three files at a time; tier two packs those packs once more than two exist
    tiers = (3 * one + 1, 1 << 30)
    assert pack_small_files(table, after=2, tiers=tiers) == 9 + 3
    assert len(_sizes(table)) == 1 and _ids(table) == list(range(9))
