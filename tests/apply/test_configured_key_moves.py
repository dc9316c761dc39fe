"""An update that moves a row to another configured key removes the old key's row.

A source table without a primary key has no Kafka key: the table names its key in
``tables[].primary_key``. Debezium, not knowing that key, sends an update of those columns as one
update, its before image (PostgreSQL's ``REPLICA IDENTITY FULL``, MySQL's full row image) holding the
old key. The decode step turns it into what Debezium sends for a key it knows -- a delete of the old
key and the new key's row at the update's position -- so the old key's row goes, in every delete
and history mode, however the stream is cut into batches. (With ``REPLICA IDENTITY FULL`` an
unchanged TOASTed value arrives whole in the after image, as part of the identity: the stack's
``tests/stack/test_keyless.py`` moves such a row.)
"""

from __future__ import annotations

from typing import Any

import pytest

from ingest.config import TableSpec
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.decode.parts import read_parts, write_parts
from ingest.lake.delta import open_table, read_all
from tests.harness import Topic, ingest_in_batches, kafka_rows, paths_in, pg

pytestmark = [pytest.mark.usefixtures("apply_engine"), pytest.mark.one_writer]

NOTE = {1: "first " * 700, 2: "second " * 700}
SPECS = {"hard": TableSpec(name="t", topic="t", primary_key=["id"]),
         "soft": TableSpec(name="t", topic="t", primary_key=["id"], delete_mode="soft"),
         "scd2": TableSpec(name="t", topic="t", primary_key=["id"], history_mode="scd2")}


def update(topic: Topic, before: dict[str, Any], after: dict[str, Any], lsn: int) -> None:
    """An update of a table without a primary key (no Kafka key), with its full before image."""
    topic.send(None, pg("u", after, lsn=lsn, before=before))


def story() -> tuple[Topic, dict[int, tuple[int, str]]]:
    """Two rows; a move with another column changing, a chain of moves, an update that keeps its key,
    and a move back to a key deleted before. Returns the live rows' ``(v, note)``."""
    t = Topic()
    for i in (1, 2):
        t.send(None, pg("c", {"id": i, "v": 0, "note": NOTE[i]}, lsn=10 * i))
    update(t, {"id": 1, "v": 0, "note": NOTE[1]}, {"id": 5, "v": 1, "note": NOTE[1]}, lsn=30)
    update(t, {"id": 5, "v": 1, "note": NOTE[1]}, {"id": 6, "v": 2, "note": NOTE[1]}, lsn=40)
    update(t, {"id": 2, "v": 0, "note": NOTE[2]}, {"id": 2, "v": 3, "note": NOTE[2]}, lsn=50)
    t.send(None, pg("d", {"id": 2, "v": 3, "note": NOTE[2]}, lsn=60))
    update(t, {"id": 6, "v": 2, "note": NOTE[1]}, {"id": 2, "v": 4, "note": NOTE[1]}, lsn=70)
    return t, {2: (4, NOTE[1])}


def rows_of(paths: Any, spec: TableSpec) -> list[dict[str, Any]]:
    rows = read_all(open_table(paths.table)).to_pylist()
    if spec.history_mode == "scd2":
        rows = [r for r in rows if r["_cdc_is_current"]]
    return rows


@pytest.mark.parametrize("mode", sorted(SPECS))
def test_the_old_key_goes_and_the_new_row_keeps_its_values_however_the_stream_is_cut(tmp_path: Any,
                                                                                       mode: str) -> None:
    spec, (topic, expected) = SPECS[mode], story()
    for cuts in ([], [2], [3], [4], [6], list(range(1, len(topic.messages)))):
        paths = paths_in(tmp_path / "-".join(map(str, cuts)))
        results = ingest_in_batches(spec, paths, topic, cuts)
        assert all(r.record is not None and r.record.balanced for r in results), f"cut at {cuts}"
        rows = rows_of(paths, spec)
        live = {r["id"]: (r["v"], r["note"]) for r in rows if not r["_cdc_deleted"]}
        assert live == expected, f"cut at {cuts}"
        if mode == "soft":  # the moved-away keys stay, flagged deleted
            assert {r["id"] for r in rows if r["_cdc_deleted"]} == {1, 5, 6}, f"cut at {cuts}"


def test_an_update_is_split_only_when_its_configured_key_changed() -> None:
    topic = Topic()
    update(topic, {"id": 1, "v": 0, "note": "a"}, {"id": 1, "v": 1, "note": "b"}, lsn=10)  # same key
    update(topic, {"id": 1, "v": 1, "note": "b"}, {"id": 3, "v": 1, "note": "b"}, lsn=20)  # a move
    topic.send(None, pg("u", {"id": 4, "v": 1, "note": "c"}, lsn=30))  # no before image: nothing known
    rows = kafka_rows(topic.name, topic.messages)
    keyed = BatchDecoder(DecoderSpec("json", key_columns=("id",), keep_before=False)).decode(rows)
    changes = [r for part in read_parts(write_parts(keyed).column(0).to_pylist()) for r in part.to_pylist()]
    assert [(r["_cdc_offset"], r["_cdc_op"], r["_u0"], r["_u2"]) for r in changes] == [
        (0, "u", 1, "b"), (1, "d", 1, "b"), (1, "u", 3, "b"), (2, "u", 4, "c")]
    # A table keyed by the Kafka key: Debezium splits a move itself, an update is never one.
    kafka_keyed = BatchDecoder(DecoderSpec("json", keep_before=False)).decode(rows)
    assert all(r["_cdc_reason"].startswith("key: the message has no Kafka key")
               for part in kafka_keyed for r in part.to_pylist())
