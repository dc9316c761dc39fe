"""The micro-batch callback when the workers of a decoding reader find the schema registry unavailable.

The reader's workers decode as they read; messages whose schema the registry did not give back come
to the driver as ``unavailable`` rows. The driver reads the same offsets again and decodes them
itself; while the registry stays down the table's batch is retried (transient) and finally the
table stops, with nothing committed. These tests drive :class:`~ingest.stream.callback.ForEachBatch` with
the embedded log and a registry that is down for a number of decodes (no Spark: the callback only
collects the frame's parts).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from harness.demo import prepare_workload

from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.state import load_state
from ingest.config import IngestConfig, TableSpec
from ingest.decode import columnar
from ingest.errors import LakeUnavailableError, RegistryUnavailableError
from ingest.lake.layout import TablePaths
from ingest.source.topiclog import ProducerRecord, TopicLog
from ingest.stream.callback import AllTablesStopped, ForEachBatch
from ingest.stream.report import RunReport, TableRun
from tests.harness import make_config

TABLE = "customers"


class _Frame:
    """What the callback needs of a micro-batch whose source decoded it: its parts."""

    def __init__(self, parts: pa.RecordBatch) -> None:
        self.parts = parts

    def toArrow(self) -> pa.Table:  # Spark's name
        return pa.Table.from_batches([self.parts])


def _config(workdir: Path) -> IngestConfig:
    config = make_config(workdir, value_format="json")
    # One table, without its suite: the path under test only.
    spec = next(t for t in config.tables if t.name == TABLE).model_copy(update={"expectations": None})
    config = config.model_copy(update={"tables": [spec]})
    prepare_workload(config, events=300, seed=5, malformed_fraction=0.0)
    return config


@pytest.fixture
def registry_down(monkeypatch) -> dict[str, int]:
    """The registry does not answer the first ``down`` decodes of a topic (workers' and driver's alike)."""
    calls = {"down": 0, "decodes": 0}
    real = columnar.BatchDecoder.decoder

    def decoder(self: columnar.BatchDecoder, topic: str) -> Any:
        calls["decodes"] += 1
        if calls["decodes"] <= calls["down"]:
            raise RegistryUnavailableError("schema registry: connection refused")
        return real(self, topic)

    monkeypatch.setattr(columnar.BatchDecoder, "decoder", decoder)
    return calls


def _run_one_batch(config: IngestConfig, monkeypatch, *,
                   stops: bool = False) -> tuple[ForEachBatch, RunReport, dict[str, int], list[Any]]:
    spec = config.tables[0]
    report = RunReport("r1", {spec.name: TableRun(spec.name)})
    handler = ForEachBatch(config, [spec], report, "r1", None, {})
    assert handler.read.source is not None  # the embedded log decodes as it reads
    reads: list[Any] = []
    real_read = handler.read.source.read_arrow

    def read_arrow(topic: str, start: dict[int, int], end: dict[int, int]) -> Any:
        reads.append((dict(start), dict(end)))
        return real_read(topic, start, end)

    monkeypatch.setattr(handler.read.source, "read_arrow", read_arrow)
    monkeypatch.setattr("ingest.stream.callback.wait_exponential", lambda **_: lambda _state: 0)  # no back-off
    end = handler.read.source.end_offsets(spec.topic)
    start = {p: 0 for p in end}
    # What the reader's workers hand over: the batch decoded there (the registry is down for it too).
    batch = real_read(spec.topic, start, end)
    frame = _Frame(handler.read.decoder.parts(batch))
    assert handler.overlap  # the batch is applied in the background; settle() waits for it
    if stops:
        with pytest.raises(AllTablesStopped):  # its only table stopped: the query ends
            handler(frame, 0)
            handler.settle()
    else:
        handler(frame, 0)
        handler.settle()
    handler.close()
    return handler, report, end, reads


def test_the_driver_reads_and_decodes_again_until_the_registry_answers(tmp_path, monkeypatch, registry_down):
    """Down for the workers and the driver's first try: the retry reads the offsets again and commits."""
    config = _config(tmp_path)
    registry_down["down"] = 2
    handler, report, end, reads = _run_one_batch(config, monkeypatch)
    run = report.tables[TABLE]
    assert run.error is None and not handler.stops
    # once on the driver right away, once more on the retry; both the batch's whole span
    assert reads == [({p: 0 for p in end}, end)] * 2
    [record] = run.batches
    assert record.received == sum(end.values()) and record.applied > 0
    state = load_state(TablePaths.of(config, TABLE).table)
    assert {p: state.applied_offset(config.tables[0].topic, p) for p in end} == {p: e - 1 for p, e in end.items()}


