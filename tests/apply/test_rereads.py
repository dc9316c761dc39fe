"""Incremental snapshot reads that contradict the change streamed before them are named, to be read again.

PostgreSQL streams a commit a moment before other sessions see it, so an incremental snapshot chunk
can read a row as it was before a change Debezium already streamed, and emit that read after the
change (tests/stack/test_resnapshot.py makes it happen on the real stack). Applied by position, the
read puts the old row back; the journey names its key (``suspect_reads``) so the stream asks the
connector to read it again. Each case here is a topic as Debezium writes it, cut into batches every way.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pytest

from ingest.config import IngestConfig, TableSpec
from ingest.lake.delta import open_table, read_all
from ingest.rules.rereads import SuspectReads, condition, suspect_reads
from ingest.stream.rereads import MOST, ask_again
from tests.harness import Topic, current_writer, ingest_batch, key, paths_in, pg

pytestmark = [pytest.mark.usefixtures("apply_engine"), pytest.mark.one_writer]

PLACEHOLDER = "__debezium_unavailable_value"
SPECS = {"hard": TableSpec(name="t", topic="t", primary_key=["id"]),
         "soft": TableSpec(name="t", topic="t", primary_key=["id"], delete_mode="soft"),
         "scd2": TableSpec(name="t", topic="t", primary_key=["id"], history_mode="scd2")}


def row(i: int, v: int, note: str = "n") -> dict[str, Any]:
    return {"id": i, "v": v, "note": note}


def read(topic: Topic, r: dict[str, Any], lsn: int) -> None:
    topic.send(key(r["id"]), pg("r", r, lsn=lsn, snapshot="incremental"))


def story() -> tuple[Topic, set[int]]:
    """Each key's history, and which keys' incremental reads contradict what was streamed before them."""
    t = Topic()
    for i in range(1, 8):
        t.send(key(i), pg("c", row(i, 0), lsn=10 + i))
    t.send(key(1), pg("u", row(1, 1), lsn=30))
    read(t, row(1, 0), lsn=40)  # 1: read as before its update: suspect
    t.send(key(2), pg("u", row(2, 1), lsn=31))
    read(t, row(2, 1), lsn=41)  # 2: read as it is: fine
    t.send(key(3), pg("d", row(3, 0), lsn=32))
    read(t, row(3, 0), lsn=42)  # 3: read after its delete: suspect
    t.send(key(4), pg("u", row(4, 0, PLACEHOLDER), lsn=33))
    read(t, row(4, 0, "n"), lsn=43)  # 4: the update did not know the note; the read agrees on the rest: fine
    read(t, row(5, 9), lsn=44)  # 5: differs from its create: suspect ...
    read(t, row(5, 0), lsn=45)  # ... and read again: after a read, never suspect
    t.send(key(6), pg("u", row(6, 1), lsn=34))
    read(t, row(6, 0), lsn=46)  # 6: a stale read ...
    read(t, row(6, 1), lsn=47)  # ... read again: the row comes right
    read(t, row(8, 0), lsn=48)  # 8: nothing known of it before: fine
    t.send(key(9), pg("c", row(9, 0), lsn=50))
    t.send(key(9), pg("d", row(9, 0), lsn=51))
    read(t, row(9, 0), lsn=52)  # 9: read after its delete: suspect, and applied as that delete ...
    read(t, row(9, 2), lsn=53)  # ... read again: the source holds it (its insert never reached the topic): back
    return t, {1, 3, 5, 6, 9}


#: The story's live rows, ``id: v``, once applied.
LIVE = {1: 0, 2: 1, 4: 0, 5: 0, 6: 1, 7: 0, 8: 0, 9: 2}


def run(tmp_path: Any, spec: TableSpec, topic: Topic, cuts: list[int]) -> tuple[Any, set[int], int]:
    paths = paths_in(tmp_path / "-".join(map(str, cuts)))
    start, named, counted = 0, set(), 0
    for batch_id, end in enumerate([*cuts, len(topic.messages)]):
        if end > start:
            result = ingest_batch(spec, paths, topic, topic.messages[start:end], batch_id=batch_id)
            if result.suspect_reads:
                named |= {k[0] for k in result.suspect_reads.keys}
            counted += result.record.suspect_reads if result.record else 0
        start = end
    return paths, named, counted


class _Recorded:
    """A writer that notes its commits in ``events``; the rest is the wrapped writer's."""

    def __init__(self, writer: Any, events: list[Any]) -> None:
        self._writer, self._events = writer, events

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self._events.append("commit")
        return self._writer.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def test_the_suspect_reads_are_asked_for_before_the_batch_commits(tmp_path: Any) -> None:
    """A run that stops after the commit must have asked already (its replay finds the reads stored
    and names nothing); one that stops before asks again when it applies the batch again."""
    topic, suspect = story()
    events: list[Any] = []
    writer = _Recorded(current_writer(), events)
    ingest_batch(SPECS["hard"], paths_in(tmp_path), topic, topic.messages, writer=writer,  # type: ignore[arg-type]
                 on_suspect_reads=lambda found: events.append({k[0] for k in found.keys}))
    assert events == [suspect, "commit"]


