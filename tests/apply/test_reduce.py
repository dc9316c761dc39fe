"""Reduce on the columnar batch: latest change per key, duplicates, truncates, snapshot order, TOAST fills."""

import random

import pyarrow as pa
import pytest

from ingest.apply.batch import MicroBatch
from ingest.commit.state import TableState
from ingest.model import UNAVAILABLE, ChangeEvent
from ingest.rules.reduce import Reduction, reduce_changes
from tests.factories import change, decoded_rows

NOTHING_APPLIED = TableState(None, None, None, None)


def reduce_of(events: list[ChangeEvent], *, partitions: list[int] | None = None, soft: bool = False) -> Reduction:
    """Reduce ``events`` delivered in this order (offsets follow the order; a partition per event if given)."""
    parts = []
    for i, event in enumerate(events):
        parts += decoded_rows([event], partition=(partitions or [0] * len(events))[i], first_offset=i)
    batch = MicroBatch.from_parts(parts, NOTHING_APPLIED)
    return reduce_changes(batch.changes, ("id",), batch.columns, soft=soft)


def by_key(red: Reduction, column: str) -> dict[int, object]:
    return {row["id"]: row[column] for row in red.winners.to_pylist()}


def test_latest_change_per_key_wins_regardless_of_arrival_order():
    events = [change("u", 1, 30, name="c"), change("c", 1, 10, name="a"), change("u", 1, 20, name="b"),
              change("c", 2, 15, name="z")]
    red = reduce_of(events)
    assert by_key(red, "name") == {1: "c", 2: "z"}
    assert red.superseded == 2


def test_exact_duplicates_count_as_superseded_and_the_first_delivered_copy_wins():
    e = change("c", 1, 10)
    red = reduce_of([e, e], partitions=[1, 0])
    assert red.winners.num_rows == 1 and red.superseded == 1
    assert red.winners["_cdc_partition"].to_pylist() == [0]


def test_truncate_supersedes_older_changes_only():
    events = [change("c", 1, 10), change("t", 0, 20), change("c", 2, 30), change("t", 0, 5)]
    red = reduce_of(events)
    assert red.truncate is not None and red.truncate.position == events[1].position.encode()
    assert by_key(red, "name") == {2: "x"}
    assert red.truncates == 2 and red.superseded == 2  # the older truncate and key 1


def test_soft_mode_keeps_what_the_truncate_superseded_as_truncated_rows():
    events = [change("c", 1, 10, name="gone"), change("t", 0, 20), change("c", 2, 30)]
    red = reduce_of(events, soft=True)
    assert red.truncated is not None and red.truncated["id"].to_pylist() == [1]
    assert red.truncated["name"].to_pylist() == ["gone"]


def test_snapshot_read_orders_before_streamed_change_at_same_point():
    read = change("r", 1, 10, name="snap")
    upd = change("u", 1, 10, name="live")
    assert by_key(reduce_of([upd, read]), "name") == {1: "live"}


def test_toast_placeholder_filled_from_earlier_image_in_batch():
    first = change("c", 1, 10, notes="long text")
    second = change("u", 1, 20, name="y", notes=None, unavailable=frozenset({"notes"}))
    second.after["notes"] = UNAVAILABLE
    red = reduce_of([first, second])
    (winner,) = red.winners.to_pylist()
    assert winner["notes"] == "long text" and winner["_cdc_toast"] is None
    assert winner["_cdc_fill_0"] == first.position.encode()  # where the value came from, for the merge plan


def test_toast_not_filled_across_a_delete():
    first = change("c", 1, 10, notes="old life")
    gone = change("d", 1, 15)
    again = change("c", 1, 20, unavailable=frozenset({"notes"}))
    again.after["notes"] = UNAVAILABLE
    (winner,) = reduce_of([first, gone, again]).winners.to_pylist()
    assert winner["_cdc_toast"] == ["notes"] and winner["notes"] is None


def test_soft_mode_delete_takes_the_values_its_before_image_lacks():
    first = change("c", 1, 10, name="kept", notes="n")
    gone = change("d", 1, 15)
    gone.before = {"id": 1, "name": None, "balance": None, "notes": None}  # REPLICA IDENTITY DEFAULT: the key
    (winner,) = reduce_of([first, gone], soft=True).winners.to_pylist()
    assert winner["_cdc_op"] == "d" and winner["name"] == "kept" and winner["notes"] == "n"


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_winners_are_each_keys_last_change_after_the_last_truncate(seed, soft):
    """Random batches (reorders, exact duplicates on other partitions, deletes, truncates) against a
    plain reading of DESIGN 3.1: sort by position, the lowest Kafka coordinates last among copies;
    the last truncate cuts; each key's last change after it wins, with the values it was sent with.
    Hard mode takes the Arrow path, soft mode the window query: both must agree with the reading."""
    rng = random.Random(seed)
    events, partitions = [], []
    for _ in range(300):
        op = rng.choices(["c", "u", "d", "t"], [3, 6, 2, 0.1])[0]
        event = change(op, rng.randrange(40), rng.randrange(1, 200), name=f"n{rng.randrange(1000)}")
        copies = 2 if rng.random() < 0.1 else 1  # the same event delivered again, on another partition
        for _ in range(copies):
            events.append(event)
            partitions.append(rng.randrange(3))
    red = reduce_of(events, partitions=partitions, soft=soft)

    rows = [(e.position.encode(), -partitions[i], -i, e) for i, e in enumerate(events)]
    rows.sort(key=lambda r: r[:3])
    cut = max((n for n, r in enumerate(rows) if r[3].op == "t"), default=-1)
    expected = {e.key["id"]: r for r in rows[cut + 1:] if (e := r[3]).op != "t"}  # later rows overwrite
    got = red.winners.to_pylist()
    assert [r["id"] for r in got] == sorted(expected, key=lambda k: expected[k][:3])  # in batch order
    for row in got:
        position, neg_partition, neg_offset, e = expected[row["id"]]
        assert (row["_cdc_position"], row["_cdc_partition"], row["_cdc_offset"], row["_cdc_op"]) == \
            (position, -neg_partition, -neg_offset, e.op)
        if e.op != "d":
            assert row["name"] == e.after["name"] and row["_cdc_toast"] is None
    truncates = sum(1 for e in events if e.op == "t")
    assert red.truncates == truncates
    assert red.superseded == len(events) - truncates - len(expected) + max(truncates - 1, 0)


def test_both_paths_return_plain_string_types():
    """Parts that reach the driver as large strings (an Arrow hand-off may widen them) come out of
    either path as the plain types the merge plan and the quality gate compare with."""
    events = [change("c", 1, 10, name="a"), change("u", 1, 20, name="b"), change("c", 2, 15)]
    parts = decoded_rows(events)
    batch = MicroBatch.from_parts(parts, NOTHING_APPLIED)
    i = batch.changes.schema.get_field_index("name")
    wide = batch.changes.set_column(i, pa.field("name", pa.large_string()),
                                    batch.changes["name"].cast(pa.large_string()))
    for soft in (False, True):
        winners = reduce_changes(wide, ("id",), batch.columns, soft=soft).winners
        assert winners.schema.field("name").type == pa.string(), soft
        assert winners["name"].to_pylist() == ["x", "b"], soft