def test_a_registry_that_stays_down_stops_the_table_with_nothing_committed(tmp_path, monkeypatch, registry_down):
    config = _config(tmp_path)
    registry_down["down"] = 10**6
    handler, report, _end, reads = _run_one_batch(config, monkeypatch, stops=True)
    assert TABLE in handler.stops
    assert "registry" in (report.tables[TABLE].error or "") and not report.tables[TABLE].batches
    assert len(reads) == 3  # the driver's own decode, then each of the two retries
    assert load_state(TablePaths.of(config, TABLE).table).table is None


def _frames(config: IngestConfig, handler: ForEachBatch, pieces: int = 2) -> tuple[list[_Frame], dict[int, int]]:
    """The table's records as ``pieces`` micro-batches, decoded: every partition cut into that many
    equal parts (two by default: its first and second half)."""
    assert handler.read.source is not None
    topic = config.tables[0].topic
    end = handler.read.source.end_offsets(topic)
    cuts = [{p: e * i // pieces for p, e in end.items()} for i in range(pieces + 1)]
    frames = [_Frame(handler.read.decoder.parts(handler.read.source.read_arrow(topic, lo, hi)))
              for lo, hi in itertools.pairwise(cuts)]
    return frames, end


def test_the_next_batch_is_decoded_while_the_last_is_applied_and_they_commit_in_order(tmp_path, monkeypatch):
    import threading

    import ingest.stream.callback

    config = _config(tmp_path)
    spec = config.tables[0]
    report = RunReport("r1", {spec.name: TableRun(spec.name)})
    handler = ForEachBatch(config, [spec], report, "r1", None, {})
    frames, end = _frames(config, handler)
    applying, release, events = threading.Event(), threading.Event(), []
    real_apply = ingest.stream.callback.apply_batch

    def apply_batch(*args: Any, batch_id: int, **kwargs: Any) -> Any:
        events.append(f"apply {batch_id}")
        if batch_id == 0:
            applying.set()
            assert release.wait(30)
        return real_apply(*args, batch_id=batch_id, **kwargs)

    monkeypatch.setattr(ingest.stream.callback, "apply_batch", apply_batch)
    # The run's start-up is frozen once the first batch was applied (ingest.heap), not earlier.
    monkeypatch.setattr(ingest.stream.callback, "freeze_start_up", lambda: events.append("freeze"))
    real_to_arrow = _Frame.toArrow
    monkeypatch.setattr(_Frame, "toArrow", lambda self: events.append(f"decode {frames.index(self)}")
                        or real_to_arrow(self))
    handler(frames[0], 0)  # returns while batch 0 is still being applied
    assert applying.wait(30)
    second = threading.Thread(target=handler, args=(frames[1], 1))
    second.start()
    second.join(2)
    # Batch 1 was decoded while batch 0 waited; then it waits for batch 0 before it is applied.
    assert events == ["decode 0", "apply 0", "decode 1"] and second.is_alive()
    release.set()
    second.join(30)
    handler.settle()
    handler.close()
    assert events == ["decode 0", "apply 0", "decode 1", "freeze", "apply 1"]
    assert [r.batch_id for r in report.tables[TABLE].batches] == [0, 1]
    state = load_state(TablePaths.of(config, TABLE).table)
    assert {p: state.applied_offset(spec.topic, p) for p in end} == {p: e - 1 for p, e in end.items()}


def _whose_audit_append_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                              ) -> tuple[TableSpec, RunReport, ForEachBatch, list[_Frame]]:
    """A handler of the table's two micro-batches (:func:`_frames`) whose audit appends fail."""
    import ingest.stream.callback

    config = _config(tmp_path)
    spec = config.tables[0]
    report = RunReport("r1", {spec.name: TableRun(spec.name)})
    handler = ForEachBatch(config, [spec], report, "r1", None, {})
    frames, _end = _frames(config, handler)

    def append(*_args: Any, **_kwargs: Any) -> None:
        raise OSError("audit table: disk full")

    monkeypatch.setattr(ingest.records.audit.AuditLog, "append", append)  # the run's, kept open
    return spec, report, handler, frames


def test_a_failure_of_the_batch_applied_in_the_background_stops_the_query_at_the_next_step(tmp_path, monkeypatch):
    _spec, report, handler, frames = _whose_audit_append_fails(tmp_path, monkeypatch)
    handler(frames[0], 0)  # the audit append fails in the background
    with pytest.raises(OSError, match="disk full"):
        handler(frames[1], 1)  # decodes, then finds the last batch failed: batch 1 is not applied
    handler.close()
    assert isinstance(handler.error, OSError) and [r.batch_id for r in report.tables[TABLE].batches] == [0]


def test_a_batch_retried_after_a_transient_failure_asks_for_its_suspect_reads_once(tmp_path, monkeypatch):
    """The ask goes before the commit (:mod:`ingest.stream.rereads`); a batch whose commit fails twice
    and is tried three times asks once, and commits."""
    config = make_config(tmp_path, value_format="json", suites=False)
    spec = TableSpec(name="notes", topic="app.notes", primary_key=["id"])
    config = config.model_copy(update={"tables": [spec]})
    log = TopicLog(config.log_dir)
    log.create_topic(spec.topic, 1)

    def change(op: str, v: int, lsn: int, snapshot: str = "false") -> ProducerRecord:
        row = {"id": 1, "v": v}
        value = {"before": None, "after": row, "op": op, "ts_ms": 1_700_000_000_000,
                 "source": {"connector": "postgresql", "lsn": lsn, "ts_ms": 1_700_000_000_000, "snapshot": snapshot}}
        return ProducerRecord(0, json.dumps({"id": 1}).encode(), json.dumps(value).encode(), 1_700_000_000_000)

    # created; updated; then read by an incremental snapshot as it was before the update: suspect
    log.append(spec.topic, [change("c", 0, 10), change("u", 1, 20), change("r", 0, 30, "incremental")])
    report = RunReport("r1", {spec.name: TableRun(spec.name)})
    handler = ForEachBatch(config, [spec], report, "r1", None, {})
    assert handler.read.source is not None
    asked: list[Any] = []
    monkeypatch.setattr("ingest.stream.callback.ask_again",
                        lambda _config, _spec, suspects, batch: asked.append((suspects.keys, batch)) or True)
    monkeypatch.setattr("ingest.stream.callback.wait_exponential", lambda **_: lambda _state: 0)  # no back-off
    commits: list[int] = []
    real_commit = DeltaRsWriter.commit

    def commit(self: DeltaRsWriter, *args: Any, **kwargs: Any) -> Any:
        commits.append(1)
        if len(commits) in (2, 3):  # the second batch's first two tries
            raise LakeUnavailableError("the store did not answer")  # transient: tried again
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(DeltaRsWriter, "commit", commit)
    for batch, (lo, hi) in enumerate(((0, 1), (1, 3))):
        handler(_Frame(handler.read.decoder.parts(handler.read.source.read_arrow(spec.topic, {0: lo}, {0: hi}))), batch)
        handler.settle()
    handler.close()
    assert len(commits) == 4 and report.tables[spec.name].error is None
    assert asked == [(((1,),), 1)]  # once, for the second batch, however often it was tried
    assert load_state(TablePaths.of(config, spec.name).table).applied_offset(spec.topic, 0) == 2


def _offsets_log(directory: Path, topic: str, ends: list[dict[int, int]]) -> None:
    """A query's offsets log as Spark writes it: batch ``i`` ends at ``ends[i]``."""
    (directory / "offsets").mkdir(parents=True)
    for batch, offsets in enumerate(ends):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000, "conf": {}}
        (directory / "offsets" / str(batch)).write_text(
            "v1\n" + json.dumps(meta) + "\n" + json.dumps({topic: {str(p): o for p, o in offsets.items()}}))