@pytest.mark.parametrize("mode", sorted(SPECS))
def test_the_reads_that_contradict_a_streamed_change_are_named_however_the_stream_is_cut(tmp_path: Any,
                                                                                         mode: str) -> None:
    spec = SPECS[mode]
    topic, suspect = story()
    n = len(topic.messages)
    for cuts in ([], [7], [9], [11], [14], [16], [17], list(range(1, n))):
        paths, named, counted = run(tmp_path, spec, topic, cuts)
        assert named == suspect, f"cut at {cuts}"
        assert counted == len(suspect), f"cut at {cuts}"
        rows = read_all(open_table(paths.table)).to_pylist()
        if mode == "scd2":
            rows = [r for r in rows if r["_cdc_is_current"]]
        live = {r["id"]: r["v"] for r in rows if not r["_cdc_deleted"]}
        # applied by position, as any change: the stale reads hold until the re-read comes; but a read
        # after a delete stays that delete (3), as no read again brings back a row the source does not hold
        assert live == LIVE, f"cut at {cuts}"


def test_initial_snapshot_reads_are_never_suspect(tmp_path: Any) -> None:
    t = Topic()
    t.send(key(1), pg("c", row(1, 0), lsn=10))
    t.send(key(1), pg("u", row(1, 1), lsn=20))
    t.send(key(1), pg("r", row(1, 0), lsn=30, snapshot="true"))
    _, named, counted = run(tmp_path, SPECS["hard"], t, [])
    assert named == set() and counted == 0


def _images(*rows: tuple[int, str, str, int, float | None, str | None]) -> pa.Table:
    """Batch changes: ``(id, position, op, offset, x, note)``, reads incremental."""
    return pa.table({"id": [r[0] for r in rows], "_cdc_position": [r[1] for r in rows],
                     "_cdc_offset": pa.array([r[3] for r in rows], pa.int64()), "_cdc_op": [r[2] for r in rows],
                     "_cdc_snapshot": ["incremental" if r[2] == "r" else "false" for r in rows],
                     "_cdc_toast": pa.array([None] * len(rows), pa.list_(pa.string())),
                     "x": pa.array([r[4] for r in rows], pa.float64()), "note": [r[5] for r in rows]})


def _stored(*rows: tuple[int, str, str, bool, list[str] | None, float | None]) -> pa.Table:
    """Stored rows: ``(id, position, op, deleted, unknown columns, x)``; the table has no ``note`` yet."""
    return pa.table({"id": [r[0] for r in rows], "_cdc_position": [r[1] for r in rows], "_cdc_op": [r[2] for r in rows],
                     "_cdc_deleted": [r[3] for r in rows],
                     "_cdc_unknown_columns": pa.array([r[4] for r in rows], pa.list_(pa.string())),
                     "x": pa.array([r[5] for r in rows], pa.float64())})


def test_the_rule_compares_only_what_the_previous_image_knows() -> None:
    images = _images((1, "c", "r", 0, 1.0, "m"), (2, "c", "r", 1, 5.0, "m"), (3, "c", "r", 2, float("nan"), "m"),
                     (4, "c", "r", 3, 1.0, "m"), (5, "c", "r", 4, 1.0, "m"), (5, "b", "u", 5, 1.0, "m"))
    stored = _stored((1, "a", "u", False, None, 1.0),  # agrees on x; the table has no note column yet
                     (2, "a", "u", False, ["x"], 1.0),  # x unknown: nothing to contradict
                     (3, "a", "c", False, None, float("nan")),  # NaN is NaN
                     (4, "b", "u", True, None, 1.0),  # its image, then its soft delete at the same position
                     (5, "b", "u", False, None, 9.0))  # the batch's change at that position comes after it
    found = suspect_reads(images, stored, None, ("id",), ["x", "note"], history=False)
    assert found.keys == ((4,),)
    found = suspect_reads(images, stored, pa.table({"id": [1], "_cdc_position": ["b"]}), ("id",), ["x", "note"],
                          history=False)
    assert found.keys == ((1,), (4,))  # 1: a remembered delete after its stored row
    assert found.deleted == ((1, "c"), (4, "c"))  # both follow a delete: each read, at its position
    at_a_read = pa.table({"id": [1], "_cdc_position": ["b0"]})  # a read after a delete, applied as it
    assert suspect_reads(images, stored, at_a_read, ("id",), ["x", "note"], history=False).keys == ((4,),)
    assert suspect_reads(images, stored.set_column(5, "x", pa.array([2.0] * 5)), None, ("id",), ["x"],
                         history=False).keys == ((1,), (3,), (4,))
    retyped = stored.set_column(5, "x", pa.array(["1.0", None, "nan", "1.0", "9.0"]))  # ingest retype x string
    assert suspect_reads(images, retyped, None, ("id",), ["x", "note"], history=False).keys == ((4,),)
    dated = stored.set_column(5, "x", pa.array([5] * 5, pa.date32()))  # no cast from the batch's type: text
    assert suspect_reads(images, dated, None, ("id",), ["x"], history=False).keys == ((1,), (3,), (4,))


