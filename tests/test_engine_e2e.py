"""End to end: simulator -> topic log -> the engine -> Delta -> verification. A delta-rs run of this
size is applied by the driver alone (``source.driver_seconds``); delta-spark's, and the tests that
pin ``spark_only``, go through Spark's queries on the shared SparkSession."""

from __future__ import annotations

import base64
import json
import shutil
from typing import Any

import pytest
import yaml
from harness.demo import TableFingerprint, explained_keys, prepare_workload, truth_dir, verify_all

from ingest.records import audit, quarantine
from ingest.source.topiclog import ProducerRecord, TopicLog
from ingest.stream.runner import Runner
from tests.harness import make_config

pytestmark = pytest.mark.spark

#: Records per micro-batch: the workload's ~2,650 records in four batches (duplicates and
#: reorders both within a batch and across batches); a delta-spark batch costs seconds, whatever its size.
BATCH = 700
#: And per table, on the driver: a run the driver applies alone (``source.driver_seconds``) cuts
#: each table's backlog into batches of its own, which this keeps about as small as a table's share
#: of a micro-batch. (Spark's micro-batches share BATCH already; bounding them too would only add
#: delta-spark batches, seconds each.)
TABLE_BATCH = BATCH // 4


@pytest.fixture(scope="module", params=["delta-rs", "delta-spark-executors"])
def ingested(request, tmp_path_factory, spark):
    """A small workload with duplicates, reorders, a truncate, an added column, TOAST and malformed input,
    applied on each placement: on the driver, written by delta-rs, and on the executors, written by
    delta-spark (``target.plan_on``; the demo's suites validate the winners, which batches this small
    bring to the driver: ``quality.driver_rows``, while ``tests/apply/test_spark_batch.py`` validates
    them with GX's Spark engine in the same journey). delta-spark's
    commits of a driver's plan take a smaller run of the same simulator in ``tests/lake/test_s3_lake.py``
    and ``tests/dagster/test_materialize.py``, and every per-key rule in ``tests/apply/test_writers_agree.py``."""
    engine = request.param.removesuffix("-executors")
    config = make_config(tmp_path_factory.mktemp("e2e"), engine=engine, batch=BATCH,
                         table_batch=TABLE_BATCH if engine == "delta-rs" else None,
                         plan_on="executors" if request.param.endswith("-executors") else "driver")
    prepare_workload(config, events=2500, seed=3, malformed_fraction=0.02)
    from ingest.apply.placement.executors import ExecutorsPlacement

    planned: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        real = ExecutorsPlacement.plan_current
        patch.setattr(ExecutorsPlacement, "plan_current", lambda self, *a, **k: planned.append(1) or real(
            self, *a, **k))
        report = Runner(config, spark=spark).run()
    batches = sum(len(t.batches) for t in report.tables.values())
    # the executors planned most batches (a batch of only truncates, say, goes to the driver), or none
    assert len(planned) >= batches - 3 if request.param.endswith("-executors") else not planned
    return config, report


@pytest.fixture(scope="module")
def ingested_history(tmp_path_factory, spark):
    """The same workload with every table keeping every version (``history_mode: scd2``), on the
    driver. ``tests/apply/test_spark_batch.py`` compares the versions the executors derive with the
    driver's, batch by batch, and ``tests/proof/torture/test_crash_windows.py`` crashes and replays
    them there."""
    config = make_config(tmp_path_factory.mktemp("e2e-scd2"), history_mode="scd2", batch=BATCH,
                         table_batch=TABLE_BATCH)
    prepare_workload(config, events=2500, seed=3, malformed_fraction=0.02)
    return config, Runner(config, spark=spark).run()


