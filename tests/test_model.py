"""The domain's own rules in ingest.model that no stage owns alone."""

from __future__ import annotations

from ingest.model import ends_before


def test_a_partition_ends_before_the_table_from_the_offset_it_applied_on() -> None:
    applied = {0: 9, 1: 9, 2: 9, 3: None}
    # next offsets: 9 (its last record at 8), 10 (at 9: exactly what was applied), 11, and never applied
    assert ends_before({0: 9, 1: 10, 2: 11, 3: 0}, applied.get) == {0: (9, 9)}
    assert ends_before({0: 0}, {0: 0}.get) == {0: (0, 0)}  # applied up to 0, now empty: recreated
    assert ends_before({0: 0}, {0: -1}.get) == {}  # nothing read yet (the reader's "next is 0")


def test_partitions_come_in_order_whatever_their_name() -> None:
    assert list(ends_before({"1": 0, "0": 0}, {"0": 5, "1": 5}.get)) == ["0", "1"]
    assert list(ends_before({2: 0, 1: 0}, {1: 5, 2: 5}.get)) == [1, 2]
