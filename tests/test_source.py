import json

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ingest.source import KAFKA_SCHEMA_DDL, TopicLogStreamReader
from ingest.topiclog import ProducerRecord, TopicLog


@pytest.fixture
def log(tmp_path):
    log = TopicLog(tmp_path)
    log.create_topic("t", 3)
    log.append("t", [ProducerRecord(p, None, b"v", 1) for p, n in ((0, 60), (1, 30), (2, 10)) for _ in range(n)])
    return log


def reader(log, **options):
    return TopicLogStreamReader({"path": str(log.root), "subscribe": "t", **options})


def test_starting_offsets_take_kafka_json_with_earliest_and_latest(log):
    start = reader(log, startingOffsets=json.dumps({"t": {"0": 42, "1": -1}})).initialOffset()
    assert start == {"t": {"0": 42, "1": 30, "2": 0}}


def test_read_limit_is_shared_in_proportion_to_lag(log):
    r = reader(log, maxOffsetsPerTrigger="50")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"t": {"0": 30, "1": 15, "2": 5}}
    assert sum(end["t"].values()) == 50
    assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 60, "1": 30, "2": 10}}


def test_tiny_limit_still_makes_progress(log):
    r = reader(log)
    start = {"t": {"0": 59, "1": 29, "2": 9}}
    end = r.latestOffset(start, ReadMaxRows(1))
    assert sum(end["t"].values()) == sum(start["t"].values()) + 1


def test_available_now_freezes_the_target(log):
    r = reader(log)
    r.prepareForTriggerAvailableNow()
    log.append("t", [ProducerRecord(0, None, b"late", 2)])
    assert r.latestOffset(r.initialOffset(), ReadAllAvailable())["t"]["0"] == 60


def test_partitions_and_read_cover_exactly_the_range(log):
    r = reader(log)
    parts = r.partitions({"t": {"0": 10, "1": 30, "2": 0}}, {"t": {"0": 12, "1": 30, "2": 3}})
    assert sorted((p.partition, p.start, p.end) for p in parts) == [(0, 10, 12), (2, 0, 3)]
    rows = [row for p in parts for batch in r.read(p) for row in batch.to_pylist()]
    assert sorted((row["partition"], row["offset"]) for row in rows) == [(0, 10), (0, 11), (2, 0), (2, 1), (2, 2)]


@pytest.mark.spark
def test_stream_schema_is_the_kafka_source_schema(spark, log):
    from pyspark.sql.types import _parse_datatype_string

    frame = (spark.readStream.format("cdc_topiclog").option("path", str(log.root)).option("subscribe", "t").load())
    assert frame.isStreaming
    assert frame.schema == _parse_datatype_string(KAFKA_SCHEMA_DDL)
