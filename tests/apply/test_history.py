"""``history_mode: scd2``: every version kept, whatever the delivery (issue 12, point 1).

The reference here is a plain fold of the source's changes in source order, written without the
engine's SQL: each key's versions with their validity. Messages go through the engine's own decode
and apply (tests/harness.py), late, duplicated and cut into batches at random. The random
deliveries run on delta-rs; ``tests/apply/test_writers_agree.py`` shows delta-spark's history MERGE
leaves the same versions.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from ingest.config import ColumnSelection, TableSpec
from ingest.errors import TableError
from ingest.lake.delta import open_table, read_all
from ingest.records import audit
from tests.harness import TS, Topic, history_problems, ingest_batch, key, paths_in, pg, rows

pytestmark = pytest.mark.usefixtures("apply_engine")

SCD2 = TableSpec(name="t", topic="t", history_mode="scd2")


def at(lsn: int) -> datetime:
    """The source commit time of the change at ``lsn`` (one second per lsn)."""
    return datetime.fromtimestamp((TS + lsn * 1000) / 1000, UTC)


def reference(events: list[tuple[int, str, int | None, Any]], tracked: bool = True) -> tuple[list[tuple], int]:
    """Each key's versions ``(id, v, w, valid_from, valid_to, is_current)`` from the changes in source
    order, and how many deletes found nothing to end. ``tracked``: a change of ``w`` opens a version."""
    current: dict[int, dict[str, Any]] = {}
    versions, orphans = [], 0

    def end(version: dict[str, Any], lsn: int) -> None:
        version["to"], version["current"] = at(lsn), False
        versions.append(version)

    for lsn, op, id_, row in sorted({e[0]: e for e in events}.values()):
        if op == "t":
            for version in current.values():
                end(version, lsn)
            current.clear()
        elif op == "d":
            if id_ in current:
                end(current.pop(id_), lsn)
            else:
                orphans += 1
        else:
            open_ = current.get(id_)
            if open_ is not None and open_["v"] == row["v"] and (not tracked or open_["w"] == row["w"]):
                open_["w"] = row["w"]
                continue
            if open_ is not None:
                end(open_, lsn)
            current[id_] = {"id": id_, "v": row["v"], "w": row["w"], "from": at(lsn), "to": None, "current": True}
    versions.extend(current.values())
    return sorted((x["id"], x["v"], x["w"], x["from"], x["to"], x["current"]) for x in versions), orphans


def stored_versions(paths) -> tuple[list[tuple], int]:
    """The table's versions as :func:`reference` gives them, and its delete markers."""
    table = read_all(open_table(paths.table)).to_pylist()
    versions = sorted((r["id"], r["v"], r["w"], r["_cdc_valid_from"], r["_cdc_valid_to"], r["_cdc_is_current"])
                      for r in table if r["_cdc_op"] != "d")
    return versions, sum(1 for r in table if r["_cdc_op"] == "d")


def story(rng: random.Random, keys: int, n: int) -> list[tuple[int, str, int | None, Any]]:
    """A source's changes: each update gives ``v`` a new value, ``w`` one of two; some truncates."""
    live: set[int] = set()
    out = []
    for i in range(n):
        lsn = 10 * (i + 1)
        if rng.random() < 0.06:
            out.append((lsn, "t", None, None))
            live.clear()
            continue
        id_ = rng.randrange(keys)
        # A delete of a key that is not live ends nothing: a marker stays.
        op = rng.choice(["u", "u", "u", "d"]) if id_ in live else "d" if rng.random() < 0.1 else "c"
        if op == "d":
            live.discard(id_)
            out.append((lsn, "d", id_, {"id": id_}))
        else:
            live.add(id_)
            out.append((lsn, op, id_, {"id": id_, "v": f"v{lsn}", "w": rng.choice(["x", "y"])}))
    return out


