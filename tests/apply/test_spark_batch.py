"""The executors placement leaves the table the driver placement leaves, through the one journey.

Two tables take the same three random batches: one placed on the driver (``apply_parts``,
committed by delta-rs: :data:`REFERENCE`), one placed on the executors and written by delta-spark
(reduce, stored rows, remembered deletes, plan, MERGE source and the deletes to remember, all on
Spark). The first batch creates the table, the second meets its rows (and redelivers the first
batch's changes, so remembered deletes bury some), the third brings only new keys (appended, not
merged). After each batch both tables, their remembered deletes, their audit counts and their
recorded offsets must be the same.

A flattened stream's Kafka tombstones (the deletes of their keys) go the same two ways, from the
decoded messages: the executors placement keeps such batches there and must leave the table,
counts and quarantine that the driver placement leaves. So must a table with an expectations
suite: its winners are validated on the executors, and the rows held, with the earlier changes of
their keys, must be the driver gate's. And so must a ``history_mode: scd2`` table: every version,
the truncate log, the counts and the rows held.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from ingest.apply import journey
from ingest.apply.journey import apply_batch, apply_parts, placement_for
from ingest.commit import delta_spark
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.commit.remembered import RememberedDeletes, positions
from ingest.commit.state import OpenTables, load_state
from ingest.config import TableSpec
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.decode.parts import write_parts
from ingest.lake.delta import PACK_AFTER_FILES, open_table, read_all, write_table
from ingest.lake.layout import TablePaths
from ingest.quality import QualityGate, load_suite
from ingest.records import quarantine
from ingest.records.audit import AuditRecord
from ingest.spark.session import arrow_frame
from tests.apply.test_moves import SPECS as MOVE_SPECS
from tests.apply.test_moves import story as moves_story
from tests.apply.test_moves import table_rows as moved_rows
from tests.apply.test_rereads import LIVE as REREAD_LIVE
from tests.apply.test_rereads import story as rereads_story
from tests.apply.test_spark_reduce import random_parts
from tests.factories import change, decoded_rows
from tests.harness import Topic, flat, kafka_rows, key, paths_in
from tests.quality.helpers import write_suite

pytestmark = pytest.mark.spark
#: The driver's journey commits with delta-rs: the same plan and MERGE statement as delta-spark's
#: (tests/apply/test_engines_interchange.py), an independent writer, and a second a batch cheaper.
REFERENCE = DeltaRsWriter()
COUNTS = ("inserted", "updated", "deleted", "stale", "superseded", "truncates", "toast_unknown")


def on_the_executors(spec: TableSpec, paths: TablePaths, decoded: Any, opened: OpenTables, writer: Any,
                     **kwargs: Any) -> Any:
    """The one journey with the executors placement (three key shares, so every rule meets several)."""
    return apply_batch(spec, paths, decoded, placement=placement_for("executors", writer, paths.table, shares=3),
                       writer=writer, opened=opened, run_id="test", **kwargs)


def _table(path: Any, drop: tuple[str, ...] = ("_cdc_ingested_at",)) -> list[dict[str, Any]]:
    table = open_table(path)
    if table is None:
        return []
    rows = read_all(table)
    rows = rows.select([n for n in rows.column_names if n not in drop])
    return sorted(rows.to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize(("mode", "nulls"), [("soft", False), ("hard", True)], ids=["soft", "hard-ignore-null-updates"])
def test_the_executors_leave_the_table_the_driver_leaves(tmp_path: Any, spark: Any, mode: str, nulls: bool) -> None:
    spec = TableSpec(name="t", topic="t", delete_mode=mode, ignore_null_updates=nulls)  # type: ignore[arg-type]
    engine = DeltaSparkWriter(spark)
    on_driver, on_executors = paths_in(tmp_path / "driver"), paths_in(tmp_path / "executors")
    batches = [random_parts(7, keys=24, truncates=False),
               random_parts(8, keys=20, first_key=12, first_offset=10_000)
               + random_parts(7, keys=24, truncates=False, offsets_from=20_000),
               random_parts(9, keys=10, first_key=100, first_offset=30_000, truncates=False)]
    opened = OpenTables(on_executors, "t")
    for i, parts in enumerate(batches):
        expected = apply_parts(spec, on_driver, parts, batch_id=i, run_id="test", writer=REFERENCE).record
        assert expected is not None and expected.balanced
        blobs = pa.Table.from_batches([write_parts(parts)])
        record = on_the_executors(spec, on_executors, arrow_frame(spark, blobs), opened, engine, batch_id=i).record
        assert record is not None and record.status == "committed"
        assert {c: getattr(record, c) for c in COUNTS} == {c: getattr(expected, c) for c in COUNTS}, f"batch {i}"
        assert _table(on_executors.table) == _table(on_driver.table), f"batch {i}"
        assert load_state(on_executors.table).offsets == load_state(on_driver.table).offsets
        if mode == "hard":
            drop = ("_cdc_recorded_at",)
            assert _table(on_executors.tombstones, drop) == _table(on_driver.tombstones, drop), f"batch {i}"
    last = open_table(on_executors.table)
    assert last is not None and last.history(1)[0]["operation"] == "WRITE"  # the new keys were appended
    assert len(_table(on_driver.table)) > 24  # every batch left rows


def _flattened_stream() -> tuple[Topic, list[int]]:
    """A flattened stream whose deletes are Kafka tombstones, in three batches (the cut indices):
    tombstones after their key's change in the batch, of a stored row, of nothing, redelivered
    older changes, a key that cannot be read and a key that is not the table's (of a tombstone and
    of a change)."""
    topic = Topic()
    for k in range(1, 9):
        topic.send(key(k), flat({"id": k, "v": f"a{k}"}, lsn=100 + k), partition=k % 2)
    topic.send(key(1), None, partition=1)  # after key 1's insert on its partition: deletes it
    topic.send(key(3), flat({"id": 3, "v": "b3"}, op="u", lsn=120), partition=1)
    topic.send(key(3), None, partition=1)
    topic.send(key(40), None)  # nothing to delete: skipped
    first = len(topic.messages)
    topic.send(key(2), None)  # the stored row of key 2
    topic.send(key(4), flat({"id": 4, "v": "b4"}, op="u", lsn=130))
    topic.send(key(1), flat({"id": 1, "v": "a1"}, lsn=101), partition=1)  # redelivered: stays deleted
    topic.send(b"not a key", None)  # unreadable: quarantined
    topic.send(json.dumps({"other": 5}).encode(), None)  # not the table's key: quarantined
    topic.send(json.dumps({"other": 6}).encode(), flat({"other": 6, "v": "x"}, lsn=135))  # so is this change
    second = len(topic.messages)
    topic.send(key(5), flat({"id": 5, "v": "b5"}, op="u", lsn=140))
    topic.send(key(5), None)
    topic.send(key(6), None, partition=0)
    topic.send(key(9), flat({"id": 9, "v": "a9"}, lsn=150))
    return topic, [first, second]


@pytest.mark.parametrize("mode", ["hard"])  # hard: the deletes are also remembered, by a delta-spark MERGE
def test_tombstones_of_a_flattened_stream_delete_on_the_executors(tmp_path: Any, spark: Any, monkeypatch: Any,
                                                                  mode: str) -> None:
    spec = TableSpec(name="t", topic="t", delete_mode=mode)  # type: ignore[arg-type]
    engine = DeltaSparkWriter(spark)
    on_driver, on_executors = paths_in(tmp_path / "driver"), paths_in(tmp_path / "executors")
    opened = OpenTables(on_executors, "t")
    monkeypatch.setattr(journey, "_collected", None)  # every batch must stay on the executors
    topic, cuts = _flattened_stream()
    decoder = BatchDecoder(DecoderSpec("json", keep_before=False))
    raw = {("t", m.partition, m.offset): (m.key, m.value, None) for m in topic.messages}
    def fetch(coords: Any) -> Any:
        return {c: raw[c] for c in coords}
    totals: Counter[str] = Counter()
    for i, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(topic.messages)], strict=True)):
        rows = kafka_rows("t", topic.messages[start:end])
        expected = apply_parts(spec, on_driver, decoder.decode(rows), batch_id=i, run_id="test", writer=REFERENCE,
                               fetch_raw=fetch).record
        decoded = arrow_frame(spark, pa.Table.from_batches([decoder.parts(rows)])).repartition(2)
        got = on_the_executors(spec, on_executors, decoded, opened, engine, batch_id=i, fetch_raw=fetch).record
        assert expected is not None and got is not None and expected.balanced and got.balanced
        counts = (*COUNTS, "skipped", "quarantined", "received")
        assert {c: getattr(got, c) for c in counts} == {c: getattr(expected, c) for c in counts}, f"batch {i}"
        assert _table(on_executors.table) == _table(on_driver.table), f"batch {i}"
        totals.update({c: getattr(got, c) for c in ("deleted", "skipped")})
    assert totals["deleted"] >= 4 and totals["skipped"] >= 1  # tombstones deleted, one was a no-op
    live = {r["id"] for r in _table(on_executors.table) if not r.get("_cdc_deleted")}
    assert live == {4, 7, 8, 9}
    held = quarantine.read(on_executors.quarantine).to_pylist()
    assert sorted(r["reason"][:10] for r in held) == ["primary ke", "tombstone:", "tombstone:"]
    assert [r["raw_key"] for r in held] == [r["raw_key"] for r in quarantine.read(on_driver.quarantine).to_pylist()]


SUITE = [
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "name", "regex": "^n[0-9]*[1-7]$"},
     "meta": {"policy": "quarantine"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "notes"}, "meta": {"policy": "warn"}},
]
QUALITY = ("expectations_evaluated", "expectations_failed", "quality_status", "quality_failures")


def _held(paths: Any) -> list[tuple[Any, ...]]:
    rows = quarantine.read(paths.quarantine).to_pylist()
    return sorted((r["topic"], r["partition"], r["offset"], r["stage"], r["reason"], r["expectations"], r["row_key"])
                  for r in rows)


def _gated_journeys(tmp_path: Any, spark: Any, monkeypatch: Any, spec: TableSpec, batches: list[Any]
                    ) -> Iterator[tuple[int, AuditRecord, TablePaths, TablePaths]]:
    """Each batch of ``batches`` through the driver's journey (:data:`SUITE` validated by pandas)
    and kept on the executors (validated by GX on Spark): yields the batch's index, the driver's
    audit record and both tables' paths, once both records balance and give the same counts."""
    write_suite(tmp_path / "suites", "s", SUITE)
    suite = load_suite(tmp_path / "suites", "s")
    on_pandas, on_spark = QualityGate(spec, suite), QualityGate(spec, suite, spark=spark)
    engine = DeltaSparkWriter(spark)
    on_driver, on_executors = paths_in(tmp_path / "driver"), paths_in(tmp_path / "executors")
    opened = OpenTables(on_executors, "t")
    monkeypatch.setattr(journey, "_collected", None)  # every batch must stay on the executors
    for i, parts in enumerate(batches):
        expected = apply_parts(spec, on_driver, parts, batch_id=i, run_id="test", writer=REFERENCE,
                               gate=on_pandas).record
        blobs = pa.Table.from_batches([write_parts(parts)])
        got = on_the_executors(spec, on_executors, arrow_frame(spark, blobs).repartition(2), opened, engine,
                               batch_id=i, gate=on_spark).record
        assert expected is not None and got is not None and expected.balanced and got.balanced
        counts = (*COUNTS, *QUALITY, "quarantined", "received")
        assert {c: getattr(got, c) for c in counts} == {c: getattr(expected, c) for c in counts}, f"batch {i}"
        yield i, expected, on_driver, on_executors