def test_the_condition_reads_alike_in_postgresql_and_mysql() -> None:
    assert condition(SuspectReads(("id",), ((5,), (9,)))) == "id IN (5, 9)"
    assert condition(SuspectReads(("region", "n"), (("eu", 1), ("o'hare", 2)))) == \
        "(region, n) IN (('eu', 1), ('o''hare', 2))"
    for unsure in (SuspectReads(("Id",), ((5,),)), SuspectReads(("id",), (("a\\b",),)),
                   SuspectReads(("id",), ((1.5,),)), SuspectReads(("id",), ())):
        assert condition(unsure) is None


def test_without_reread_the_run_logs_the_command_that_reads_them_again(caplog: Any) -> None:
    config = IngestConfig.model_validate({"workdir": "w", "source": {"kind": "kafka", "kafka": {
        "bootstrap_servers": "127.0.0.1:1"}}, "tables": [{"name": "t", "topic": "db.public.t"}]})
    with caplog.at_level(logging.WARNING):
        asked = ask_again(config, config.table("t"), SuspectReads(("id",), ((5,), (9,))), batch=3)
    assert not asked
    assert 'to read them again: ingest resnapshot t --where "id IN (5, 9)"' in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ask_again(config, config.table("t"), SuspectReads(("Id",), ((5,),)), batch=3)
    assert "--where with a condition that selects them" in caplog.text and "keys 5" in caplog.text
    caplog.clear()
    many = SuspectReads(("id",), tuple((i,) for i in range(MOST + 1)))
    with caplog.at_level(logging.WARNING):
        ask_again(config.model_copy(update={"source": config.source.model_copy(update={"kafka": config.source.kafka
                  .model_copy(update={"reread_suspect_reads": True})})}), config.table("t"), many, batch=3)
    (line,) = [r.getMessage() for r in caplog.records]  # asked for nothing: no broker at 127.0.0.1:1 to refuse it
    assert f"keys 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and {MOST - 9:,} more" in line and "--where" not in line
    assert "ingest verify --source-db" in line


def test_a_signal_table_the_run_cannot_reach_is_one_logged_line(caplog: Any, monkeypatch: Any) -> None:
    kafka = {"bootstrap_servers": "127.0.0.1:1", "reread_suspect_reads": True, "signal_table": "cdc.debezium_signal"}
    config = IngestConfig.model_validate({"workdir": "w", "source": {"kind": "kafka", "kafka": kafka},
                                          "tables": [{"name": "t", "topic": "db.public.t"}]})
    monkeypatch.delenv("CDC_SIGNAL_DB", raising=False)
    suspects = SuspectReads(("id",), ((5,),))
    with caplog.at_level(logging.WARNING):
        assert not ask_again(config, config.table("t"), suspects, batch=3)
    assert "CDC_SIGNAL_DB (the environment or the secrets file) names no database" in caplog.text
    assert '--where "id IN (5)" --signal-table cdc.debezium_signal --source-db "$CDC_SIGNAL_DB"' in caplog.text
    caplog.clear()
    monkeypatch.setenv("CDC_SIGNAL_DB", "host=127.0.0.1 port=1 dbname=cdc user=u password=hunter2-secret "
                                        "connect_timeout=2")
    with caplog.at_level(logging.WARNING):
        assert not ask_again(config, config.table("t"), suspects, batch=3)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "could not ask the connector to read them again (SourceUnavailableError: source database" in line
    assert "hunter2-secret" not in line and "\n" not in line
    caplog.clear()  # whatever else stops the signal: one line too, and the batch goes on to its commit
    monkeypatch.setattr("ingest.stream.rereads.insert_at", lambda *_: (_ for _ in ()).throw(RuntimeError("odd\nmore")))
    with caplog.at_level(logging.WARNING):
        assert not ask_again(config, config.table("t"), suspects, batch=3)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "could not ask the connector to read them again (RuntimeError: odd)" in line, line
