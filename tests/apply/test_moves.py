"""Primary-key moves keep the values the source kept (issue 43, point 1).

PostgreSQL sends an unchanged TOASTed column as a placeholder; when the update moves the row to a
new primary key, Debezium sends a delete of the old key (header ``__debezium.newkey``), a tombstone,
and a create of the new key (header ``__debezium.oldkey``) whose TOASTed column holds the
placeholder. The reference here is the source itself: every row's ``note`` is the text it was
inserted with (no change in the story writes ``note`` again), so after any cut into batches, with
any delete or history mode, the table must hold that text for every live key, and list nothing unknown.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ingest.config import TableSpec
from ingest.lake.delta import PACK_AFTER_FILES, open_table, read_all
from tests.harness import TS, Topic, ingest_batch, key, paths_in, pg

pytestmark = [pytest.mark.usefixtures("apply_engine"), pytest.mark.one_writer]

PLACEHOLDER = "__debezium_unavailable_value"
NOTE = {1: "first " * 700, 2: "second " * 700, 3: "third " * 600}


def move(topic: Topic, old: int, new: int, row: dict[str, Any], *, lsn: int, new_partition: int = 0,
         old_partition: int = 0, ts_ms: int = TS) -> None:
    """An update that moves ``old`` to ``new``, as Debezium sends it."""
    topic.send(key(old), pg("d", {"id": old, "v": None, "note": None}, lsn=lsn, ts_ms=ts_ms),
               partition=old_partition, headers=(("__debezium.newkey", json.dumps({"id": new}).encode()),))
    topic.send(key(old), None, partition=old_partition,
               headers=(("__debezium.newkey", json.dumps({"id": new}).encode()),))
    topic.send(key(new), pg("c", {"id": new, **row}, lsn=lsn, ts_ms=ts_ms), partition=new_partition,
               headers=(("__debezium.oldkey", json.dumps({"id": old}).encode()),))


def story(*, partitions: bool = False) -> tuple[Topic, dict[int, tuple[int, str]]]:
    """Three rows with TOASTed notes; moves with and without another column changing, a move in a
    batch right after the row's update, a chain of moves, updates of moved rows that leave the note
    unchanged, and a key that moves back to a key deleted before. Returns the live rows' ``(v, note)``."""
    t = Topic()
    p = (lambda n: n % 2) if partitions else (lambda n: 0)
    for i in (1, 2, 3):
        t.send(key(i), pg("c", {"id": i, "v": 0, "note": NOTE[i]}, lsn=10 * i), partition=p(i))
    t.send(key(1), pg("u", {"id": 1, "v": 1, "note": PLACEHOLDER}, lsn=40), partition=p(1))
    move(t, 1, 101, {"v": 1, "note": PLACEHOLDER}, lsn=50, old_partition=p(1), new_partition=p(101))
    move(t, 2, 102, {"v": 7, "note": PLACEHOLDER}, lsn=60, old_partition=p(2), new_partition=p(102))
    t.send(key(102), pg("u", {"id": 102, "v": 8, "note": PLACEHOLDER}, lsn=70), partition=p(102))
    move(t, 101, 201, {"v": 2, "note": PLACEHOLDER}, lsn=80, old_partition=p(101), new_partition=p(201))
    t.send(key(3), pg("d", {"id": 3, "v": None, "note": None}, lsn=90), partition=p(3))
    t.send(key(3), None, partition=p(3))
    move(t, 102, 3, {"v": 9, "note": PLACEHOLDER}, lsn=100, old_partition=p(102), new_partition=p(3))
    t.send(key(201), pg("u", {"id": 201, "v": 3, "note": PLACEHOLDER}, lsn=110), partition=p(201))
    return t, {201: (3, NOTE[1]), 3: (9, NOTE[2])}


def table_rows(paths: Any, spec: TableSpec) -> dict[int, dict[str, Any]]:
    rows = read_all(open_table(paths.table)).to_pylist()
    if spec.history_mode == "scd2":
        rows = [r for r in rows if r["_cdc_is_current"]]
    return {r["id"]: r for r in rows if not r["_cdc_deleted"]}


def run(tmp_path: Any, spec: TableSpec, topic: Topic, cuts: list[int]) -> Any:
    paths = paths_in(tmp_path / "-".join(map(str, cuts)))
    start = 0
    for batch_id, end in enumerate([*cuts, len(topic.messages)]):
        if end > start:
            ingest_batch(spec, paths, topic, topic.messages[start:end], batch_id=batch_id)
        start = end
    return paths


SPECS = {"hard": TableSpec(name="t", topic="t", primary_key=["id"]),
         "soft": TableSpec(name="t", topic="t", primary_key=["id"], delete_mode="soft"),
         "scd2": TableSpec(name="t", topic="t", primary_key=["id"], history_mode="scd2")}


