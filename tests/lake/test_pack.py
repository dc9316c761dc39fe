"""Packing the small files of the tables the engine adds a file to with most batches."""

from __future__ import annotations

import json
import logging
import threading

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableOptimizer

from ingest.behind import maintenance_failures
from ingest.commit.remembered import RememberedDeletes, positions
from ingest.lake import side as side_module
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


# -- the remembered deletes, packed behind the batch that recorded them --------------------------------
def _deletes(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "_cdc_position": [f"{i:020d}" for i in ids],
                     "_cdc_source_ts": pa.array([0] * len(ids), pa.timestamp("ms", tz="UTC"))})


class _HeldPacking:
    """``pack_small_files`` that waits to be let go, and says when it has packed."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.started, self.released, self.fail = threading.Event(), threading.Event(), fail
        self.order: list[str] = []

    def __call__(self, table, **kwargs) -> int:
        self.started.set()
        assert self.released.wait(10), "the packing was never let go"
        if self.fail is not None:
            raise self.fail
        self.order.append("packed")
        return pack_small_files(table, **kwargs)


def test_a_record_returns_before_its_packing_and_the_next_record_waits_for_it(tmp_path, monkeypatch):
    packing = _HeldPacking()
    monkeypatch.setattr(side_module, "pack_small_files", packing)
    stones = RememberedDeletes(tmp_path / "stones", "t")
    stones.record(("id",), {"id": "long"}, _deletes(1))  # creates the table: nothing to pack
    stones.record(("id",), {"id": "long"}, _deletes(2), new_keys_only=True)
    assert packing.started.wait(5) and packing.order == []  # returned while its packing waits
    before = DeltaTable(str(tmp_path / "stones")).version()

    def third() -> None:
        stones.record(("id",), {"id": "long"}, _deletes(3), new_keys_only=True)
        packing.order.append("recorded")

    writer = threading.Thread(target=third)
    writer.start()
    writer.join(0.5)
    assert writer.is_alive() and DeltaTable(str(tmp_path / "stones")).version() == before  # it waits
    packing.released.set()
    writer.join(10)
    stones.settle()
    assert packing.order[:2] == ["packed", "recorded"]
    assert sorted(positions(tmp_path / "stones", ("id",), {"id": "long"}, "t")) == [(1,), (2,), (3,)]


def test_a_packing_that_fails_is_a_warning_and_the_deletes_are_kept(tmp_path, monkeypatch, caplog):
    packing = _HeldPacking(fail=OSError("the disk went away"))
    packing.released.set()
    monkeypatch.setattr(side_module, "pack_small_files", packing)
    stones = RememberedDeletes(tmp_path / "stones", "t")
    stones.record(("id",), {"id": "long"}, _deletes(1))
    counted = maintenance_failures()["pack"]
    with caplog.at_level(logging.WARNING, logger=side_module.__name__):
        stones.record(("id",), {"id": "long"}, _deletes(2), new_keys_only=True)
        stones.record(("id",), {"id": "long"}, _deletes(3), new_keys_only=True)  # not refused by the failure
        stones.settle()
    assert [r.getMessage() for r in caplog.records].count(
        "table t: its remembered deletes' small files were not packed (OSError: the disk went away); the next "
        "batch that writes them tries again") == 2
    assert maintenance_failures()["pack"] == counted + 2  # what --metrics-port shows
    assert sorted(positions(tmp_path / "stones", ("id",), {"id": "long"}, "t")) == [(1,), (2,), (3,)]
