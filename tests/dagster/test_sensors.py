"""The offsets sensor: a run request only for new, unapplied offsets, per table; the cursor follows the topics."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from assets.constants import TABLE_TAG, table_key
from assets.definitions import build_definitions
from assets.resources import SparkIngestPipeline
from assets.sensors import build_offsets_sensor
from tests.dagster.conftest import produce, write_config

pytestmark = pytest.mark.spark


def _tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, engine: SparkIngestPipeline,
          cursor: str | None) -> tuple[list[dg.RunRequest], str | None, str | None]:
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"ingest_pipeline": engine})
    data = sensor.evaluate_tick(context)
    return list(data.run_requests or []), data.cursor, data.skip_message


def test_requests_only_new_offsets_and_advances_its_cursor(notes_config, spark):
    path, config = notes_config
    engine = SparkIngestPipeline(config_path=str(path))
    sensor = build_offsets_sensor([config.table("notes")])
    instance = dg.DagsterInstance.ephemeral()

    requests, cursor, skip = _tick(sensor, instance, engine, None)
    assert not requests and "caught up" in (skip or "")  # no topic yet: nothing to do

    produce(config, "app.notes", [("c", {"id": i, "body": f"v{i}"}, 100 + i) for i in range(6)])
    requests, cursor, _ = _tick(sensor, instance, engine, None)
    [request] = requests
    assert request.asset_selection == [table_key("notes")] and request.tags[TABLE_TAG] == "notes"
    assert json.loads(cursor) == {"notes": {"0": 3, "1": 3}}
    first_key = request.run_key

    # Same offsets, not applied yet: already requested, so no second run.
    requests, again, skip = _tick(sensor, instance, engine, cursor)
    assert not requests and again == cursor and "already requested" in skip

    # The run drains the table: caught up, nothing requested.
    defs = build_definitions(config, engine)
    assert dg.materialize(defs.assets, instance=instance, resources={"ingest_pipeline": engine}).success  # type: ignore[arg-type]
    requests, _, skip = _tick(sensor, instance, engine, cursor)
    assert not requests and "caught up" in skip

    # New records: a new request with a new run key, and the cursor moves to the new end.
    produce(config, "app.notes", [("u", {"id": 1, "body": "x"}, 200), ("d", {"id": 2}, 201)])
    requests, advanced, _ = _tick(sensor, instance, engine, cursor)
    [request] = requests
    assert request.run_key != first_key
    assert json.loads(advanced) == {"notes": {"0": 4, "1": 4}}


def test_waits_while_a_run_of_the_table_is_in_flight(notes_config):
    path, config = notes_config
    engine = SparkIngestPipeline(config_path=str(path))
    sensor = build_offsets_sensor([config.table("notes")])
    instance = dg.DagsterInstance.ephemeral()
    produce(config, "app.notes", [("c", {"id": 1, "body": "a"}, 10)])
    instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id="running-run", status=dg.DagsterRunStatus.STARTED,
                                asset_selection=frozenset({table_key("notes")})))
    requests, cursor, skip = _tick(sensor, instance, engine, None)
    assert not requests and not cursor and "running-run" in skip


def test_one_sensor_requests_each_table_that_needs_it(tmp_path):
    path, config = write_config(tmp_path / "work", batch=5, value_format="json", tables=[
        {"name": "notes", "topic": "app.notes"}, {"name": "tags", "topic": "app.tags"}])
    engine = SparkIngestPipeline(config_path=str(path))
    sensor = build_offsets_sensor(list(config.tables))
    instance = dg.DagsterInstance.ephemeral()
    produce(config, "app.notes", [("c", {"id": 1, "body": "a"}, 10)])
    requests, cursor, _ = _tick(sensor, instance, engine, None)
    assert [r.tags[TABLE_TAG] for r in requests] == ["notes"]
    assert set(json.loads(cursor)) == {"notes"}

    produce(config, "app.tags", [("c", {"id": 1, "body": "t"}, 10)])
    requests, cursor, _ = _tick(sensor, instance, engine, cursor)
    # notes still has the same unapplied offsets, already requested: only tags gets a run.
    assert [(r.tags[TABLE_TAG], r.asset_selection) for r in requests] == [("tags", [table_key("tags")])]
    assert set(json.loads(cursor)) == {"notes", "tags"}
    requests, _, skip = _tick(sensor, instance, engine, cursor)
    assert not requests and "notes: a run was already requested" in skip and "tags: a run was already" in skip
