from ingest.events import UNAVAILABLE
from ingest.reduce import reduce_changes
from tests.factories import change, positioned


def test_latest_change_per_key_wins_regardless_of_arrival_order():
    events = [change("u", 1, 30, name="c"), change("c", 1, 10, name="a"), change("u", 1, 20, name="b"),
              change("c", 2, 15, name="z")]
    red = reduce_changes([positioned(e, i) for i, e in enumerate(events)], ("id",))
    assert {w.event.key["id"]: w.event.after["name"] for w in red.winners} == {1: "c", 2: "z"}
    assert red.superseded == 2


def test_exact_duplicates_count_as_superseded():
    e = change("c", 1, 10)
    red = reduce_changes([positioned(e, 0), positioned(e, 1, partition=1)], ("id",))
    assert len(red.winners) == 1 and red.superseded == 1


def test_truncate_supersedes_older_changes_only():
    events = [change("c", 1, 10), change("t", 0, 20), change("c", 2, 30), change("t", 0, 5)]
    red = reduce_changes([positioned(e, i) for i, e in enumerate(events)], ("id",))
    assert red.truncate is not None and red.truncate.event.position.a == 20
    assert [w.event.key["id"] for w in red.winners] == [2]
    assert red.truncates == 2 and red.superseded == 2  # the older truncate and key 1


def test_snapshot_read_orders_before_streamed_change_at_same_point():
    read = change("r", 1, 10, name="snap")
    upd = change("u", 1, 10, name="live")
    red = reduce_changes([positioned(upd, 0), positioned(read, 1)], ("id",))
    assert red.winners[0].event.after["name"] == "live"


def test_toast_placeholder_filled_from_earlier_image_in_batch():
    first = change("c", 1, 10, notes="long text")
    second = change("u", 1, 20, name="y", notes=None, unavailable=frozenset({"notes"}))
    second.after["notes"] = UNAVAILABLE
    red = reduce_changes([positioned(first, 0), positioned(second, 1)], ("id",))
    (winner,) = red.winners
    assert winner.event.after["notes"] == "long text" and not winner.event.unavailable


def test_toast_not_filled_across_a_delete():
    first = change("c", 1, 10, notes="old life")
    gone = change("d", 1, 15)
    again = change("c", 1, 20, unavailable=frozenset({"notes"}))
    again.after["notes"] = UNAVAILABLE
    red = reduce_changes([positioned(e, i) for i, e in enumerate([first, gone, again])], ("id",))
    assert red.winners[0].event.unavailable == frozenset({"notes"})