def test_history_tables_hold_the_source_as_current_rows_and_well_formed_versions(ingested_history, spark):
    """Issue 12.1 on the simulator's history: every key's versions are those of the source's own change
    history (late, duplicated and reordered deliveries, a truncate, an added column, TOAST), the
    current ones equal the source's truth, the change feed folded by version is the table, and a
    replay of everything changes nothing."""
    from harness.simulator import Truth

    from ingest.commit.state import load_state
    from ingest.lake.delta import read_all
    from ingest.lake.layout import TablePaths
    from ingest.read.changes import ChangeRange, changes
    from tests.harness import fold_feed, history_problems, live_by_key, stored_versions, versions_of_history

    config, report = ingested_history
    assert not report.failed
    for result in verify_all(config):
        assert result.ok, (result.table, result.examples)
    before = {}
    for spec in config.tables:
        state = load_state(config.table_path(spec.name))
        assert state.table is not None and state.history and state.key_columns, spec.name
        keys = list(state.key_columns)
        assert not history_problems(state.table, keys), spec.name
        everything = read_all(state.table)
        assert everything.num_rows > len(live_by_key(state.table, keys)), spec.name  # past versions are kept
        # The keys the quality gate holds differ from the source, and only those (as verify_all says).
        held = explained_keys(TablePaths.of(config, spec.name).quarantine, spec.name, tuple(keys))
        want = versions_of_history(Truth.load(truth_dir(config)).history[spec.name], keys)
        got = stored_versions(state.table, keys)
        compared = (want.keys() | got.keys()) - held
        assert len(compared) > 100, spec.name
        assert {k: got.get(k) for k in compared} == {k: want.get(k) for k in compared}, spec.name
        versions = [*keys, "_cdc_position"]
        feed = changes(config, spec.name, ChangeRange(from_version=0))
        assert fold_feed(feed, versions) == live_by_key(state.table, versions), spec.name
        before[spec.name] = TableFingerprint.of(config.table_path(spec.name))
    assert all(r["balanced"] for r in audit.read(config.tables_root / "_cdc_audit").to_pylist())
    Runner(config, spark=spark).run(from_beginning=True)
    assert before == {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}


def test_tables_equal_the_source(ingested):
    config, report = ingested
    assert not report.failed
    for result in verify_all(config):
        assert result.ok, (result.table, result.examples)


def test_every_tables_change_feed_folds_to_its_rows(ingested):
    """Issue 12.7 on the simulator's history (duplicates, reorders, a truncate, an added column, TOAST):
    each table's feed from version 0, folded by key, is the table that equals the source's truth."""
    from ingest.commit.state import load_state
    from ingest.read.changes import ChangeRange, changes
    from tests.harness import fold_feed, live_by_key

    config, _ = ingested
    for spec in config.tables:
        state = load_state(config.table_path(spec.name))
        assert state.table is not None and state.key_columns, spec.name
        feed = changes(config, spec.name, ChangeRange(from_version=0))
        assert set(feed["_change_type"].to_pylist()) >= {"insert", "update_preimage", "update_postimage"}, spec.name
        live = live_by_key(state.table, list(state.key_columns))
        assert live and fold_feed(feed, list(state.key_columns)) == live, spec.name


def test_several_batches_and_balance_in_every_batch(ingested):
    config, _ = ingested
    rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    assert len(rows) >= 6
    assert all(r["balanced"] for r in rows)
    assert sum(r["superseded"] + r["stale"] for r in rows) > 0  # duplicates were really exercised


def test_malformed_messages_are_quarantined_with_reasons(ingested):
    config, _ = ingested
    from harness.simulator import Truth

    counts = Truth.load(truth_dir(config)).counts
    injected = sum(c.get("malformed", 0) for c in counts.values())
    held = quarantine.read(config.tables_root / "_cdc_quarantine").to_pylist()
    assert injected > 0 and len(held) == injected
    assert all((r["reason"] and r["raw_value"] is not None) or r["raw_key"] is not None for r in held)
    rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    assert sum(r["quarantined"] for r in rows) == injected


