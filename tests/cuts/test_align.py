"""Ending a group's tables at one transaction boundary: the boundary, and the tails left out."""

from __future__ import annotations

import pyarrow as pa

from ingest.cuts.align import Reach, boundary, newest_mark, tail_starts, trim
from ingest.cuts.calculus import Transaction
from ingest.model import SourceMark

T = [Transaction(f"{i}:9{i}", 0, i, None, counts) for i, counts in
     enumerate([{"public.a": 1, "public.b": 2}, {"public.a": 1}, {"public.a": 1, "public.b": 1}], start=1)]


def rows(*changes: tuple[int, str | None, int | None, str]) -> pa.Table:
    """``(offset, txn, order, position)`` rows of partition 0."""
    return pa.table({"_cdc_partition": pa.array([0] * len(changes), pa.int32()),
                     "_cdc_offset": pa.array([c[0] for c in changes], pa.int64()),
                     "_cdc_txn": pa.array([c[1] for c in changes], pa.string()),
                     "_cdc_txn_order": pa.array([c[2] for c in changes], pa.int64()),
                     "_cdc_position": pa.array([c[3] for c in changes], pa.string())})


def test_the_boundary_is_the_newest_every_table_has_whole():
    a = rows((0, "1", 1, "p1"), (1, "2", 1, "p2"), (2, "3", 1, "p3"))
    b = rows((0, "1", 1, "p1"), (1, "1", 2, "p1b"), (2, "3", 1, "p3"))
    reaches = {"a": Reach("public.a", SourceMark(), newest_mark(a, SourceMark())),
               "b": Reach("public.b", SourceMark(), newest_mark(b, SourceMark()))}
    assert boundary(T, reaches) == 3
    # b has only the first of transaction 1's changes: nothing can be applied beyond boundary 0
    half = rows((0, "1", 1, "p1"))
    reaches["b"] = Reach("public.b", SourceMark(), newest_mark(half, SourceMark()))
    assert boundary(T, reaches) == 0
    assert tail_starts(a, SourceMark(), T, 0) == {0: 0} and tail_starts(half, SourceMark(), T, 0) == {0: 0}


def test_a_tail_starts_at_the_first_change_after_the_boundary_or_without_its_end_record():
    a = rows((5, None, None, "r"), (6, "1", 1, "p1"), (7, "2", 1, "p2"), (8, "3", 1, "p3"), (9, "4", 1, "p4"))
    assert tail_starts(a, SourceMark(), T, 2) == {0: 8}
    assert tail_starts(a, SourceMark(), T, 3) == {0: 9}  # transaction 4 has no END record yet
    # changes the table already holds (a connector's redelivery) are never a tail
    held = SourceMark("3", 1, "p3", "closed")
    assert tail_starts(rows((3, "2", 1, "p2")), held, T, 1) == {}


def test_trim_leaves_out_each_partitions_rows_from_its_tail_on():
    part = pa.RecordBatch.from_pydict({"_cdc_partition": pa.array([0, 0, 1, 1], pa.int32()),
                                       "_cdc_offset": pa.array([4, 5, 4, 5], pa.int64())})
    kept, left_out = trim([part], {0: 5})
    assert left_out == 1 and kept[0].to_pydict() == {"_cdc_partition": [0, 1, 1], "_cdc_offset": [4, 4, 5]}