def deliver(rng: random.Random, topic: Topic, events: list[tuple[int, str, int | None, Any]]) -> list:
    """The changes as Kafka would hold them after a bad day: some late, some twice; truncates in order."""
    order = sorted(events, key=lambda e: e[0] + (rng.choice([0, 0, 0, 45, 120]) if e[1] != "t" else 0))
    order += rng.sample(events, k=len(events) // 6)  # redelivered copies
    messages = []
    for lsn, op, id_, row in order:
        payload = pg(op, row if op != "d" else None, before=row if op == "d" else None, lsn=lsn,
                     ts_ms=TS + lsn * 1000)
        messages.append(topic.send(key(id_) if id_ is not None else None, payload))
    return messages


@pytest.mark.one_writer
@pytest.mark.parametrize("seed", range(6))
def test_versions_match_the_source_history_whatever_the_delivery(tmp_path, seed):
    rng = random.Random(seed)
    paths, topic = paths_in(tmp_path), Topic()
    events = story(rng, keys=4, n=40)
    messages = deliver(rng, topic, events)
    cuts = sorted(rng.sample(range(1, len(messages)), k=5))
    records = []
    for batch_id, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(messages)], strict=True)):
        records.append(ingest_batch(SCD2, paths, topic, messages[start:end], batch_id=batch_id).record)
    # A replay of the last batch (a lost checkpoint) changes nothing.
    version = open_table(paths.table).version()
    assert ingest_batch(SCD2, paths, topic, messages[cuts[-1]:], batch_id=99).record is None
    assert open_table(paths.table).version() == version

    want, orphans = reference(events)
    got, markers = stored_versions(paths)
    assert got == want
    assert markers == orphans  # a delete that ends nothing is kept, as a zero-length marker
    # Readers of live rows (NOT _cdc_deleted) see exactly the current versions.
    assert sorted((i, r["v"], r["w"]) for i, r in rows(paths).items()) == sorted(
        (v[0], v[1], v[2]) for v in want if v[5])
    assert all(r is not None and r.balanced for r in records)
    assert sum(r.received for r in records) == len(messages)
    assert not history_problems(open_table(paths.table), ["id"])


