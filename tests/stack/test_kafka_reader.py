"""The engine's own Kafka reader (``source.kafka.reader: python``) against the stack's real broker.

What Spark's Kafka source would give for a range is the reference: every record of the range once,
with its key, value, headers and timestamp; offsets without a record (transaction markers) skipped;
records deleted before they were read reported as data loss, never skipped.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from harness.stack.process import wait_until

from ingest.config import KafkaSpec
from ingest.source.kafka import KafkaSource
from ingest.source.kafka_admin import ADMIN_TIMEOUT
from ingest.source.kafkalog import DataLossError, KafkaLog
from ingest.source.reader import TopicLogStreamReader
from ingest.verify.capture import delete_topics

pytestmark = [pytest.mark.stack]


@pytest.fixture
def topic(stack: Any) -> Iterator[str]:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"reader-probe-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers()})
    for future in admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)]).values():
        future.result(30)
    yield name
    delete_topics(stack.bootstrap_servers(), [name])


def _producer(stack: Any, **extra: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": stack.bootstrap_servers(), "enable.idempotence": True, **extra})


def _log(stack: Any, **options: str) -> KafkaLog:
    return KafkaLog(KafkaSpec(bootstrap_servers=stack.bootstrap_servers(), options=options))


def test_a_range_is_read_with_every_field(stack: Any, topic: str) -> None:
    producer = _producer(stack)
    for i in range(10):
        producer.produce(topic, key=f"k{i}".encode(), value=None if i == 4 else f"v{i}".encode(), partition=0,
                         timestamp=1_700_000_000_000 + i, headers=[("h", f"x{i}".encode())])
    producer.produce(topic, key=b"other", value=b"p1", partition=1)
    assert producer.flush(30) == 0
    log = _log(stack)

    assert log.end_offsets(topic) == {0: 10, 1: 1}
    rows = log.read(topic, 0, 2, 7).to_pylist()
    assert [r["offset"] for r in rows] == [2, 3, 4, 5, 6]
    assert [r["key"] for r in rows] == [b"k2", b"k3", b"k4", b"k5", b"k6"]
    assert [r["value"] for r in rows] == [b"v2", b"v3", None, b"v5", b"v6"]  # the tombstone stays one
    assert {(r["topic"], r["partition"], r["timestampType"]) for r in rows} == {(topic, 0, 0)}  # 0: CreateTime
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == [1_700_000_000_000 + i for i in range(2, 7)]
    assert rows[0]["headers"] == [{"key": "h", "value": b"x2"}]
    assert log.read(topic, 0, 5, 5).num_rows == 0
    assert log.read(topic, 1, 0, 1).column("value").to_pylist() == [b"p1"]


def test_transaction_markers_are_skipped_and_isolation_is_configurable(stack: Any, topic: str) -> None:
    producer = _producer(stack, **{"transactional.id": f"probe-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=b"c", value=f"committed{i}".encode(), partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, key=b"a", value=f"aborted{i}".encode(), partition=0)
    assert producer.flush(30) == 0  # on the broker before the abort (else librdkafka purges them unsent)
    producer.abort_transaction(30)
    # The coordinator writes the markers after commit/abort return: wait for both to land.
    wait_until(lambda: _log(stack).end_offsets(topic)[0] >= 7, what="the transaction markers", timeout=30)
    end = _log(stack).end_offsets(topic)[0]
    assert end == 7  # 5 records and 2 markers

    everything = _log(stack).read(topic, 0, 0, end)  # read_uncommitted, like Spark's source by default
    assert everything.column("value").to_pylist() == [b"committed0", b"committed1", b"committed2",
                                                      b"aborted0", b"aborted1"]
    assert all(o < end for o in everything.column("offset").to_pylist())
    committed = _log(stack, **{"kafka.isolation.level": "read_committed"}).read(topic, 0, 0, end)
    assert committed.column("value").to_pylist() == [b"committed0", b"committed1", b"committed2"]

    # An open transaction: read_committed ends where it began (the last stable offset), as Spark does.
    producer.begin_transaction()
    producer.produce(topic, key=b"o", value=b"open", partition=0)
    assert producer.flush(30) == 0
    stable = _log(stack, **{"kafka.isolation.level": "read_committed"})
    assert stable.end_offsets(topic)[0] == end and _log(stack).end_offsets(topic)[0] == end + 1
    assert stable.read(topic, 0, 0, end).num_rows == 3
    producer.abort_transaction(30)


def test_deleted_records_are_data_loss_and_the_stream_starts_after_them(stack: Any, topic: str) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    producer = _producer(stack)
    for i in range(6):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers()})
    for future in admin.delete_records([TopicPartition(topic, 0, 3)]).values():
        future.result(30)
    log = _log(stack)

    assert log.start_offsets(topic) == {0: 3, 1: 0}
    with pytest.raises(DataLossError, match="no longer on the broker"):
        log.read(topic, 0, 0, 6)
    assert log.read(topic, 0, 3, 6).column("value").to_pylist() == [b"v3", b"v4", b"v5"]
    with pytest.raises(DataLossError, match="ends at offset 6"):
        log.read(topic, 0, 3, 8)  # a planned range beyond what the partition holds

    spec = KafkaSpec(bootstrap_servers=stack.bootstrap_servers())
    reader = TopicLogStreamReader({"kafka": spec.model_dump_json(), "subscribe": topic})
    assert reader.initialOffset() == {topic: {"0": 3, "1": 0}}
    asked = json.dumps({topic: {"0": -2, "1": -1}})  # earliest, latest
    reader = TopicLogStreamReader({"kafka": spec.model_dump_json(), "subscribe": topic, "startingOffsets": asked})
    assert reader.initialOffset() == {topic: {"0": 3, "1": 0}}



def test_a_stream_meets_a_stopped_broker_with_nothing_new_and_goes_on_when_it_is_back(stack: Any, topic: str) -> None:
    """A broker away for longer than one request waits: the stream's next end is where it stood (its
    query waits for the next trigger instead of ending), and once the broker is back it sees new records."""
    producer = _producer(stack)
    for i in range(4):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    spec = KafkaSpec(bootstrap_servers=stack.bootstrap_servers())
    reader = TopicLogStreamReader({"kafka": spec.model_dump_json(), "subscribe": topic})
    start = reader.initialOffset()
    before = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert before == {topic: {"0": 2, "1": 2}}

    away = threading.Thread(target=stack.restart, args=("kafka",), kwargs={"away": ADMIN_TIMEOUT + 5})
    away.start()
    try:
        wait_until(lambda: stack.component("kafka").pid() is None, what="kafka stopped", timeout=60)
        asked = time.monotonic()
        assert reader.latestOffset(before, reader.getDefaultReadLimit()) == before  # nothing new, no error
        assert time.monotonic() - asked >= ADMIN_TIMEOUT - 1  # it really asked a broker that was away
    finally:
        away.join(300)
    producer = _producer(stack)
    producer.produce(topic, value=b"after", partition=0)
    assert producer.flush(30) == 0
    # as Spark asks at every trigger: the broker's first answers after its start may still fail
    wait_until(lambda: reader.latestOffset(before, reader.getDefaultReadLimit()) == {topic: {"0": 3, "1": 2}},
               what="the stream's next end once the broker is back", timeout=90)


def test_a_kept_consumer_reads_each_range_as_a_new_one_does(stack: Any, topic: str) -> None:
    """The driver's reader keeps one consumer between reads: each range, whatever the one before it
    read (another partition, a later range, up to the partition's end), is read exactly."""
    producer = _producer(stack)
    for i in range(60):
        producer.produce(topic, value=f"p{i % 2}-{i // 2}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    spec = KafkaSpec(bootstrap_servers=stack.bootstrap_servers())
    kept = KafkaLog(spec, keep_open=True)
    # up to the end (librdkafka then holds its end-of-partition event), back, across, and the same again
    ranges = [(0, 20, 30), (0, 5, 10), (1, 0, 30), (1, 12, 14), (0, 25, 30), (0, 25, 30), (1, 29, 30), (0, 0, 1)]
    try:
        for partition, start, end in ranges:
            rows = kept.read(topic, partition, start, end)
            assert rows.column("offset").to_pylist() == list(range(start, end)), (partition, start, end)
            assert rows.column("value").to_pylist() == [f"p{partition}-{o}".encode() for o in range(start, end)]
        opened = kept._kept
        assert opened is not None and kept.read(topic, 1, 3, 6).num_rows == 3 and kept._kept is opened  # one, kept
        with pytest.raises(DataLossError, match="ends at offset 30"):
            kept.read(topic, 0, 28, 32)
        assert kept.read(topic, 0, 28, 30).column("offset").to_pylist() == [28, 29]  # after an error too
    finally:
        kept.close()
    assert kept._kept is None
    assert kept.read(topic, 1, 0, 2).num_rows == 2  # a read after close opens another
    kept.close()

    source = KafkaSource(spec)  # the driver's reads of a Kafka source go through one such reader
    assert source.read_arrow(topic, {0: 1, 1: 1}, {0: 3, 1: 2}).column("offset").to_pylist() == [1, 2, 1]
    reader = source._reader
    assert reader is not None and reader._kept is not None
    source.read_arrow(topic, {0: 0}, {0: 1})
    assert source._reader is reader
    source.close()
    assert reader._kept is None