@pytest.mark.parametrize("mode", ["soft"])  # soft: the second batch truncates, truncated rows stay beside held keys
def test_the_gate_holds_on_the_executors_what_it_holds_on_the_driver(tmp_path: Any, spark: Any, monkeypatch: Any,
                                                                   mode: str) -> None:
    spec = TableSpec(name="t", topic="t", delete_mode=mode, expectations="s")  # type: ignore[arg-type]
    batches = [random_parts(21, keys=24, truncates=False),
               random_parts(22, keys=20, first_key=12, first_offset=10_000)]
    for i, expected, on_driver, on_executors in _gated_journeys(tmp_path, spark, monkeypatch, spec, batches):
        assert expected.quality_status == "quarantined" and expected.quarantined > 0  # the gate held rows
        assert _table(on_executors.table) == _table(on_driver.table), f"batch {i}"
    assert _held(on_executors) == _held(on_driver)
    assert any(r[4].startswith("held with the later change") for r in _held(on_driver))  # earlier changes too


def test_a_column_null_in_every_schemaless_message_takes_the_tables_type(tmp_path: Any, spark: Any,
                                                                         monkeypatch: Any) -> None:
    spec = TableSpec(name="t", topic="t")
    engine = DeltaSparkWriter(spark)
    on_driver, on_executors = paths_in(tmp_path / "driver"), paths_in(tmp_path / "executors")
    opened = OpenTables(on_executors, "t")
    monkeypatch.setattr(journey, "_collected", None)
    topic = Topic()
    for k in range(1, 4):
        topic.send(key(k), flat({"id": k, "v": f"a{k}", "n": k * 10}, lsn=100 + k))
    first = len(topic.messages)
    for k in range(1, 5):  # v and n null in every message of the batch: JSON without a schema types them null
        topic.send(key(k), flat({"id": k, "v": None, "n": None}, op="u" if k < 4 else "c", lsn=200 + k))
    decoder = BatchDecoder(DecoderSpec("json", keep_before=False))
    for i, (start, end) in enumerate([(0, first), (first, len(topic.messages))]):
        rows = kafka_rows("t", topic.messages[start:end])
        expected = apply_parts(spec, on_driver, decoder.decode(rows), batch_id=i, run_id="test",
                               writer=REFERENCE).record
        decoded = arrow_frame(spark, pa.Table.from_batches([decoder.parts(rows)]))
        got = on_the_executors(spec, on_executors, decoded, opened, engine, batch_id=i).record
        assert expected is not None and got is not None and got.balanced
        assert {c: getattr(got, c) for c in COUNTS} == {c: getattr(expected, c) for c in COUNTS}, f"batch {i}"
        assert _table(on_executors.table) == _table(on_driver.table), f"batch {i}"
    assert [r["v"] for r in _table(on_executors.table)] == [None] * 4
    assert load_state(on_executors.table).columns == load_state(on_driver.table).columns