@pytest.mark.parametrize("mode", sorted(SPECS))
def test_a_moved_row_keeps_its_unchanged_toasted_value_however_the_stream_is_cut(tmp_path: Any, mode: str) -> None:
    spec = SPECS[mode]
    topic, expected = story()
    n = len(topic.messages)
    for cuts in ([], [4], [6], [7], [9], [13], [5, 10, 16], list(range(1, n))):
        paths = run(tmp_path, spec, topic, cuts)
        rows = table_rows(paths, spec)
        assert {k: (r["v"], r["note"]) for k, r in rows.items()} == expected, f"cut at {cuts}"
        assert not any(r["_cdc_unknown_columns"] for r in rows.values()), f"cut at {cuts}"


def test_every_version_of_a_moved_key_holds_the_value(tmp_path: Any) -> None:
    spec = SPECS["scd2"]
    topic, _ = story()
    paths = run(tmp_path, spec, topic, [6, 13])
    versions = [r for r in read_all(open_table(paths.table)).to_pylist() if r["_cdc_op"] != "d"]
    moved = [r for r in versions if r["id"] in (101, 102, 201) or (r["id"] == 3 and r["v"] == 9)]
    assert len(moved) >= 5
    assert all(r["note"] in (NOTE[1], NOTE[2]) and not r["_cdc_unknown_columns"] for r in moved)


def test_a_replay_changes_nothing(tmp_path: Any) -> None:
    spec = SPECS["hard"]
    topic, expected = story()
    paths = run(tmp_path, spec, topic, [7])
    version = open_table(paths.table).version()
    result = ingest_batch(spec, paths, topic, topic.messages, batch_id=9)
    assert result.record is None or result.record.inserted + result.record.updated + result.record.deleted == 0
    assert open_table(paths.table).version() in (version, version + 1)
    assert {k: (r["v"], r["note"]) for k, r in table_rows(paths, spec).items()} == expected


def test_what_is_truly_unknown_stays_marked(tmp_path: Any) -> None:
    """A move whose old key the lake never saw (the stream starts after it) knows no note."""
    spec = SPECS["hard"]
    t = Topic()
    t.send(key(50), pg("c", {"id": 50, "v": 1, "note": PLACEHOLDER}, lsn=10),
           headers=(("__debezium.oldkey", json.dumps({"id": 5}).encode()),))
    paths = run(tmp_path, spec, t, [])
    row = table_rows(paths, spec)[50]
    assert row["note"] is None and row["_cdc_unknown_columns"] == ["note"]


def test_old_and_new_keys_on_different_partitions(tmp_path: Any) -> None:
    """Old and new keys on different partitions: whichever partition a batch reaches first, once the
    old key's delete has been seen the moved row holds the value; before, it is listed unknown."""
    spec = SPECS["hard"]
    topic, expected = story(partitions=True)
    # the new keys' partition first: each create meets a batch that has not seen its old key's delete
    by_partition = sorted(topic.messages, key=lambda m: (m.partition != 1, m.offset))
    lagging = Topic()
    lagging.messages = by_partition
    paths = run(tmp_path / "new-first", spec, lagging, [])
    rows = table_rows(paths, spec)
    assert {k: r["v"] for k, r in rows.items()} == {k: v for k, (v, _) in expected.items()}
    # in one batch every delete is seen, whatever the partitions' order
    assert {k: (r["v"], r["note"]) for k, r in rows.items()} == expected
    assert not any(r["_cdc_unknown_columns"] for r in rows.values())
    # a batch of the new key's partition alone cannot know the old row (102 -> 3 crosses partitions):
    # the value is listed unknown, and stays so when the delete comes later (a known limit)
    first = sum(1 for m in by_partition if m.partition == 1)
    paths = run(tmp_path / "apart", spec, lagging, [first])
    rows = table_rows(paths, spec)
    assert rows[201]["note"] == NOTE[1] and not rows[201]["_cdc_unknown_columns"]
    assert rows[3]["note"] is None and rows[3]["_cdc_unknown_columns"] == ["note"]
    # nor does it keep what the table stored for the new key before a delete of it in the batch
    deleted = next(i for i, m in enumerate(by_partition) if m.key == key(3) and m.offset > 1)  # key 3's delete
    paths = run(tmp_path / "reborn", spec, lagging, [deleted, first])
    row = table_rows(paths, spec)[3]
    assert row["note"] is None and row["_cdc_unknown_columns"] == ["note"]



def test_with_ignore_null_updates_an_omitted_value_of_a_moved_row_is_filled(tmp_path: Any) -> None:
    spec = TableSpec(name="t", topic="t", primary_key=["id"], ignore_null_updates=True)
    t = Topic()
    t.send(key(1), pg("c", {"id": 1, "v": 0, "note": NOTE[1]}, lsn=10))
    move(t, 1, 101, {"v": 5, "note": None}, lsn=20)
    for cuts in ([], [2]):
        rows = table_rows(run(tmp_path / f"cut{len(cuts)}", spec, t, cuts), spec)
        assert {k: (r["v"], r["note"]) for k, r in rows.items()} == {101: (5, NOTE[1])}, f"cut at {cuts}"