def test_replay_of_everything_changes_no_table(ingested, spark):
    config, _ = ingested
    before = {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    report = Runner(config, spark=spark).run(from_beginning=True)
    after = {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    assert before == after
    assert all(not t.batches for t in report.tables.values())
    assert sum(t.already_applied for t in report.tables.values()) > 2500


def test_each_tables_share_of_a_micro_batch_stays_within_its_bound(tmp_path, spark):
    config = make_config(tmp_path, batch=100_000, table_batch=150, spark_only=True)  # a micro-batch tables share
    prepare_workload(config, events=1200, seed=5, malformed_fraction=0.0)
    report = Runner(config, spark=spark).run()
    assert not report.failed
    rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    assert 140 <= max(r["received"] for r in rows) <= 150  # the bound holds (shares round down)
    by_batch: dict[int, int] = {}
    for r in rows:
        by_batch[r["batch_id"]] = by_batch.get(r["batch_id"], 0) + r["received"]
    assert max(by_batch.values()) > 150  # a micro-batch carries several tables' shares
    assert all(v.ok for v in verify_all(config))


def _json_change(op: str, row: dict, lsn: int) -> bytes:
    value = {"before": None if op == "c" else row, "after": None if op == "d" else row,
             "source": {"connector": "postgresql", "lsn": lsn, "sequence": json.dumps([str(lsn - 1), str(lsn)]),
                        "ts_ms": 1_700_000_000_000, "snapshot": "false"},
             "op": op, "ts_ms": 1_700_000_000_000}
    return json.dumps(value).encode()


def _produce(log: TopicLog, topic: str, changes: list[tuple[str, dict, int]], partition: int = 0) -> None:
    if not log.exists(topic):
        log.create_topic(topic, 2)
    log.append(topic, [ProducerRecord(partition, json.dumps({"id": row["id"]}).encode(), _json_change(op, row, lsn),
                                      1_700_000_000_000) for op, row, lsn in changes])


def test_lost_checkpoint_resumes_from_delta_without_rereading(tmp_path, spark):
    config = make_config(tmp_path, value_format="json", spark_only=True,
                         extra_tables=[{"name": "notes", "topic": "app.notes"}])
    config = config.model_copy(update={"tables": tuple(t for t in config.tables if t.name == "notes")})
    log = TopicLog(config.log_dir)
    _produce(log, "app.notes", [("c", {"id": i, "body": f"v{i}"}, 100 + i) for i in range(10)])
    first = Runner(config, spark=spark).run()
    assert first.tables["notes"].total("inserted") == 10
    shutil.rmtree(config.checkpoint_root)
    _produce(log, "app.notes", [("u", {"id": 1, "body": "changed"}, 200), ("d", {"id": 2}, 201)])
    second = Runner(config, spark=spark).run()
    run = second.tables["notes"]
    assert run.already_applied == 0  # resumed from the Delta log: no re-read
    assert run.total("received") == 2 and run.total("updated") == 1 and run.total("deleted") == 1


def test_incompatible_change_stops_only_that_table(tmp_path, spark):
    config = make_config(tmp_path, value_format="json", extra_tables=[
        {"name": "good", "topic": "app.good"}, {"name": "bad", "topic": "app.bad"}])
    config = config.model_copy(update={"tables": tuple(t for t in config.tables if t.name in ("good", "bad"))})
    log = TopicLog(config.log_dir)
    _produce(log, "app.good", [("c", {"id": 1, "body": "x"}, 10)])
    _produce(log, "app.bad", [("c", {"id": 1, "body": "x"}, 10)])
    assert not Runner(config, spark=spark).run().failed
    _produce(log, "app.bad", [("u", {"id": 1, "body": 5}, 20)])
    _produce(log, "app.good", [("u", {"id": 1, "body": "y"}, 20)])
    report = Runner(config, spark=spark).run()
    assert report.failed == ["bad"]
    assert "'body'" in report.tables["bad"].error and "string" in report.tables["bad"].error
    assert report.tables["good"].total("updated") == 1


def test_produce_command_appends_json_lines(tmp_path):
    from typer.testing import CliRunner

    from ingest.cli import app

    config_path = tmp_path / "c.yaml"
    config_path.write_text(yaml.safe_dump({"workdir": str(tmp_path), "tables": [{"name": "x", "topic": "t.x"}]}))
    lines = "\n".join(json.dumps({"key": base64.b64encode(b"k%d" % i).decode(), "value": None, "partition": i % 2,
                                  "timestamp": 5}) for i in range(5))
    result = CliRunner().invoke(app, ["produce", "t.x", "-c", str(config_path), "--partitions", "2"], input=lines)
    assert result.exit_code == 0, result.output
    log = TopicLog(tmp_path / "topics")
    assert log.end_offsets("t.x") == {0: 3, 1: 2}
    assert log.read("t.x", 1, 0, 2)["key"].to_pylist() == [b"k1", b"k3"]


def test_continuous_mode_picks_up_records_appended_while_running(tmp_path, spark, monkeypatch):
    import threading
    import time

    config = make_config(tmp_path, value_format="json", extra_tables=[{"name": "live", "topic": "app.live"}])
    config = config.model_copy(update={"tables": tuple(t for t in config.tables if t.name == "live"),
                                       "source": config.source.model_copy(update={"trigger_seconds": 0.5})})
    log = TopicLog(config.log_dir)
    _produce(log, "app.live", [("c", {"id": 1, "body": "a"}, 10)])
    from ingest.lake.delta import open_table, read_all

    def live_rows() -> int:
        table = open_table(config.table_path("live"))
        return read_all(table).num_rows if table is not None else 0

    def wait_for(rows: int) -> None:
        deadline = time.monotonic() + 60
        while live_rows() < rows and time.monotonic() < deadline:
            time.sleep(0.5)

    # Which micro-batches the driver read itself, from where Spark's offsets log says they start and end.
    from ingest.stream.decoding import Decoding

    read_here: list[tuple[int, int | None]] = []
    real_read_here = Decoding.read_here

    def spy(self: Decoding, batch_id: int) -> Any:
        parts = real_read_here(self, batch_id)
        read_here.append((batch_id, None if parts is None else sum(p.num_rows for p in parts)))
        return parts

    monkeypatch.setattr(Decoding, "read_here", spy)
    reports = []
    engine = Runner(config, spark=spark)
    runner = threading.Thread(target=lambda: reports.append(engine.run(mode="continuous", stop_after=120)))
    runner.start()
    wait_for(1)  # the running query applied what was there when it started
    [query] = spark.streams.active  # it runs with the configured trigger (source.trigger_seconds)
    assert query._jsq.streamingQuery().trigger().toString() == "ProcessingTimeTrigger(500)"
    _produce(log, "app.live", [("c", {"id": 2, "body": "b"}, 20)], partition=1)
    wait_for(2)
    _produce(log, "app.live", [("c", {"id": 3, "body": "c"}, 30), ("c", {"id": 4, "body": "d"}, 40)])
    wait_for(4)
    engine.stop()
    runner.join(timeout=90)
    (report,) = reports
    assert report.tables["live"].total("inserted") == 4 and not report.failed
    # The stream's first batch went through Spark; every later one the driver read, record for record.
    batches = [b for b in report.tables["live"].batches if b.batch_id >= read_here[0][0]]
    assert read_here[0][1] is None and [n for _, n in read_here[1:]] == [b.received for b in batches[1:]], read_here
    assert len(read_here) >= 2


def test_a_topic_created_again_under_a_continuous_run_stops_it_and_the_next_start_names_the_table(tmp_path, spark):
    """A continuous run read on by offset from a topic deleted and created again: it waited, then skipped
    as many of the new topic's records as the old one had. Now the stream stops in one line, and the next
    run's start stops that table alone (docs/operations.md#a-topic-that-ends-before-its-table)."""
    import threading
    import time

    from ingest.lake.delta import open_table, read_all

    config = make_config(tmp_path, value_format="json", extra_tables=[{"name": "live", "topic": "app.live"}])
    config = config.model_copy(update={"tables": tuple(t for t in config.tables if t.name == "live"),
                                       "source": config.source.model_copy(update={"trigger_seconds": 0.5})})
    log = TopicLog(config.log_dir)
    _produce(log, "app.live", [("c", {"id": i, "body": "a"}, 10 + i) for i in range(3)])
    reports: list[Any] = []
    engine = Runner(config, spark=spark)
    runner = threading.Thread(target=lambda: reports.append(engine.run(mode="continuous", stop_after=120)))
    runner.start()
    deadline = time.monotonic() + 60
    while (t := open_table(config.table_path("live"))) is None or read_all(t).num_rows < 3:
        assert time.monotonic() < deadline, "the continuous run did not apply the first records"
        time.sleep(0.5)

    log.delete_topic("app.live")
    _produce(log, "app.live", [("c", {"id": 9, "body": "new"}, 90)])
    runner.join(timeout=90)
    assert not runner.is_alive(), "the run went on reading a topic that ends before its offsets"
    engine.stop()
    (report,) = reports
    assert "topic app.live partition 0 ends at offset 0, before offset 3 the stream reads next" in (
        report.tables["live"].error or ""), report.tables["live"].error

    again = Runner(config, spark=spark).run()
    assert again.failed == ["live"] and "TopicBehindTableError" in (again.tables["live"].error or "")