@pytest.mark.one_writer
def test_a_late_change_lands_between_its_neighbours(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    first = [topic.send(key(1), pg("c", {"id": 1, "v": "a", "w": "x"}, lsn=10, ts_ms=TS + 10_000)),
             topic.send(key(1), pg("u", {"id": 1, "v": "c", "w": "x"}, lsn=30, ts_ms=TS + 30_000))]
    ingest_batch(SCD2, paths, topic, first, batch_id=0)
    late = topic.send(key(1), pg("u", {"id": 1, "v": "b", "w": "x"}, lsn=20, ts_ms=TS + 20_000))
    record = ingest_batch(SCD2, paths, topic, [late], batch_id=1).record
    got, _ = stored_versions(paths)
    assert got == [(1, "a", "x", at(10), at(20), False), (1, "b", "x", at(20), at(30), False),
                   (1, "c", "x", at(30), None, True)]
    assert (record.inserted, record.updated, record.stale) == (1, 0, 0) and record.balanced


@pytest.mark.one_writer
def test_untracked_columns_update_the_current_version_in_place(tmp_path):
    spec = SCD2.model_copy(update={"track_history": ColumnSelection(include=("v",))})
    paths, topic = paths_in(tmp_path), Topic()
    events = [(10, "c", 1, {"id": 1, "v": "a", "w": "x"}), (20, "u", 1, {"id": 1, "v": "a", "w": "y"}),
              (30, "u", 1, {"id": 1, "v": "b", "w": "y"}), (40, "u", 1, {"id": 1, "v": "b", "w": "z"})]
    messages = [topic.send(key(1), pg(op, row, lsn=lsn, ts_ms=TS + lsn * 1000)) for lsn, op, _, row in events]
    records = [ingest_batch(spec, paths, topic, [m], batch_id=i).record for i, m in enumerate(messages)]
    got, _ = stored_versions(paths)
    assert got == reference(events, tracked=False)[0] == [(1, "a", "y", at(10), at(30), False),
                                                          (1, "b", "z", at(30), None, True)]
    assert [(r.inserted, r.updated) for r in records] == [(1, 0), (0, 1), (1, 0), (0, 1)]


@pytest.mark.one_writer
def test_an_unchanged_toast_column_takes_the_previous_versions_value(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    placeholder = "__debezium_unavailable_value"
    ingest_batch(SCD2, paths, topic, [topic.send(key(1), pg("c", {"id": 1, "v": "a", "w": "long"}, lsn=10))])
    ingest_batch(SCD2, paths, topic, [topic.send(key(1), pg("u", {"id": 1, "v": "b", "w": placeholder}, lsn=20)),
                                      topic.send(key(2), pg("u", {"id": 2, "v": "n", "w": placeholder}, lsn=21))],
                 batch_id=1)
    table = {(r["id"], r["v"]): r for r in read_all(open_table(paths.table)).to_pylist()}
    assert table[(1, "b")]["w"] == "long" and table[(1, "b")]["_cdc_unknown_columns"] is None
    assert table[(2, "n")]["w"] is None and table[(2, "n")]["_cdc_unknown_columns"] == ["w"]


@pytest.mark.one_writer
def test_truncate_ends_every_current_version_touched_or_not(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    ingest_batch(SCD2, paths, topic, [topic.send(key(i), pg("c", {"id": i, "v": "a", "w": "x"}, lsn=10 + i,
                                                            ts_ms=TS + (10 + i) * 1000)) for i in range(3)])
    batch = [topic.send(key(0), pg("u", {"id": 0, "v": "b", "w": "x"}, lsn=20, ts_ms=TS + 20_000)),
             topic.send(None, pg("t", None, lsn=30, ts_ms=TS + 30_000)),
             topic.send(key(1), pg("u", {"id": 1, "v": "c", "w": "x"}, lsn=40, ts_ms=TS + 40_000))]
    record = ingest_batch(SCD2, paths, topic, batch, batch_id=1).record
    got, _ = stored_versions(paths)
    assert got == [(0, "a", "x", at(10), at(20), False), (0, "b", "x", at(20), at(30), False),
                   (1, "a", "x", at(11), at(30), False), (1, "c", "x", at(40), None, True),
                   (2, "a", "x", at(12), at(30), False)]
    assert record.truncates == 1 and record.balanced
    assert {r["_cdc_end_op"] for r in read_all(open_table(paths.table)).to_pylist() if r["v"] == "a"} == {"u", "t"}


@pytest.mark.one_writer
def test_a_truncate_seen_before_its_table_exists_ends_the_late_insert(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    insert = topic.send(key(1), pg("c", {"id": 1, "v": "a", "w": "x"}, lsn=3, ts_ms=TS + 3000), partition=0)
    truncate = topic.send(None, pg("t", None, lsn=5, ts_ms=TS + 5000), partition=1)
    first = ingest_batch(SCD2, paths, topic, [truncate], batch_id=0).record
    second = ingest_batch(SCD2, paths, topic, [insert], batch_id=1).record
    assert stored_versions(paths) == ([(1, "a", "x", at(3), at(5), False)], 0)
    assert rows(paths) == {} and first.truncates == 1 and second.inserted == 1
    assert first.balanced and second.balanced


def test_a_table_keeps_its_history_mode(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    ingest_batch(TableSpec(name="t", topic="t"), paths, topic, [topic.send(key(1), pg("c", {"id": 1}, lsn=10))])
    with pytest.raises(TableError, match="history_mode scd1"):
        ingest_batch(SCD2, paths, topic, [topic.send(key(1), pg("u", {"id": 1}, lsn=20))], batch_id=1)
    assert all(r["balanced"] for r in audit.read(paths.audit).to_pylist())


def test_track_history_needs_scd2():
    with pytest.raises(ValueError, match="track_history is set but history_mode is not scd2"):
        TableSpec(name="t", topic="t", track_history=ColumnSelection(include=("v",)))