def _versions(path: Any) -> list[dict[str, Any]]:
    return sorted(_table(path), key=lambda r: (r["id"], r["_cdc_position"]))


@pytest.mark.parametrize("nulls", [True], ids=["ignore-null-updates"])  # nulls: every share fills as the batch does
def test_history_is_derived_on_the_executors_as_on_the_driver(tmp_path: Any, spark: Any, monkeypatch: Any,
                                                              nulls: bool) -> None:
    spec = TableSpec(name="t", topic="t", history_mode="scd2", expectations="s", ignore_null_updates=nulls,
                     track_history={"include": ["name"]})  # type: ignore[arg-type]
    # the first batch creates the table; the second reaches its keys, truncates, and brings late
    # changes out of order (two runs of positions); the third redelivers the second's changes
    batches = [random_parts(31, keys=24, truncates=False),
               random_parts(32, keys=20, first_key=12, first_offset=10_000)
               + random_parts(33, keys=24, events=30, truncates=False, first_offset=5_000, offsets_from=20_000),
               random_parts(32, keys=20, first_key=12, first_offset=10_000, offsets_from=30_000)]
    truncates = {}
    for i, expected, on_driver, on_executors in _gated_journeys(tmp_path, spark, monkeypatch, spec, batches):
        assert _versions(on_executors.table) == _versions(on_driver.table), f"batch {i}"
        assert load_state(on_executors.table).truncate_log == load_state(on_driver.table).truncate_log
        truncates[i] = expected.truncates
    assert _held(on_executors) == _held(on_driver)
    rows = _versions(on_driver.table)
    assert len(rows) > len({r["id"] for r in rows})  # keys with past versions
    assert any(r["_cdc_end_op"] == "t" for r in rows) and truncates[2] == 0  # a truncate ended versions


