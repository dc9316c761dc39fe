import os

import pytest

from ingest.errors import TopicLogError
from ingest.source.topiclog import KAFKA_ROW_SCHEMA, ProducerRecord, TopicLog, murmur2, partition_for_key


@pytest.fixture
def log(tmp_path):
    log = TopicLog(tmp_path)
    log.create_topic("db.public.t", 2)
    return log


def test_offsets_are_contiguous_per_partition_across_appends(log):
    assert log.append("db.public.t", [ProducerRecord(0, b"a", b"1", 10), ProducerRecord(1, b"b", b"2", 11)]) == {
        0: (0, 1), 1: (0, 1)}
    assert log.append("db.public.t", [ProducerRecord(0, b"c", None, 12)] * 3) == {0: (1, 4)}
    assert log.end_offsets("db.public.t") == {0: 4, 1: 1}
    rows = log.read("db.public.t", 0, 0, 4)
    assert rows["offset"].to_pylist() == [0, 1, 2, 3]
    assert rows["value"].to_pylist() == [b"1", None, None, None]


def test_read_has_exactly_the_kafka_source_row_shape(log):
    log.append("db.public.t", [ProducerRecord(1, b"k", b"v", 1_700_000_000_123, (("h", b"x"),))])
    rows = log.read("db.public.t", 1, 0, 1)
    assert rows.schema == KAFKA_ROW_SCHEMA
    (row,) = rows.to_pylist()
    assert row["topic"] == "db.public.t" and row["partition"] == 1 and row["timestampType"] == 0
    assert row["headers"] == [{"key": "h", "value": b"x"}]
    assert row["timestamp"].timestamp() == pytest.approx(1_700_000_000.123)


def test_a_crashed_writer_leaves_nothing_visible(log, tmp_path):
    folder = tmp_path / "topics" / "db.public.t" / "0"
    (folder / ".tmp-999-00000000000000000000-00000000000000000005.arrow").write_bytes(b"half a segment")
    assert log.end_offsets("db.public.t")[0] == 0
    log.append("db.public.t", [ProducerRecord(0, None, b"v", 1)])
    assert log.read("db.public.t", 0, 0, 1).num_rows == 1


def test_gap_in_segments_is_reported(log, tmp_path):
    log.append("db.public.t", [ProducerRecord(0, None, b"v", 1)] * 2)
    folder = tmp_path / "topics" / "db.public.t" / "0"
    (seg,) = list(folder.glob("*.arrow"))
    os.rename(seg, folder / "00000000000000000001-00000000000000000003.arrow")
    with pytest.raises(TopicLogError, match="contiguous"):
        log.end_offsets("db.public.t")


def test_reading_past_the_end_is_an_error(log):
    log.append("db.public.t", [ProducerRecord(0, None, b"v", 1)])
    with pytest.raises(TopicLogError, match="ends at 0"):
        log.read("db.public.t", 0, 0, 5)


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".", "..", "x" * 250, "bad name"])
def test_hostile_topic_names_are_refused(tmp_path, name):
    with pytest.raises(TopicLogError, match="invalid topic name"):
        TopicLog(tmp_path).create_topic(name, 1)


def test_partition_count_is_fixed(log):
    log.create_topic("db.public.t", 2)
    with pytest.raises(TopicLogError, match="2 partitions"):
        log.create_topic("db.public.t", 3)


def test_murmur2_matches_kafka_default_partitioner():
    # Vectors from Kafka's own UtilsTest.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