class _Counted(_Frame):
    """A micro-batch frame that counts its Spark jobs (``toArrow``)."""

    jobs = 0

    def toArrow(self) -> pa.Table:
        _Counted.jobs += 1
        return super().toArrow()


def _applied_parts(monkeypatch) -> list[Any]:
    """Every part the callback hands the apply step, as it hands them."""
    import ingest.stream.callback

    seen: list[Any] = []
    real_apply = ingest.stream.callback.apply_batch

    def apply_batch(spec: TableSpec, paths: Any, parts: list[Any], **kwargs: Any) -> Any:
        seen.extend(parts)
        return real_apply(spec, paths, parts, **kwargs)

    monkeypatch.setattr(ingest.stream.callback, "apply_batch", apply_batch)
    return seen


def _rows(parts: list[Any]) -> list[dict[str, Any]]:
    rows = [row for part in parts for row in part.to_pylist()]
    return sorted(rows, key=lambda r: (r["_cdc_partition"], r["_cdc_offset"]))


def _checkpointed(tmp_path: Path) -> tuple[IngestConfig, RunReport, ForEachBatch]:
    """The one-table configuration and a handler whose query's checkpoint is ``tmp_path / "checkpoint"``."""
    config = _config(tmp_path)
    spec = config.tables[0]
    report = RunReport("r1", {spec.name: TableRun(spec.name)})
    return config, report, ForEachBatch(config, [spec], report, "r1", None, {}, checkpoint=tmp_path / "checkpoint")