@pytest.mark.parametrize("mode", ["hard", "scd2"])
def test_the_executors_fill_primary_key_moves_as_the_driver_does(tmp_path: Any, spark: Any, mode: str) -> None:
    """tests/apply/test_moves.py's story on the executors, cut where the old key's delete and the
    new key's create fall in different batches."""
    spec, (topic, expected) = MOVE_SPECS[mode], moves_story()
    paths = paths_in(tmp_path)
    writer, opened = DeltaSparkWriter(spark), OpenTables(paths, "t")
    decoder = BatchDecoder(DecoderSpec("json", key_columns=("id",), keep_before=False))
    for batch_id, (start, end) in enumerate([(0, 6), (6, len(topic.messages))]):
        parts = decoder.decode(kafka_rows("t", topic.messages[start:end]))
        frame = arrow_frame(spark, pa.Table.from_batches([write_parts(parts)]))
        on_the_executors(spec, paths, frame, opened, writer, batch_id=batch_id)
    rows = moved_rows(paths, spec)
    assert {k: (r["v"], r["note"]) for k, r in rows.items()} == expected
    assert not any(r["_cdc_unknown_columns"] for r in rows.values())


def test_the_executors_name_suspect_reads_as_the_driver_does(tmp_path: Any, spark: Any) -> None:
    """tests/apply/test_rereads.py's story on the executors, cut so that some reads meet the stored
    rows and remembered deletes, others the batch's own changes, and leaves the same rows."""
    topic, suspect = rereads_story()
    paths = paths_in(tmp_path)
    writer, opened = DeltaSparkWriter(spark), OpenTables(paths, "t")
    decoder = BatchDecoder(DecoderSpec("json", key_columns=("id",), keep_before=False))
    named: set[int] = set()
    n = len(topic.messages)
    for batch_id, (start, end) in enumerate([(0, 12), (12, n - 1), (n - 1, n)]):
        parts = decoder.decode(kafka_rows("t", topic.messages[start:end]))
        frame = arrow_frame(spark, pa.Table.from_batches([write_parts(parts)]))
        result = on_the_executors(MOVE_SPECS["hard"], paths, frame, opened, writer, batch_id=batch_id)
        named |= {k[0] for k in result.suspect_reads.keys} if result.suspect_reads else set()
    assert named == suspect
    assert {r["id"]: r["v"] for r in read_all(open_table(paths.table)).to_pylist()} == REREAD_LIVE