def test_hard_deletes_of_moves_keep_the_removed_rows_until_maintenance_forgets_them(tmp_path: Any,
                                                                                   monkeypatch: Any) -> None:
    from datetime import UTC, datetime, timedelta

    from ingest import crashpoints
    from ingest.apply.moves import purge_moves

    spec = SPECS["hard"]
    topic, expected = story()
    paths = paths_in(tmp_path)
    ingest_batch(spec, paths, topic, topic.messages[:6], batch_id=0)
    assert [r["old_key"] for r in read_all(open_table(paths.moves)).to_pylist()] == ["[1]"]

    def crash(name: str) -> None:
        if name == "after-quarantine":
            raise RuntimeError("killed before the commit")

    monkeypatch.setattr(crashpoints, "point", crash)
    with pytest.raises(RuntimeError):
        ingest_batch(spec, paths, topic, topic.messages[6:], batch_id=1)
    monkeypatch.undo()
    ingest_batch(spec, paths, topic, topic.messages[6:], batch_id=1)  # the replay records nothing twice
    recorded = sorted(r["old_key"] for r in read_all(open_table(paths.moves)).to_pylist())
    assert recorded == ["[101]", "[102]", "[1]", "[2]"]
    assert {k: (r["v"], r["note"]) for k, r in table_rows(paths, spec).items()} == expected
    assert purge_moves(paths.moves, datetime.now(UTC) - timedelta(days=1)) == 0
    assert purge_moves(paths.moves, datetime.now(UTC) + timedelta(seconds=1)) == 4


def test_the_moves_of_many_batches_stay_in_few_files(tmp_path: Any) -> None:
    """Each batch that moves a row in hard-delete mode adds a file to the moves table, which the
    next moves read: past :data:`~ingest.lake.delta.PACK_AFTER_FILES` they are packed, and the
    moved row still finds its value."""
    spec, topic, paths = SPECS["hard"], Topic(), paths_in(tmp_path)
    batches = PACK_AFTER_FILES + 3
    topic.send(key(1), pg("c", {"id": 1, "v": 0, "note": NOTE[1]}, lsn=10))
    ingest_batch(spec, paths, topic, topic.messages[:], batch_id=0)
    for i in range(1, batches + 1):  # batch i moves key i to key i + 1
        start = len(topic.messages)
        move(topic, i, i + 1, {"v": i, "note": PLACEHOLDER}, lsn=10 + 10 * i)
        ingest_batch(spec, paths, topic, topic.messages[start:], batch_id=i)
    moves = open_table(paths.moves)
    assert len(moves.file_uris()) <= PACK_AFTER_FILES < batches
    assert sorted(r["old_key"] for r in read_all(moves).to_pylist()) == sorted(f"[{i}]" for i in range(1, batches + 1))
    assert {k: (r["v"], r["note"]) for k, r in table_rows(paths, spec).items()} == {batches + 1: (batches, NOTE[1])}


def test_a_stream_keeps_the_moves_table_open_and_packs_it_behind_its_batches(tmp_path: Any, monkeypatch: Any) -> None:
    """Batches that share the stream's handles open the moves table once, bring it up to date after,
    and leave its packing to the background thread."""
    import threading

    from ingest.commit.state import OpenTables
    from ingest.lake import delta as delta_module
    from ingest.lake import side as side_module
    from ingest.lake.location import LakePath

    spec, topic, paths = SPECS["hard"], Topic(), paths_in(tmp_path)
    opened = OpenTables(paths, spec.name)
    moves_opened, packed_on = [], []
    real_open, real_pack = delta_module.open_table, side_module.pack_small_files

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if LakePath.of(path).uri == paths.moves.uri:
            moves_opened.append(path)
        return real_open(path, *args, **kwargs)

    def noting_pack(table: Any, **kwargs: Any) -> int:
        packed_on.append(threading.current_thread().name)
        return real_pack(table, **kwargs)

    monkeypatch.setattr(delta_module, "open_table", counting_open)
    monkeypatch.setattr(side_module, "pack_small_files", noting_pack)
    topic.send(key(1), pg("c", {"id": 1, "v": 0, "note": NOTE[1]}, lsn=10))
    ingest_batch(spec, paths, topic, topic.messages[:], batch_id=0, opened=opened)
    batches, opens = 5, []
    for i in range(1, batches + 1):  # batch i moves key i to key i + 1
        start = len(topic.messages)
        move(topic, i, i + 1, {"v": i, "note": PLACEHOLDER}, lsn=10 + 10 * i)
        ingest_batch(spec, paths, topic, topic.messages[start:], batch_id=i, opened=opened)
        opened.settle()
        opens.append(len(moves_opened))
    # The first batch with moves finds no table (twice) and creates it; the second opens it, and so
    # does the packing's own handle behind it. From then on both are brought up to date.
    assert opens[1] == opens[-1] <= 4
    assert packed_on and all(name.startswith("pack-side-tables") for name in packed_on)
    recorded = sorted(r["old_key"] for r in read_all(open_table(paths.moves)).to_pylist())
    assert recorded == [f"[{i}]" for i in range(1, batches + 1)]
    assert {k: (r["v"], r["note"]) for k, r in table_rows(paths, spec).items()} == {batches + 1: (batches, NOTE[1])}
