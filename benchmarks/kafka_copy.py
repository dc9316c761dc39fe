"""Put a generated workload on a real Kafka broker, for ``bench_compare.py --source kafka`` (not a test).

The simulator writes into the embedded topic log. This copies every topic of a configuration, record
by record, into fresh topics of the same names on the broker the project's stack runs: same
partitions, offsets (from 0), keys, values and timestamps, tombstones included. Avro schemas are
registered again in the stack's registry (Apicurio, Confluent API) and the schema id in each
message's five-byte header is rewritten to the registry's id. Then it writes the same
configuration with ``source.kind: kafka``, its own tables and checkpoints.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from ingest.config import IngestConfig, KafkaSpec, load_config
from ingest.decode.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry, frame, unframe
from ingest.errors import DecodeError
from ingest.source.kafka import KafkaSource
from ingest.source.topiclog import TopicLog
from ingest.verify.capture import delete_topics

_READ_CHUNK = 50_000


def schema_ids(embedded: EmbeddedSchemaRegistry, registry: ConfluentSchemaRegistry) -> dict[int, int]:
    """Every embedded schema registered under its subject in ``registry``: embedded id -> registry id."""
    return {old: registry.register(subject, embedded.get_schema(old))
            for subject, ids in embedded.subjects().items() for old in ids}


def reframe(message: bytes | None, ids: dict[int, int]) -> bytes | None:
    """A Confluent-framed message with its schema id mapped (anything else unchanged)."""
    if not ids or message is None:
        return message
    try:
        old, payload = unframe(message)
    except DecodeError:
        return message  # not framed: a JSON message, or one the decoder should see as it is
    new = ids.get(old)
    return message if new is None else frame(new, bytes(payload))


def copy_topic(log: TopicLog, topic: str, servers: str, ids: dict[int, int]) -> int:
    """Recreate ``topic`` on the broker and produce the log's records into it; returns how many."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    ends = log.end_offsets(topic)
    delete_topics(servers, [topic])
    admin = AdminClient({"bootstrap.servers": servers})
    # The simulated records carry 2024 timestamps: time-based retention would delete them at once.
    keep = {"retention.ms": "-1", "retention.bytes": "-1"}
    new = NewTopic(topic, num_partitions=len(ends), replication_factor=1, config=keep)
    for future in admin.create_topics([new]).values():
        future.result()
    # Idempotence keeps each partition's order and writes every record once, so offsets match the log's.
    producer = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 20,
                         "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
                         "message.max.bytes": 10_000_000})
    sent = 0
    for partition, end in sorted(ends.items()):
        for start in range(0, end, _READ_CHUNK):
            rows = log.read(topic, partition, start, min(end, start + _READ_CHUNK))
            stamps = rows["timestamp"].cast("int64").to_pylist()
            for key, value, stamp in zip(rows["key"].to_pylist(), rows["value"].to_pylist(), stamps, strict=True):
                while True:
                    try:
                        producer.produce(topic, value=reframe(value, ids), key=reframe(key, ids),
                                         partition=partition, timestamp=stamp // 1000)
                        break
                    except BufferError:  # the local queue is full: let it drain
                        producer.poll(0.1)
                sent += 1
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError(f"{topic}: records still unsent after 120 s")
    copied = _source(servers).end_offsets(topic)
    if copied != ends:
        raise RuntimeError(f"{topic}: the broker holds end offsets {copied}, the log {ends}")
    return sent


def kafka_config(config: IngestConfig, stack: Any, say: Callable[[str], None], *,
                 reader: str | None = None) -> tuple[IngestConfig, dict[int, int]]:
    """Copy ``config``'s topics (and Avro schemas) to the stack; returns the configuration reading
    them (with ``source.kafka.reader`` set to ``reader``, if given) and the Avro ids mapped
    (embedded -> registry)."""
    servers = stack.bootstrap_servers()
    avro = config.source.value_format == "avro"
    url = f"{stack.registry_url()}/apis/ccompat/v7"
    ids = schema_ids(EmbeddedSchemaRegistry(config.registry_dir),
                     ConfluentSchemaRegistry.from_settings(url, credentials_env=None)) if avro else {}
    log = TopicLog(config.log_dir)
    t0 = time.perf_counter()
    sent = sum(copy_topic(log, t.topic, servers, ids) for t in config.tables)
    say(f"copied {sent:,} records to Kafka ({servers}) in {time.perf_counter() - t0:.0f} s")
    raw = yaml.safe_load(Path(config.workdir / "bench.yaml").read_text())
    connection = {"bootstrap_servers": servers, **({"reader": reader} if reader else {})}
    raw["source"] |= {"kind": "kafka", "kafka": connection}
    if reader == "spark" and raw["source"].get("max_records_per_table"):
        # Spark's Kafka source bounds only the whole micro-batch: the tables' bound becomes that.
        raw["source"]["max_records_per_batch"] = raw["source"].pop("max_records_per_table")
    if avro:
        raw["source"]["registry"] = {"kind": "confluent", "url": url}
    raw["target"] |= {"root": "tables-kafka", "checkpoint_dir": "checkpoints-kafka"}
    path = config.workdir / "bench-kafka.yaml"
    path.write_text(yaml.safe_dump(raw))
    kafka = load_config(path)
    for leftover in (kafka.tables_root, kafka.checkpoint_root):
        shutil.rmtree(leftover, ignore_errors=True)
    return kafka, ids


def _source(servers: str) -> KafkaSource:
    """The engine's own view of the broker (end offsets through the admin API)."""
    return KafkaSource(KafkaSpec(bootstrap_servers=servers))


class KafkaLog:
    """The copied topics read back from the broker with librdkafka, in the embedded log's shape, for
    the bare script (``end_offsets``, ``read``): a user without Spark would consume Kafka this way.

    One consumer per partition, assigned once: the bare script reads each partition's ranges in
    order, so librdkafka's prefetch keeps serving the next range. Avro schema ids are mapped back
    to the embedded registry's (``ids`` inverted), which the bare script's decoder reads.
    """

    def __init__(self, servers: str, ids: dict[int, int]) -> None:
        self._servers = servers
        self._back = {new: old for old, new in ids.items()}
        self._readers: dict[tuple[str, int], tuple[Any, int]] = {}

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer({"bootstrap.servers": self._servers, "group.id": "bench-bare", "enable.auto.commit": False})

    def end_offsets(self, topic: str) -> dict[int, int]:
        return _source(self._servers).end_offsets(topic)

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        """Records ``start <= offset < end`` of one partition."""
        from confluent_kafka import TopicPartition

        consumer, position = self._readers.get((topic, partition), (None, -1))
        if consumer is None:
            consumer = self._consumer()
        if position != start:
            consumer.assign([TopicPartition(topic, partition, start)])
        offsets: list[int] = []
        values: list[bytes | None] = []
        while len(offsets) < end - start:
            # Never more than the range: the next read goes on from ``end`` without a seek.
            messages = consumer.consume(end - start - len(offsets), timeout=30)
            if not messages:
                raise RuntimeError(f"{topic}[{partition}]: nothing after offset {start + len(offsets)} in 30 s; "
                                   f"the range ends at {end}")
            for message in messages:
                if message.error():
                    raise RuntimeError(f"{topic}[{partition}]: {message.error()}")
                offset = message.offset()
                assert offset is not None  # a consumed message has one
                offsets.append(offset)
                values.append(reframe(message.value(), self._back))
        self._readers[(topic, partition)] = (consumer, end)
        return pa.table({"partition": pa.array([partition] * len(offsets), pa.int32()),
                         "offset": pa.array(offsets, pa.int64()), "value": pa.array(values, pa.binary())})

    def close(self) -> None:
        for consumer, _ in self._readers.values():
            consumer.close()
        self._readers.clear()