def test_only_a_batch_with_deletes_writes_remembered_deletes(tmp_path: Any, spark: Any, monkeypatch: Any) -> None:
    """In hard-delete mode a batch's deletes are remembered by a MERGE of their own before the
    commit; a batch without deletes skips it (a MERGE of nothing costs seconds), and the remembered
    deletes still equal the driver's."""
    spec = TableSpec(name="t", topic="t")
    engine = DeltaSparkWriter(spark)
    on_driver, on_executors = paths_in(tmp_path / "driver"), paths_in(tmp_path / "executors")
    batches = [decoded_rows([change("c", k, 10 + k) for k in range(5)]),
               decoded_rows([change("u", 2, 20), change("c", 7, 21)], first_offset=5),
               decoded_rows([change("d", 1, 30), change("u", 3, 31)], first_offset=7)]
    remembering: list[int] = []
    real = delta_spark.remember_on_executors
    opened = OpenTables(on_executors, "t")
    for i, parts in enumerate(batches):
        monkeypatch.setattr(delta_spark, "remember_on_executors",
                            lambda *a, _i=i, **k: remembering.append(_i) or real(*a, **k))
        apply_parts(spec, on_driver, parts, batch_id=i, run_id="test", writer=REFERENCE)
        blobs = pa.Table.from_batches([write_parts(parts)])
        record = on_the_executors(spec, on_executors, arrow_frame(spark, blobs), opened, engine, batch_id=i).record
        assert record is not None and record.status == "committed" and record.deleted == (i == 2)
    assert remembering == [2]
    drop = ("_cdc_recorded_at",)
    assert [r["id"] for r in _table(on_executors.tombstones, drop)] == [1]
    assert _table(on_executors.tombstones, drop) == _table(on_driver.tombstones, drop)
    assert _table(on_executors.table) == _table(on_driver.table)


def test_remembered_deletes_merged_on_the_executors_are_packed(tmp_path: Any, spark: Any) -> None:
    """delta-spark's MERGE of a batch's deletes adds a file to the remembered deletes as delta-rs's
    does: past :data:`~ingest.lake.delta.PACK_AFTER_FILES` small files they are packed, and keep
    every delete."""
    paths = paths_in(tmp_path)
    now = datetime.now(UTC)

    def deletes(ids: list[int]) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), "_cdc_position": [f"p{i:03d}" for i in ids],
                         "_cdc_source_ts": pa.array([now] * len(ids), pa.timestamp("us", tz="UTC"))})

    remembered = RememberedDeletes(paths.tombstones, "t")
    for i in range(PACK_AFTER_FILES):  # one small file each, as many batches' MERGEs would leave
        write_table(paths.tombstones, pa.table({
            "id": pa.array([i], pa.int64()), "_cdc_position": [f"p{i:03d}"],
            "_cdc_deleted_at": pa.array([now], pa.timestamp("us", tz="UTC")),
            "_cdc_recorded_at": pa.array([now], pa.timestamp("us", tz="UTC"))}), mode="append")
    delta_spark.remember_on_executors(spark, remembered, ("id",), {"id": "long"},
                                      arrow_frame(spark, deletes([PACK_AFTER_FILES])))
    remembered.settle()  # the packing runs behind the MERGE
    stones = open_table(paths.tombstones)
    assert stones is not None and len(stones.file_uris()) == 1
    assert positions(paths.tombstones, ("id",), {"id": "long"}, "t") == {
        (i,): f"p{i:03d}" for i in range(PACK_AFTER_FILES + 1)}
