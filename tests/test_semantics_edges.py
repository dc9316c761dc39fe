"""Edges where a table could end different from its source (issue: ten ways changes were lost).

Every test writes Debezium messages as Kafka holds them and applies them through the engine's own
decode and apply (tests/harness.py), cutting the stream into batches the way the case needs.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest

from ingest.commit.remembered import positions as tombstone_positions
from ingest.commit.remembered import purge as purge_tombstones
from ingest.config import TableSpec
from ingest.errors import SchemaIncompatibleError, TableError
from ingest.lake.delta import PACK_AFTER_FILES, open_table, read_all, table_schema
from ingest.records import audit
from tests.harness import Topic, envelope, flat, ingest_batch, ingest_in_batches, key, paths_in, pg, rows

pytestmark = pytest.mark.usefixtures("apply_engine")

HARD = TableSpec(name="t", topic="t")
SOFT = TableSpec(name="t", topic="t", delete_mode="soft")
MODES = pytest.mark.parametrize("spec", [HARD, SOFT], ids=["hard", "soft"])


def audit_rows(paths):
    return audit.read(paths.audit).to_pylist()


# -- 1. a truncate seen before its table exists ------------------------------------------------------
@MODES
@pytest.mark.hard_mode_on_delta_spark
def test_truncate_before_its_table_exists_is_remembered(tmp_path, spec):
    paths, topic = paths_in(tmp_path), Topic()
    insert = topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=3), partition=0)
    truncate = topic.send(None, pg("t", None, lsn=5), partition=1)
    # The truncate (partition 1) is applied in a run before the insert (partition 0) arrives.
    first = ingest_batch(spec, paths, topic, [truncate], batch_id=0).record
    ingest_batch(spec, paths, topic, [insert], batch_id=1)
    assert rows(paths) == {}
    assert first is not None and first.truncates == 1 and first.balanced
    assert open_table(paths.table) is not None  # the table exists, empty, and holds the truncate's position
    assert all(r["balanced"] for r in audit_rows(paths))


@MODES
@pytest.mark.hard_mode_on_delta_spark
def test_a_change_after_a_truncate_that_created_the_table_applies(tmp_path, spec):
    """The table a truncate created has no columns yet; the first later change adds them and applies."""
    paths, topic = paths_in(tmp_path), Topic()
    truncate = topic.send(None, pg("t", None, lsn=5), partition=1)
    insert = topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=7), partition=0)
    ingest_batch(spec, paths, topic, [truncate], batch_id=0)
    record = ingest_batch(spec, paths, topic, [insert], batch_id=1).record
    assert {k: r["v"] for k, r in rows(paths).items()} == {1: "a"}
    assert record is not None and record.inserted == 1 and record.balanced


# -- 2. deletes carried only by a Kafka tombstone ------------------------------------------------------
@pytest.mark.one_writer
@MODES
@pytest.mark.parametrize("with_lsn", [True, False], ids=["lsn-added", "no-position-fields"])
def test_tombstone_deletes_its_key_in_a_flattened_stream(tmp_path, spec, with_lsn):
    paths, topic = paths_in(tmp_path), Topic()
    lsn = (lambda n: n) if with_lsn else (lambda n: None)
    topic.send(key(1), flat({"id": 1, "v": "a"}, lsn=lsn(100)))
    topic.send(key(2), flat({"id": 2, "v": "b"}, lsn=lsn(110)))
    topic.send(key(1), None)  # delete.tombstone.handling.mode=tombstone: the delete is this tombstone
    results = ingest_in_batches(spec, paths, topic, [])
    assert set(rows(paths)) == {2}
    record = results[0].record
    assert record.deleted == 1 and record.skipped == 0 and record.balanced


@pytest.mark.one_writer
@MODES
def test_tombstone_in_a_later_batch_deletes_the_stored_row_and_keeps_order(tmp_path, spec):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), flat({"id": 1, "v": "a"}, lsn=100))
    topic.send(key(1), None)
    topic.send(key(1), flat({"id": 1, "v": "a"}, lsn=100))  # Connect redelivers the older insert
    topic.send(key(3), flat({"id": 3, "v": "c"}, lsn=120))
    results = ingest_in_batches(spec, paths, topic, [1, 2, 3])
    assert set(rows(paths)) == {3}
    assert [r.record.deleted for r in results[1:2]] == [1]
    assert results[2].record.stale == 1  # the redelivered insert does not resurrect the key
    # A later change of the key (a re-insert) is newer than the tombstone's delete.
    topic.send(key(1), flat({"id": 1, "v": "again"}, lsn=130))
    ingest_batch(spec, paths, topic, topic.messages[4:], batch_id=4)
    assert rows(paths)[1]["v"] == "again"
    assert all(r["balanced"] for r in audit_rows(paths))


@pytest.mark.one_writer
def test_tombstone_after_a_full_envelope_delete_changes_nothing(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=100))
    topic.send(key(1), pg("d", {"id": 1, "v": "a"}, lsn=110))
    topic.send(key(1), None)
    topic.send(key(1), pg("c", {"id": 1, "v": "b"}, lsn=120))
    for cuts in ([], [2], [3]):
        paths = paths_in(tmp_path / ("cut" + "-".join(map(str, cuts))))
        results = ingest_in_batches(HARD, paths, topic, cuts)
        assert rows(paths)[1]["v"] == "b"
        assert sum(r.record.skipped for r in results) == 1  # the tombstone: log compaction only


@pytest.mark.one_writer
def test_tombstones_can_be_forced_or_ignored_per_table(tmp_path):
    topic = Topic()
    topic.send(key(1), flat({"id": 1, "v": "a"}, lsn=100))
    topic.send(key(1), None)
    ignoring = paths_in(tmp_path / "ignore")
    ingest_in_batches(TableSpec(name="t", topic="t", kafka_tombstones="ignore"), ignoring, topic, [])
    assert set(rows(ignoring)) == {1}
    # A batch of tombstones only: with `auto` the table remembers that its stream is flattened.
    auto = paths_in(tmp_path / "auto")
    ingest_in_batches(HARD, auto, topic, [1])
    assert rows(auto) == {}


@pytest.mark.one_writer
def test_remembered_deletes_stay_in_few_files_and_keep_guarding(tmp_path):
    """Each batch that deletes adds a file of remembered deletes, and each batch reads them all:
    past :data:`PACK_AFTER_FILES` they are packed, and every delete still guards its key."""
    paths, topic = paths_in(tmp_path), Topic()
    batches = PACK_AFTER_FILES + 4
    topic.send(key(0), pg("c", {"id": 0, "v": "a"}, lsn=100))
    for i in range(1, batches + 1):  # batch i creates key i and deletes key i - 1
        topic.send(key(i), pg("c", {"id": i, "v": "a"}, lsn=100 + 10 * i))
        topic.send(key(i - 1), pg("d", {"id": i - 1, "v": "a"}, lsn=105 + 10 * i))
    ingest_in_batches(HARD, paths, topic, list(range(1, 2 * batches, 2)))
    stones = open_table(paths.tombstones)
    assert stones is not None and len(stones.file_uris()) <= PACK_AFTER_FILES < batches
    assert set(tombstone_positions(paths.tombstones, ("id",), {"id": "long"}, "t")) == {(i,) for i in range(batches)}
    # an older insert of the first key deleted, delivered again, is stale
    result = ingest_batch(HARD, paths, topic, [topic.send(key(0), pg("c", {"id": 0, "v": "a"}, lsn=100))],
                          batch_id=batches + 1)
    assert set(rows(paths)) == {batches} and result.record.stale == 1


# -- 3. PostgreSQL re-snapshot -------------------------------------------------------------------------
@pytest.mark.one_writer
@MODES
def test_resnapshot_read_orders_by_its_lsn(tmp_path, spec):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("r", {"id": 1, "v": "snap-1"}, lsn=1000, committed=None, snapshot="true"))
    topic.send(key(1), pg("u", {"id": 1, "v": "old"}, lsn=1100, committed=1000))
    topic.send(key(2), pg("u", {"id": 2, "v": "streamed"}, lsn=5000, committed=5000))
    # Offsets lost or the slot recreated: Debezium re-snapshots with sequence [null, "5000"].
    topic.send(key(1), pg("r", {"id": 1, "v": "re-read"}, lsn=5000, committed=None, snapshot="true"))
    topic.send(key(2), pg("r", {"id": 2, "v": "re-read"}, lsn=5000, committed=None, snapshot="true"))
    for cuts in ([], [2, 3]):
        paths = paths_in(tmp_path / ("cut" + "-".join(map(str, cuts))))
        ingest_in_batches(spec, paths, topic, cuts)
        got = {k: r["v"] for k, r in rows(paths).items()}
        # The re-read at LSN 5000 corrects the row an update at LSN 1100 left; a streamed change at
        # the same point as the re-read still wins over it (snapshot reads order first).
        assert got == {1: "re-read", 2: "streamed"}


# -- 4. a key widened int -> long, and the tombstones keyed by it --------------------------------------
def _key_schema(width: str):
    return {"type": "struct", "name": "t.Key", "optional": False,
            "fields": [{"field": "id", "type": width, "optional": False}]}


def _value_schema(width: str):
    row = {"type": "struct", "name": "t.Value", "optional": True,
           "fields": [{"field": "id", "type": width, "optional": False},
                      {"field": "v", "type": "string", "optional": True}]}
    source = {"type": "struct", "name": "io.debezium.connector.postgresql.Source", "optional": False,
              "fields": [{"field": "connector", "type": "string", "optional": True},
                         {"field": "lsn", "type": "int64", "optional": True},
                         {"field": "sequence", "type": "string", "optional": True},
                         {"field": "snapshot", "type": "string", "optional": True},
                         {"field": "ts_ms", "type": "int64", "optional": True}]}
    return {"type": "struct", "name": "t.Envelope", "optional": False,
            "fields": [{**row, "field": "before"}, {**row, "field": "after"}, {**source, "field": "source"},
                       {"field": "op", "type": "string", "optional": False},
                       {"field": "ts_ms", "type": "int64", "optional": True}]}


def _typed(op, id_, lsn, width):
    row = {"id": id_, "v": "x"}
    source = {"connector": "postgresql", "lsn": lsn, "sequence": json.dumps([str(lsn - 1), str(lsn)]),
              "snapshot": "false", "ts_ms": 1}
    payload = {"op": op, "before": row if op == "d" else None, "after": None if op == "d" else row,
               "source": source, "ts_ms": 1}
    return json.dumps({"schema": _value_schema(width), "payload": payload}).encode()


def test_key_widening_reaches_the_tombstones(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1, _key_schema("int32")), _typed("c", 1, 10, "int32"))
    topic.send(key(1, _key_schema("int32")), _typed("d", 1, 20, "int32"))
    big = 3_000_000_000
    topic.send(key(big, _key_schema("int64")), _typed("c", big, 30, "int64"))
    topic.send(key(big, _key_schema("int64")), _typed("d", big, 40, "int64"))
    topic.send(key(big, _key_schema("int64")), _typed("c", big, 35, "int64"))  # late, older: stays out
    results = ingest_in_batches(HARD, paths, topic, [2, 3, 4])
    assert rows(paths) == {}
    assert [r.record.deleted for r in results] == [1, 0, 1, 0]
    assert results[3].record.stale == 1
    tombs = tombstone_positions(paths.tombstones, ("id",), {"id": "long"}, "t")
    assert set(tombs) == {(1,), (big,)}
    assert str(table_schema(open_table(paths.tombstones)).field("id").type) == "int64"


def test_a_key_type_the_tombstones_cannot_follow_names_table_and_column(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1, _key_schema("int64")), _typed("c", 1, 10, "int64"))
    topic.send(key(1, _key_schema("int64")), _typed("d", 1, 20, "int64"))
    ingest_in_batches(HARD, paths, topic, [])
    with pytest.raises(TableError, match=r"table 't'.*primary-key column 'id' is integer in the table but long"):
        tombstone_positions(paths.tombstones, ("id",), {"id": "integer"}, "t")


# -- 5. tombstone retention counts from when the tombstone was written ------------------------------
def test_retention_counts_from_when_the_tombstone_was_written(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    old = int((datetime.now(UTC) - timedelta(days=29)).timestamp() * 1000)
    topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=10, ts_ms=old))
    topic.send(key(1), pg("d", {"id": 1, "v": "a"}, lsn=20, ts_ms=old))  # caught up from a 29-day backlog
    ingest_in_batches(HARD, paths, topic, [])
    assert purge_tombstones(paths.tombstones, datetime.now(UTC) - timedelta(days=7)) == 0
    topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=10, ts_ms=old))  # a redelivered older insert
    result = ingest_batch(HARD, paths, topic, topic.messages[2:], batch_id=1)
    assert rows(paths) == {} and result.record.stale == 1
    # Retention still ends: eight days after it was written, the tombstone goes.
    assert purge_tombstones(paths.tombstones, datetime.now(UTC) + timedelta(days=1)) == 1


# -- 6. positions of other connectors, and partitions without a comparable position ----------------
def _sqlserver(commit: str, change: str, serial: int, snapshot: str = "false"):
    return {"connector": "sqlserver", "snapshot": snapshot, "commit_lsn": commit, "change_lsn": change,
            "event_serial_no": serial, "ts_ms": 1}


def _oracle(scn: str, commit_scn: str | None, seq: int):
    return {"connector": "oracle", "snapshot": "false", "scn": scn, "commit_scn": commit_scn, "txSeq": seq,
            "ts_ms": 1}


def _mongo(ts_ms: int, ordinal: int):
    return {"connector": "mongodb", "snapshot": "false", "ts_ms": ts_ms, "ord": ordinal}


def _db2(commit: str, change: str):
    return {"connector": "db2", "snapshot": "false", "commit_lsn": commit, "change_lsn": change, "ts_ms": 1}


@pytest.mark.parametrize(("earlier", "later"), [
    # A later commit wins even when its change LSN is lower (interleaved transactions).
    (_sqlserver("00000027:00000758:0005", "00000027:00000758:0003", 1),
     _sqlserver("00000027:00000760:0002", "00000027:00000750:0001", 1)),
    (_sqlserver("00000027:00000758:0005", "00000027:00000758:0003", 1),
     _sqlserver("00000027:00000758:0005", "00000027:00000758:0003", 2)),
    # LSNs above 64 bits (a large VLF sequence number)
    (_sqlserver("ffffffff:00000758:0005", "ffffffff:00000758:0003", 1),
     _sqlserver("ffffffff:00000759:0001", "ffffffff:00000758:0004", 1)),
    (_oracle("2919961", "2919970", 1), _oracle("2919955", "2919980", 1)),
    (_oracle("2919961", "2919970", 1), _oracle("2919961", "2919970", 2)),
    (_oracle("18446744073709551616", None, 0), _oracle("18446744073709551617", "18446744073709551618", 0)),
    (_mongo(1_700_000_000_000, 5), _mongo(1_700_000_000_000, 6)),
    (_mongo(1_700_000_000_000, 9), _mongo(1_700_000_001_000, 1)),
    (_db2("00000000:00000001:0000000000000020", "00000000:00000001:0000000000000010"),
     _db2("00000000:00000001:0000000000000030", "00000000:00000001:0000000000000005")),
], ids=["sqlserver-commit", "sqlserver-serial", "sqlserver-80-bit", "oracle-commit", "oracle-txseq",
        "oracle-big-scn", "mongo-ord", "mongo-ts", "db2-commit"])
@pytest.mark.one_writer
def test_other_connectors_order_by_their_source_position(tmp_path, earlier, later):
    for reverse in (False, True):
        paths, topic = paths_in(tmp_path / str(reverse)), Topic()
        messages = [envelope("u", {"id": 1, "v": "earlier"}, earlier), envelope("u", {"id": 1, "v": "later"}, later)]
        for value in reversed(messages) if reverse else messages:
            topic.send(key(1), value)
        ingest_in_batches(HARD, paths, topic, [1])
        assert rows(paths)[1]["v"] == "later"


@pytest.mark.one_writer
@MODES
def test_fallback_truncate_removes_what_was_stored_before_it_from_every_partition(tmp_path, spec):
    paths, topic = paths_in(tmp_path), Topic()
    source = {"connector": "spanner"}  # a source with no comparable position: Kafka (partition, offset)
    topic.send(key(1), envelope("c", {"id": 1, "v": "a"}, source), partition=1)
    topic.send(key(2), envelope("c", {"id": 2, "v": "b"}, source), partition=1)
    topic.send(key(3), envelope("c", {"id": 3, "v": "c"}, source), partition=0)
    truncate = topic.send(None, envelope("t", None, source), partition=0)
    ingest_in_batches(spec, paths, topic, [3])
    assert rows(paths) == {}
    after = topic.send(key(4), envelope("c", {"id": 4, "v": "d"}, source), partition=1)
    ingest_batch(spec, paths, topic, [after], batch_id=2)
    assert set(rows(paths)) == {4}  # partition 1's offset 2 is not "before" partition 0's offset 1
    assert truncate.partition == 0


@pytest.mark.one_writer
def test_fallback_change_from_another_partition_is_not_stale(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    source = {"connector": "spanner"}
    for n in range(5):
        topic.send(key(9), envelope("u", {"id": 9, "v": f"p3-{n}"}, source), partition=3)
    topic.send(key(9), envelope("u", {"id": 9, "v": "moved"}, source), partition=0)  # after repartitioning
    results = ingest_in_batches(HARD, paths, topic, [5])
    assert rows(paths)[9]["v"] == "moved"
    assert results[1].record.updated == 1


# -- 7. two fresh runs give identical tables ----------------------------------------------------------
def _history() -> Topic:
    topic = Topic()
    send = topic.send
    send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=10), partition=0)
    send(key(2), pg("c", {"id": 2, "v": "b"}, lsn=11), partition=1)
    send(key(1), pg("u", {"id": 1, "v": "a2"}, lsn=12), partition=0)
    send(key(1), pg("u", {"id": 1, "v": "a2"}, lsn=12), partition=0)  # duplicate, same position
    send(key(2), pg("c", {"id": 2, "v": "b"}, lsn=11), partition=1)  # duplicate
    send(key(3), pg("c", {"id": 3, "v": "c"}, lsn=13), partition=1)
    send(key(3), pg("d", {"id": 3}, lsn=14), partition=1)
    send(key(4), pg("c", {"id": 4, "v": "d"}, lsn=15), partition=0)
    send(None, pg("t", None, lsn=16), partition=1)
    send(key(5), pg("c", {"id": 5, "v": "e"}, lsn=17), partition=0)
    send(key(5), pg("c", {"id": 5, "v": "e"}, lsn=17), partition=1)  # duplicate on another partition
    send(key(1), pg("c", {"id": 1, "v": "again"}, lsn=18), partition=0)
    send(key(6), pg("c", {"id": 6, "v": "f"}, lsn=19), partition=1)
    send(key(6), pg("u", {"id": 6, "v": "f2"}, lsn=20), partition=1)
    return topic


def _table(paths):
    table = read_all(open_table(paths.table)).drop_columns(["_cdc_ingested_at"])  # wall clock, by design
    return sorted(table.to_pylist(), key=lambda r: r["id"])


@MODES
@pytest.mark.hard_mode_on_delta_spark
def test_two_fresh_runs_give_identical_tables(tmp_path, spec, apply_engine):
    topic = _history()
    n = len(topic.messages)
    # One batch per message is the strictest cutting; on delta-spark (2-3 s a MERGE, the same plan
    # and statement as delta-rs's) the three-cut ones suffice.
    every = [list(range(1, n)), [3, 4], [5, 9]] if apply_engine.name == "delta-rs" else []
    cuttings = [[], *every, [2, 8, 11], [4, 10, 13]]
    tables = []
    for i, cuts in enumerate(cuttings):
        paths = paths_in(tmp_path / f"run{i}")
        ingest_in_batches(spec, paths, topic, cuts)
        assert all(r["balanced"] for r in audit_rows(paths))
        tables.append(_table(paths))
    for cuts, table in itertools.islice(zip(cuttings, tables, strict=True), 1, None):
        assert table == tables[0], cuts
    kept = {r["id"]: (r["_cdc_partition"], r["_cdc_offset"]) for r in tables[0] if not r["_cdc_deleted"]}
    assert kept[5] == (0, 4)  # of two copies of one change, the lowest (partition, offset) is kept


# -- 8. an unchanged-TOAST placeholder on a key never seen ----------------------------------------------
@pytest.mark.one_writer
def test_toast_placeholder_on_an_unseen_key_is_marked_unknown(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    marker = "__debezium_unavailable_value"
    topic.send(key(1), pg("u", {"id": 1, "v": "a", "doc": marker}, lsn=10))  # its insert was never seen
    topic.send(key(2), pg("c", {"id": 2, "v": "b", "doc": None}, lsn=11))  # a real NULL
    first = ingest_in_batches(HARD, paths, topic, [])[0].record
    got = rows(paths)
    assert got[1]["doc"] is None and got[1]["_cdc_unknown_columns"] == ["doc"]
    assert got[2]["doc"] is None and got[2]["_cdc_unknown_columns"] is None
    assert first.toast_unknown == 1 and first.balanced
    topic.send(key(1), pg("u", {"id": 1, "v": "a", "doc": marker}, lsn=12))  # still unknown
    ingest_batch(HARD, paths, topic, topic.messages[2:], batch_id=1)
    assert rows(paths)[1]["_cdc_unknown_columns"] == ["doc"]
    topic.send(key(1), pg("u", {"id": 1, "v": "a", "doc": "known"}, lsn=13))
    ingest_batch(HARD, paths, topic, topic.messages[3:], batch_id=2)
    assert rows(paths)[1]["doc"] == "known" and rows(paths)[1]["_cdc_unknown_columns"] is None


# -- 9. schemaless JSON: a whole number, then a fraction ------------------------------------------------
def test_schemaless_long_then_double_widens(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "amount": 1}, lsn=10))
    topic.send(key(2), pg("c", {"id": 2, "amount": 1.5}, lsn=11))
    topic.send(key(3), pg("c", {"id": 3, "amount": 7}, lsn=12))
    results = ingest_in_batches(HARD, paths, topic, [1])
    assert {k: r["amount"] for k, r in rows(paths).items()} == {1: 1.0, 2: 1.5, 3: 7.0}
    assert "widened amount long->double" in results[1].record.schema_change
    assert str(table_schema(open_table(paths.table)).field("amount").type) == "double"


# -- 10. nanosecond key columns ---------------------------------------------------------------------------
NANO = "io.debezium.time.NanoTimestamp"


def _nano_schemas():
    key_schema = {"type": "struct", "name": "t.Key", "optional": False,
                  "fields": [{"field": "at", "type": "int64", "optional": False, "name": NANO}]}
    row = {"type": "struct", "name": "t.Value", "optional": True,
           "fields": [{"field": "at", "type": "int64", "optional": False, "name": NANO},
                      {"field": "seen", "type": "int64", "optional": True, "name": NANO},
                      {"field": "v", "type": "string", "optional": True}]}
    envelope_schema = {"type": "struct", "name": "t.Envelope", "optional": False,
                       "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                  {"field": "op", "type": "string", "optional": False}]}
    return key_schema, envelope_schema


def test_nanosecond_keys_stay_distinct(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    key_schema, value_schema = _nano_schemas()
    base = 1_700_000_000_123_456_000
    for n, at in enumerate((base + 100, base + 200, base + 200_000)):
        row = {"at": at, "seen": at, "v": str(n)}
        topic.send(json.dumps({"schema": key_schema, "payload": {"at": at}}).encode(),
                   json.dumps({"schema": value_schema, "payload": {"op": "c", "before": None, "after": row}}).encode())
    ingest_in_batches(HARD, paths, topic, [])
    table = read_all(open_table(paths.table))
    # Keys that differ below the microsecond stay three rows, exactly; a non-key column is a timestamp.
    assert sorted(table["at"].to_pylist()) == [base + 100, base + 200, base + 200_000]
    assert str(table.schema.field("at").type) == "int64"
    assert str(table.schema.field("seen").type).startswith("timestamp")


# -- ignore_null_updates: an update's null columns keep what is stored ------------------------------
PARTIAL = TableSpec(name="t", topic="t", ignore_null_updates=True)


@pytest.mark.one_writer
@pytest.mark.parametrize("spec", [PARTIAL, PARTIAL.model_copy(update={"delete_mode": "soft"})], ids=["hard", "soft"])
def test_ignore_null_updates_keeps_stored_values(tmp_path, spec):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "a": "x", "b": "y", "n": 5}, lsn=10))
    topic.send(key(2), pg("c", {"id": 2, "a": "p", "b": None, "n": None}, lsn=11))  # an insert keeps its nulls
    first = ingest_batch(spec, paths, topic, topic.messages[:2], batch_id=0).record
    # Across batches (filled from the stored row) and within one (filled from the earlier image).
    later = [topic.send(key(1), pg("u", {"id": 1, "a": None, "b": "z", "n": None}, lsn=20)),
             topic.send(key(3), pg("c", {"id": 3, "a": "q", "b": "r", "n": 1}, lsn=21)),
             topic.send(key(3), pg("u", {"id": 3, "a": None, "b": None, "n": 2}, lsn=22)),
             topic.send(key(4), pg("u", {"id": 4, "a": None, "b": "only", "n": None}, lsn=23))]  # never seen
    second = ingest_batch(spec, paths, topic, later, batch_id=1).record
    got = rows(paths)
    assert {k: (r["a"], r["b"], r["n"]) for k, r in got.items()} == {
        1: ("x", "z", 5), 2: ("p", None, None), 3: ("q", "r", 2), 4: (None, "only", None)}
    # An update carrying only some columns does not say the others are null: unknown, as for TOAST.
    assert sorted(got[4]["_cdc_unknown_columns"]) == ["a", "n"]
    assert got[1]["_cdc_unknown_columns"] is None and got[2]["_cdc_unknown_columns"] is None
    assert second.toast_unknown == 1 and first.balanced and second.balanced
    # A later change that carries the value clears the mark; a delete still deletes.
    topic.send(key(4), pg("u", {"id": 4, "a": "known", "b": None, "n": 3}, lsn=30))
    topic.send(key(2), pg("d", {"id": 2}, lsn=31))
    ingest_batch(spec, paths, topic, topic.messages[-2:], batch_id=2)
    got = rows(paths)
    assert (got[4]["a"], got[4]["b"], got[4]["n"], got[4]["_cdc_unknown_columns"]) == ("known", "only", 3, None)
    assert 2 not in got


@pytest.mark.one_writer
def test_without_ignore_null_updates_a_null_overwrites(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "a": "x", "b": "y"}, lsn=10))
    topic.send(key(1), pg("u", {"id": 1, "a": None, "b": "z"}, lsn=20))
    ingest_in_batches(HARD, paths, topic, [1])
    assert (rows(paths)[1]["a"], rows(paths)[1]["b"]) == (None, "z")


# -- schemaless JSON: a column that is null in some messages ------------------------------------------
def test_schemaless_nulls_take_the_type_of_the_other_messages_and_of_the_table(tmp_path):
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "n": 5, "s": None}, lsn=10))
    topic.send(key(2), pg("c", {"id": 2, "n": None, "s": None}, lsn=11))  # n: a long elsewhere in the batch
    topic.send(key(3), pg("c", {"id": 3, "n": None, "s": None}, lsn=20))  # n: a long in the table
    topic.send(key(1), pg("u", {"id": 1, "n": 7, "s": "now text"}, lsn=21))  # s: null so far, stored as string
    results = ingest_in_batches(HARD, paths, topic, [2])
    got = rows(paths)
    assert {k: (r["n"], r["s"]) for k, r in got.items()} == {1: (7, "now text"), 2: (None, None), 3: (None, None)}
    types = {f.name: str(f.type) for f in table_schema(open_table(paths.table))}
    assert (types["n"], types["s"]) == ("int64", "string")
    assert len(results) == 2 and all(r.record.balanced for r in results)


# -- column selection: include or exclude, the key always kept ------------------------------------------
def _user_columns(paths):
    return [f.name for f in table_schema(open_table(paths.table)) if not f.name.startswith("_cdc_")]


@pytest.mark.one_writer
def test_included_columns_only_and_the_key(tmp_path):
    spec = TableSpec(name="t", topic="t", columns={"include": ["a"]})
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "a": "x", "b": "y", "c": 3}, lsn=10))
    topic.send(key(1), pg("u", {"id": 1, "a": "x2", "b": "y2", "c": 4, "d": True}, lsn=20))  # d: a new column
    results = ingest_in_batches(spec, paths, topic, [1])
    assert _user_columns(paths) == ["id", "a"] and rows(paths)[1]["a"] == "x2"
    assert all(r.record.balanced for r in results) and results[1].record.updated == 1


@pytest.mark.one_writer
def test_an_excluded_column_never_touches_the_table_even_when_its_type_breaks(tmp_path):
    spec = TableSpec(name="t", topic="t", columns={"exclude": ["secret", "id"]})  # the key is kept anyway
    paths, topic = paths_in(tmp_path), Topic()
    topic.send(key(1), pg("c", {"id": 1, "a": "x", "secret": "s1"}, lsn=10))
    topic.send(key(2), pg("c", {"id": 2, "a": "y", "secret": 42}, lsn=20))  # string -> long: no safe widening
    topic.send(key(1), pg("u", {"id": 1, "a": "z", "secret": None, "n": 7}, lsn=30))  # a new column is kept
    results = ingest_in_batches(spec, paths, topic, [1, 2])
    assert _user_columns(paths) == ["id", "a", "n"]
    assert {k: (r["a"], r["n"]) for k, r in rows(paths).items()} == {1: ("z", 7), 2: ("y", None)}
    assert all(r.record.balanced for r in results)
    # Without the exclusion the same stream stops the table at the second batch.
    other = paths_in(tmp_path / "plain")
    with pytest.raises(SchemaIncompatibleError, match="secret"):
        ingest_in_batches(HARD, other, topic, [1, 2])


# -- a column added at the source with a default --------------------------------------------------------
def _defaults_schema(*extra):
    value = {"type": "struct", "name": "t.Value", "optional": True,
             "fields": [{"field": "id", "type": "int32", "optional": False},
                        {"field": "v", "type": "string", "optional": True}, *extra]}
    return {"type": "struct", "name": "t.Envelope", "optional": False,
            "fields": [{**value, "field": "before"}, {**value, "field": "after"},
                       {"field": "op", "type": "string", "optional": False}]}


def test_a_column_added_with_a_default_is_named_once_where_rows_keep_null(tmp_path, caplog):
    """The source fills existing rows with the default and sends nothing for them: the table cannot
    know their value, so the batch that adds the column says so, and its audit row names the default."""
    paths, topic = paths_in(tmp_path), Topic()
    region = {"field": "region", "type": "string", "optional": True, "default": "eu"}
    tier = {"field": "tier", "type": "int32", "optional": False, "default": 3}
    topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=10, schema=_defaults_schema()))
    topic.send(key(2), pg("c", {"id": 2, "v": "b", "region": "us", "tier": 1}, lsn=20,
                          schema=_defaults_schema(region, tier)))
    topic.send(key(3), pg("c", {"id": 3, "v": "c", "region": "eu", "tier": 3}, lsn=30,
                          schema=_defaults_schema(region, tier)))
    with caplog.at_level("WARNING", logger="ingest.apply.journey"):
        results = ingest_in_batches(HARD, paths, topic, [1, 2])
    warned = [r.getMessage() for r in caplog.records if r.name == "ingest.apply.journey"]
    assert len(warned) == 1, warned  # the batch that adds the columns, not the one after it
    event = next(r for r in caplog.records if r.name == "ingest.apply.journey")
    assert (event.event, event.table, event.batch, event.figures) == (  # type: ignore[attr-defined]
        "source-defaults-not-filled", "t", 1, {"columns": {"region": "'eu'", "tier": "3"}})
    assert warned[0].startswith("table 't': new columns 'region' (source default 'eu'), 'tier' (source default 3): "
                                "the table's earlier rows hold null there")
    assert "ingest resnapshot t" in warned[0] and "operations.md#a-column-added-with-a-default" in warned[0]
    assert results[1].record.schema_change == "added region string (source default 'eu'); " \
                                              "added tier integer (source default 3)"
    assert results[2].record.schema_change == ""
    assert {k: (r["region"], r["tier"]) for k, r in rows(paths).items()} == \
        {1: (None, None), 2: ("us", 1), 3: ("eu", 3)}

    # A table whose first batch brings the column has no rows from before it: nothing to say. Nor
    # has one that a truncate created, without columns, before its first change.
    caplog.clear()
    fresh, truncated = paths_in(tmp_path / "fresh"), paths_in(tmp_path / "truncated")
    truncate = Topic()
    truncate.send(None, pg("t", None, lsn=5))
    truncate.send(key(2), pg("c", {"id": 2, "v": "b", "region": "us", "tier": 1}, lsn=20,
                             schema=_defaults_schema(region, tier)))
    with caplog.at_level("WARNING", logger="ingest.apply.journey"):
        ingest_in_batches(HARD, fresh, topic, [])
        ingest_in_batches(HARD, truncated, truncate, [1])
    assert not [r for r in caplog.records if r.name == "ingest.apply.journey"]
    assert {k: r["region"] for k, r in rows(truncated).items()} == {2: "us"}


# -- timestamps far from today --------------------------------------------------------------------------
def test_a_timestamp_outside_the_nanosecond_years_reads_back_as_written(tmp_path):
    """Both writers keep timestamps as Parquet's int64 microseconds. Spark's legacy INT96, which readers
    other than Spark take as nanoseconds (the years 1677-2262), gave 9999-12-31 back as 2262-04-11."""
    paths, topic = paths_in(tmp_path), Topic()
    schema = _defaults_schema(
        {"field": "tz", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"})
    sent = {1: "9999-12-31T23:59:59.999999Z", 2: "1500-06-01T12:00:00.5Z", 3: "2024-02-29T00:00:00Z"}
    for n, tz in sent.items():
        topic.send(key(n), pg("c", {"id": n, "v": str(n), "tz": tz}, lsn=10 * n, schema=schema))
    ingest_in_batches(HARD, paths, topic, [])
    assert {k: r["tz"] for k, r in rows(paths).items()} == {
        k: datetime.fromisoformat(v) for k, v in sent.items()}


# -- PostgreSQL's infinity and -infinity ----------------------------------------------------------------
def test_infinite_dates_and_timestamps_keep_their_rows_as_the_latest_and_earliest_values(tmp_path):
    """Debezium sends PostgreSQL's ``infinity`` as values beyond any date (docs/types.md). The rows stay,
    holding Delta's latest or earliest value, whether a batch converts the column at once or row by row."""
    paths, topic = paths_in(tmp_path), Topic()
    schema = _defaults_schema(
        {"field": "ts", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
        {"field": "tz", "type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
        {"field": "d", "type": "int32", "optional": True, "name": "io.debezium.time.Date"})
    sent = {1: (9_223_372_036_825_200_000, "infinity", -2_147_472_692),
            2: (-9_223_372_036_832_400_000, "-infinity", -2_147_472_691),
            3: (86_400_000_000, "1970-01-02T00:00:00Z", 1),
            4: (9_223_372_036_825_200_000, "infinity", -2_147_472_692)}
    for n, (ts, tz, d) in sent.items():
        topic.send(key(n), pg("c", {"id": n, "v": str(n), "ts": ts, "tz": tz, "d": d}, lsn=10 * n, schema=schema))
    results = ingest_in_batches(HARD, paths, topic, [3])  # three rows at once, then one alone
    latest, earliest, day = datetime(9999, 12, 31, 23, 59, 59), datetime(1, 1, 1), datetime(1970, 1, 2)
    expected = {1: latest, 2: earliest, 3: day, 4: latest}
    got = {k: (r["ts"], r["tz"], r["d"]) for k, r in rows(paths).items()}
    assert got == {k: (v, v.replace(tzinfo=UTC), v.date()) for k, v in expected.items()}
    assert [r.record.quarantined for r in results] == [0, 0]