def test_a_small_micro_batch_is_read_and_decoded_by_the_driver_without_a_spark_job(tmp_path, monkeypatch):
    """The offsets log says where batch 1 starts (batch 0's end) and ends: the driver reads that range
    and decodes it to the same parts the reader's tasks would have sent, the frame is not read, and
    the batch is applied before the callback returns (nothing is left to overlap)."""
    config, report, handler = _checkpointed(tmp_path)
    spec = config.tables[0]
    frames, end = _frames(config, handler)
    half = {p: e // 2 for p, e in end.items()}
    _offsets_log(tmp_path / "checkpoint", spec.topic, [half, end])
    seen = _applied_parts(monkeypatch)
    closed: list[bool] = []
    monkeypatch.setattr(handler.read.source, "close", lambda: closed.append(True))
    _Counted.jobs = 0
    left_behind: list[Any] = []
    monkeypatch.setattr(handler._applier, "submit", lambda *work: left_behind.append(work))
    handler(_Counted(frames[1].parts), 1)
    assert not left_behind and report.tables[TABLE].batches, "applied before the callback returned"
    handler.settle()
    assert not closed
    handler.close()
    assert closed == [True], "the source's reader (a Kafka consumer, kept between reads) is let go with the query"
    assert _Counted.jobs == 0, "the micro-batch was read through Spark"
    assert report.tables[TABLE].error is None
    from ingest.decode.parts import read_parts

    # what the reader's tasks decoded for the same range, as the frame carries it
    assert _rows(seen) == _rows(read_parts(frames[1].toArrow().column("part").to_pylist()))
    [record] = report.tables[TABLE].batches
    assert record.received == sum(end[p] - half[p] for p in end)
    state = load_state(TablePaths.of(config, TABLE).table)
    assert {p: state.applied_offset(spec.topic, p) for p in end} == {p: e - 1 for p, e in end.items()}


def test_the_offsets_log_is_read_once_per_micro_batch(tmp_path, monkeypatch):
    """Where a micro-batch starts is where the one before ends: read for that one, it is not read again
    (on an object store each is a request between micro-batches)."""
    import ingest.stream.callback

    config, report, handler = _checkpointed(tmp_path)
    spec = config.tables[0]
    frames, end = _frames(config, handler, pieces=3)
    _offsets_log(tmp_path / "checkpoint", spec.topic,
                 [{p: e * i // 3 for p, e in end.items()} for i in (1, 2, 3)])
    read: list[int] = []
    real = ingest.stream.decoding.checkpoints.batch_offsets

    def batch_offsets(directory: Any, batch: int, topics: Any) -> Any:
        read.append(batch)
        return real(directory, batch, topics)

    monkeypatch.setattr(ingest.stream.decoding.checkpoints, "batch_offsets", batch_offsets)
    handler(_Counted(frames[1].parts), 1)
    handler(_Counted(frames[2].parts), 2)
    handler.settle()
    handler.close()
    assert read == [0, 1, 2]
    assert [r.received for r in report.tables[TABLE].batches] == \
        [sum(e * (i + 1) // 3 - e * i // 3 for e in end.values()) for i in (1, 2)]


def test_a_batchs_audit_rows_are_appended_after_the_callback_returns_and_awaited_before_the_next(tmp_path,
                                                                                                  monkeypatch, caplog):
    """The audit append is off the path between micro-batches: the callback of a batch the driver read
    returns with its rows still being appended; :meth:`settle` (and the next batch's apply) waits for
    them, and a failed append fails there. A handler closed without settling says the rows are missing."""
    import threading

    import ingest.stream.callback
    from ingest.records import audit

    config, report, handler = _checkpointed(tmp_path)
    spec = config.tables[0]
    frames, end = _frames(config, handler)
    _offsets_log(tmp_path / "checkpoint", spec.topic, [{p: e // 2 for p, e in end.items()}, end])
    appending, release, failing, events = threading.Event(), threading.Event(), threading.Event(), []
    real_append = audit.AuditLog.append

    def append(self: Any, path: Any, records: list[Any]) -> None:
        events.append(f"append {[r.batch_id for r in records]}")
        appending.set()
        assert release.wait(30)
        if failing.is_set():
            raise OSError("audit table: disk full")
        real_append(self, path, records)
        events.append("appended")

    monkeypatch.setattr(ingest.records.audit.AuditLog, "append", append)
    handler(_Counted(frames[1].parts), 1)  # a batch the driver read: applied before the callback returns
    assert report.tables[TABLE].batches and appending.wait(30) and events == ["append [1]"]
    settling = threading.Thread(target=handler.settle)
    settling.start()
    settling.join(1)
    assert settling.is_alive(), "settle did not wait for the audit append"
    release.set()
    settling.join(30)
    assert events == ["append [1]", "appended"]
    assert audit.read(TablePaths.of(config, TABLE).audit)["batch_id"].to_pylist() == [1]
    handler.close()

    # A failed append fails the settle after it (the next batch's, or the query's end).
    config, report, handler = _checkpointed(tmp_path / "second")
    frames, end = _frames(config, handler)
    _offsets_log(tmp_path / "second" / "checkpoint", spec.topic, [{p: e // 2 for p, e in end.items()}, end])
    failing.set()
    handler(_Counted(frames[1].parts), 1)
    with pytest.raises(OSError, match="disk full"):
        handler.settle()
    assert isinstance(handler.error, OSError)
    handler.close()
    # Closed without a settle (the appends still fail): a warning, and the next run's reconcile restores the rows.
    assert failing.is_set()
    config, report, handler = _checkpointed(tmp_path / "third")
    frames, end = _frames(config, handler)
    _offsets_log(tmp_path / "third" / "checkpoint", spec.topic, [{p: e // 2 for p, e in end.items()}, end])
    handler(_Counted(frames[1].parts), 1)
    handler.close()
    assert any("audit rows were not appended (OSError: audit table: disk full)" in m for m in caplog.messages)


def test_a_failed_audit_append_fails_the_next_batch_before_it_applies_whatever_path_it_takes(tmp_path, monkeypatch):
    """A query that applies in the callback (Spark's own Kafka source, tables planned on the executors)
    has no settle between batches: the next batch's apply raises the failed append, applying nothing."""
    from ingest.decode.parts import read_parts

    spec, report, handler, frames = _whose_audit_append_fails(tmp_path, monkeypatch)
    parts = [read_parts(frame.toArrow().column("part").to_pylist()) for frame in frames]
    handler._apply_all([spec], frames[0], parts[0], 0, 1)  # returns: its rows are appended in the background
    with pytest.raises(OSError, match="disk full"):
        handler._apply_all([spec], frames[1], parts[1], 1, 1)
    handler.close()
    assert [r.batch_id for r in report.tables[TABLE].batches] == [0]


def _audit_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval: float
                   ) -> tuple[IngestConfig, ForEachBatch, list[tuple[_Frame, list[Any]]], list[list[Any]]]:
    """A handler whose audit rows go in one commit every ``interval`` seconds, the table's records as
    three micro-batches (frame and parts), and the batch ids of each audit append as it is made."""
    import ingest.stream.callback
    from ingest.decode.parts import read_parts
    from ingest.records import audit

    config = _config(tmp_path)
    config = config.model_copy(update={"target": config.target.model_copy(update={"audit_interval_seconds": interval})})
    spec = config.tables[0]
    handler = ForEachBatch(config, [spec], RunReport("r1", {spec.name: TableRun(spec.name)}), "r1", None, {})
    frames, _end = _frames(config, handler, pieces=3)
    batches = [(frame, read_parts(frame.toArrow().column("part").to_pylist())) for frame in frames]
    appends: list[list[Any]] = []
    real_append = audit.AuditLog.append

    def append(self: Any, path: Any, records: list[Any]) -> None:
        appends.append([r.batch_id for r in records])
        real_append(self, path, records)

    monkeypatch.setattr(ingest.records.audit.AuditLog, "append", append)
    return config, handler, batches, appends


def test_the_audit_rows_of_an_interval_go_in_one_commit_the_first_batchs_at_once(tmp_path, monkeypatch):
    from ingest.records import audit

    config, handler, batches, appends = _audit_appends(tmp_path, monkeypatch, 30)
    spec = config.tables[0]
    for batch_id, (frame, parts) in enumerate(batches):
        handler._apply_all([spec], frame, parts, batch_id, 1)
        handler.audit.wait()
    assert appends == [[0]]  # the first at once, the next two wait for the interval
    handler.close()  # and go when the run ends
    assert appends == [[0], [1, 2]]
    assert sorted(audit.read(TablePaths.of(config, TABLE).audit)["batch_id"].to_pylist()) == [0, 1, 2]

    config, handler, batches, appends = _audit_appends(tmp_path / "each", monkeypatch, 0)
    for batch_id, (frame, parts) in enumerate(batches):
        handler._apply_all([spec], frame, parts, batch_id, 1)
    handler.close()
    assert appends == [[0], [1], [2]]  # 0: a commit per micro-batch, as before the setting


def test_audit_rows_waiting_for_their_interval_go_when_it_ends_without_another_batch(tmp_path, monkeypatch):
    config, handler, batches, appends = _audit_appends(tmp_path, monkeypatch, 3.0)
    spec = config.tables[0]
    handler._apply_all([spec], *batches[0], 0, 1)
    handler._apply_all([spec], *batches[1], 1, 1)
    assert appends == [[0]]
    deadline = time.monotonic() + 30
    while appends == [[0]] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert appends == [[0], [1]]  # the stream went quiet: the interval's end appended them
    handler._apply_all([spec], *batches[2], 2, 1)
    handler.close()
    assert appends == [[0], [1], [2]]


@pytest.mark.parametrize("case", ["first batch", "no end of the batch before", "not small"])
def test_a_micro_batch_the_driver_cannot_place_or_that_is_not_small_is_read_through_spark(tmp_path, monkeypatch,
                                                                                         case):
    config, report, handler = _checkpointed(tmp_path)
    spec = config.tables[0]
    frames, end = _frames(config, handler)
    half = {p: e // 2 for p, e in end.items()}
    if case == "first batch":
        _offsets_log(tmp_path / "checkpoint", spec.topic, [half])
        frame, batch = _Counted(frames[0].parts), 0
    else:
        _offsets_log(tmp_path / "checkpoint", spec.topic, [half, end])
        frame, batch = _Counted(frames[1].parts), 1
        if case == "no end of the batch before":
            (tmp_path / "checkpoint" / "offsets" / "0").unlink()
        else:  # a batch of MIN_PIECE records or more is Spark's
            monkeypatch.setattr("ingest.stream.decoding.MIN_PIECE", sum(end[p] - half[p] for p in end))
    _Counted.jobs = 0
    handler(frame, batch)
    handler.settle()
    handler.close()
    assert _Counted.jobs == 1 and report.tables[TABLE].error is None
    assert [r.batch_id for r in report.tables[TABLE].batches] == [batch]


def test_a_driver_read_that_fails_ends_the_query_with_the_sources_own_error(tmp_path, monkeypatch):
    """As a reader's task that cannot read its range fails the micro-batch: nothing is applied, and
    the query's error is the source's (one line with its cause), not a failure of some later step."""
    from ingest.errors import SourceUnavailableError

    config, report, handler = _checkpointed(tmp_path)
    spec = config.tables[0]
    frames, end = _frames(config, handler)
    _offsets_log(tmp_path / "checkpoint", spec.topic, [{p: e // 2 for p, e in end.items()}, end])

    def read_arrow(topic: str, start: dict[int, int], stop: dict[int, int]) -> Any:
        raise SourceUnavailableError(f"kafka at 127.0.0.1:1: nothing from {topic}[0] after offset {start[0]} in 30 s")

    assert handler.read.source is not None
    monkeypatch.setattr(handler.read.source, "read_arrow", read_arrow)
    _Counted.jobs = 0
    with pytest.raises(SourceUnavailableError, match="nothing from"):
        handler(_Counted(frames[1].parts), 1)
    handler.close()
    assert isinstance(handler.error, SourceUnavailableError) and _Counted.jobs == 0
    assert report.tables[TABLE].batches == []
    assert load_state(TablePaths.of(config, TABLE).table).applied_offset(spec.topic, 0) is None
