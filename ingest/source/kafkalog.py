"""A Kafka cluster read with librdkafka, in the embedded log's shape: offsets, and records by range.

This is what the engine's own stream reader (:mod:`ingest.source.reader`) reads when
``source.kafka.reader`` is ``python``: each Spark task consumes its offset ranges with a
confluent-kafka consumer and decodes them in the same Python worker, as the embedded log does. The
records then never cross from the JVM into Python (Spark's Kafka source hands them over as Arrow).

The consumer is assigned its partitions (no consumer group, nothing committed): where a stream is
stays in its checkpoint and in the tables' Delta logs. It reads what Spark's source reads
(``isolation.level=read_uncommitted`` unless configured), fails like it with
``failOnDataLoss=true`` when records were deleted before they were read, and skips offsets that
hold no record (transaction markers, compaction).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final, cast

import pyarrow as pa

from ingest import logs, secrets
from ingest.config import KafkaSpec
from ingest.errors import SourceUnavailableError, TopicLogError
from ingest.source.kafka_admin import KafkaAdmin, admin_config
from ingest.source.topiclog import KAFKA_ROW_SCHEMA

#: Seconds a read may go without receiving anything before the broker counts as unavailable.
READ_TIMEOUT: Final = 60.0
#: Records asked of librdkafka at a time.
CHUNK: Final = 10_000
#: librdkafka's own bound on the records it fetches ahead (``queued.min.messages``).
_PREFETCH: Final = 100_000
#: The most records a read takes through a consumer kept open between reads (``keep_open``), and
#: that consumer's ``queued.min.messages``. The driver reads micro-batches of fewer records
#: (:data:`ingest.source.reader.MIN_PIECE` is this value); a larger range (a catch-up) gets a
#: consumer of its own that fetches ahead as far as the range.
KEPT_READ: Final = 2_000


class DataLossError(TopicLogError):
    """Records a stream still had to read are gone from the broker (retention, a recreated topic)."""


class KafkaLog:
    """Read access to the topics of one cluster (see module docstring).

    Args:
        spec: the cluster connection, as configured.
        secrets_file: where the SASL credentials are, if not in the environment (looked up here, in
            the process that reads: nothing secret travels in Spark's plans).
        keep_open: read ranges of up to :data:`KEPT_READ` records with one consumer kept between
            reads (until :meth:`close`), each read assigning it the range's partition and letting it
            go after. A consumer opened per read first starts its threads and connects to the
            broker, for each topic of every micro-batch the driver reads
            (``benchmarks/bench_kafka_read.py`` times the two).
    """

    #: The kept consumer's own librdkafka settings. The next read's fetch waits for the one still in
    #: flight from this read: a fetch that found nothing past the range waits at the broker for
    #: ``fetch.wait.max.ms`` (the source's ``kafka.fetch.max.wait.ms``, 50 ms by default, for every read
    #: but the first), and a partition whose fetch queue was full for ``fetch.queue.backoff.ms``
    #: (librdkafka's 1 s by default), even once assigned anew. ``benchmarks/bench_kafka_read.py``
    #: times the kept consumer with and without them.
    kept_settings: ClassVar[Mapping[str, Any]] = MappingProxyType({"fetch.wait.max.ms": 1,
                                                                    "fetch.queue.backoff.ms": 10})

    def __init__(self, spec: KafkaSpec, secrets_file: str | None = None, *, timeout: float = READ_TIMEOUT,
                 keep_open: bool = False) -> None:
        self.timeout = timeout
        self.source = KafkaAdmin(spec, secrets_file=secrets_file)  # holds the connection settings
        self._seen: set[str] = set()
        self._keep_open = keep_open
        self._kept: Any = None  # the consumer kept between reads (keep_open), once opened
        self._reading = threading.Lock()  # one read at a time through the kept consumer

    def __getstate__(self) -> dict[str, Any]:
        """What a copy sent to another process holds: the settings, without the kept consumer or its lock
        (Spark pickles a stream's reader, and with it this log, for its Python workers)."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_kept", "_reading")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _kept=None, _reading=threading.Lock())

    def exists(self, topic: str) -> bool:
        """Whether the topic exists; once it did, it is taken to (its end offsets then say ``{}``
        if it was deleted): a stream asks every micro-batch, and each answer is a round trip."""
        if topic not in self._seen and self.source.end_offsets(topic):
            self._seen.add(topic)
        return topic in self._seen

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self.source.end_offsets(topic)

    def start_offsets(self, topic: str) -> dict[int, int]:
        return self.source.start_offsets(topic)

    def consumer_config(self) -> dict[str, Any]:
        """librdkafka consumer settings: the shared connection options, and how to read like Spark."""
        spec = self.source.spec
        conf = admin_config(spec, self.source.secrets_file)
        conf.pop("logger", None)
        given = {key.removeprefix("kafka."): value for key, value in spec.options.items()}
        # librdkafka's own lines go to stderr; like the admin client's, they are for --log-level debug: a
        # read that fails says why once, and one that succeeded must not print "SASL authentication error"
        # because its consumer closed while logging in to the group coordinator, which the reader never uses
        debugging = logging.getLogger(logs.LIBRDKAFKA).isEnabledFor(logging.DEBUG)
        return {
            **conf,
            "log_level": 7 if debugging else 2,  # syslog's levels: 2 is critical, 7 debug
            "group.id": "ingest-reader",  # required by librdkafka; nothing is committed under it
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # an offset the broker no longer holds is data loss, not a skip
            "isolation.level": given.get("isolation.level", "read_uncommitted"),
            "fetch.wait.max.ms": int(given.get("fetch.max.wait.ms", "50")),
        }

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        """Records ``start <= offset < end`` of one partition, in Spark's Kafka row shape.

        Raises:
            DataLossError: the broker no longer holds records of the range (terminal).
            SourceUnavailableError: nothing arrived for ``timeout`` seconds (transient).
        """
        with self._reading:
            return pa.Table.from_batches(list(self._chunks(topic, partition, start, end)), schema=KAFKA_ROW_SCHEMA)

    def close(self) -> None:
        """Close the consumer kept between reads, if one is open (a later read opens another)."""
        with self._reading:
            kept, self._kept = self._kept, None
            if kept is not None:
                kept.close()

    def _consumer(self, records: int) -> Any:
        """A consumer to read ``records`` with: the kept one (``keep_open``, at most :data:`KEPT_READ`
        records), or a new one."""
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import Consumer

        # librdkafka fetches ahead until its queue holds queued.min.messages (100,000 by default) or
        # 64 MB: past the range's end that is work for the broker and this worker, thrown away.
        if not self._keep_open or records > KEPT_READ:
            return Consumer({**self.consumer_config(), "queued.min.messages": min(_PREFETCH, records)})
        if self._kept is None:
            self._kept = Consumer({**self.consumer_config(), "queued.min.messages": KEPT_READ, **self.kept_settings})
        return self._kept

    def _chunks(self, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """:meth:`read` in batches of at most ``CHUNK`` records; a consumer opened for it is closed
        at the end, a kept one lets the partition go.

        The caller decodes only once the range is read: decoding between chunks, with the consumer
        open, was slower (``bench_compare.py --source kafka``, JSON: 10.7 and 10.8 s of decode
        against 8.1 s; librdkafka probably went on fetching past the range meanwhile).
        """
        if start >= end:
            return
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import TopicPartition

        consumer = self._consumer(end - start)
        try:
            consumer.assign([TopicPartition(topic, partition, start)])
            position, waited_since = start, time.monotonic()
            while position < end:
                messages = consumer.consume(min(CHUNK, end - position), timeout=1.0)
                if not messages:
                    if time.monotonic() - waited_since > self.timeout:
                        raise SourceUnavailableError(
                            f"{self.source.describe()}: nothing from {topic}[{partition}] after offset {position} "
                            f"in {self.timeout:.0f} s; the micro-batch reads up to {end}")
                    continue
                waited_since = time.monotonic()
                rows, position = self._records(consumer, messages, topic, partition, (start, position, end))
                if rows["offset"]:
                    yield _batch(rows, topic, partition)
        finally:
            if consumer is self._kept:
                consumer.unassign()  # nothing fetched ahead until the next read
            else:
                consumer.close()

    def _records(self, consumer: Any, messages: list[Any], topic: str, partition: int,
                 span: tuple[int, int, int]) -> tuple[dict[str, list[Any]], int]:
        """The records among ``messages`` below the read's end as columns, and the position after them.

        ``span`` is the read's start, the position the messages follow, and the read's end.
        """
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import KafkaError

        start, position, end = span
        rows: dict[str, list[Any]] = {name: [] for name in _COLUMNS}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    # The partition ends here; offsets up to it that came empty hold no record.
                    reached = message.offset()
                    if reached is not None and reached < end:
                        raise DataLossError(f"{topic}[{partition}] ends at offset {reached}, but the micro-batch "
                                            f"reads up to {end}: the topic was deleted or truncated")
                    return rows, end
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise DataLossError(f"{topic}[{partition}]: offset {position} is no longer on the broker "
                                        f"(retention or a recreated topic): {error.str()}")
                raise SourceUnavailableError(secrets.redact(
                    f"{self.source.describe()}: reading {topic}[{partition}] failed: {error.str()}"))
            offset = cast(int, message.offset())  # a delivered record has one
            if offset >= end:
                return rows, end
            if offset > position == start:  # the read's first record is not the one asked for
                self._check_held(consumer, topic, partition, position)
            stamp_type, stamp = message.timestamp()
            rows["key"].append(message.key())
            rows["value"].append(message.value())
            rows["offset"].append(offset)
            rows["timestamp"].append(stamp * 1000)
            rows["timestampType"].append(stamp_type - 1)  # librdkafka counts "none" as 0, Spark as -1
            headers: list[tuple[str, bytes]] | None = message.headers()  # type: ignore[assignment]
            rows["headers"].append(None if headers is None else [{"key": k, "value": v} for k, v in headers])
            position = offset + 1
        return rows, position

    def _check_held(self, consumer: Any, topic: str, partition: int, first: int) -> None:
        """The first record came after ``first``: that is a gap, unless retention took the records."""
        # librdkafka: only for a Kafka source (the CLI starts without it)
        from confluent_kafka import TopicPartition

        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=self.timeout, cached=False)
        if low > first:
            raise DataLossError(f"{topic}[{partition}]: offsets {first}..{low - 1} were deleted (retention) "
                                "before the stream read them")


_COLUMNS: Final = ("key", "value", "offset", "timestamp", "timestampType", "headers")


def _batch(rows: dict[str, list[Any]], topic: str, partition: int) -> pa.RecordBatch:
    n = len(rows["offset"])
    return pa.RecordBatch.from_pydict({
        "key": pa.array(rows["key"], pa.binary()),
        "value": pa.array(rows["value"], pa.binary()),
        "topic": pa.array([topic] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(rows["offset"], pa.int64()),
        "timestamp": pa.array(rows["timestamp"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "timestampType": pa.array(rows["timestampType"], pa.int32()),
        "headers": pa.array(rows["headers"], KAFKA_ROW_SCHEMA.field("headers").type),
    }, schema=KAFKA_ROW_SCHEMA)
