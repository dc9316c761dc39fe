"""The engine's own Spark stream over a topic log: the embedded one, or Kafka read with librdkafka.

:class:`TopicLogDataSource` is a Python streaming data source that takes the Kafka source's option
names (``subscribe``, ``startingOffsets``, ``maxOffsetsPerTrigger``) and yields rows of exactly the
schema of Spark's Kafka source, so everything downstream of the read is identical for every source.
It reads the embedded log (option ``path``: :mod:`ingest.source.topiclog`) or a Kafka cluster
(option ``kafka``: the connection as JSON; :mod:`ingest.source.kafkalog`). Beside the Kafka source's
bound on the whole micro-batch, ``maxRecordsPerTopic`` bounds each topic's share of it: the records
one table's MERGE takes, however many tables the query reads.

Given a decoder (option ``decode``), the reader decodes what it reads in the same Python worker and
yields the decode step's parts (:data:`ingest.decode.parts.PARTS_DDL`) instead of raw rows: the
raw bytes (some kilobytes per schema-carrying JSON message) then never cross into the JVM and back
into another Python worker, which cost more than the decoding itself. Spark's own Kafka source,
read by the JVM, is decoded by ``mapInArrow`` in the same executors; both give the driver the same
parts.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ingest import logs, secrets
from ingest.config import KafkaSpec
from ingest.errors import SourceUnavailableError, TopicLogError
from ingest.heap import freeze_start_up
from ingest.model import ends_before
from ingest.source.kafkalog import KEPT_READ, DataLossError, KafkaLog
from ingest.source.topiclog import KAFKA_ROW_SCHEMA, TopicLog

KAFKA_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)
FORMAT_NAME = "cdc_topiclog"
EARLIEST, LATEST = -2, -1  # Kafka's sentinels in startingOffsets JSON

Offsets = dict[str, dict[str, int]]  # {topic: {"partition": next offset}} as in Kafka's JSON
_P = TypeVar("_P", str, int)  # a partition: as Kafka's JSON names it, or its number
#: Records a task reads before it decodes them (and yields their parts).
READ_STEP = 50_000
#: Records decoded into one batch of parts.
DECODE_BATCH = 10_000
#: A partition's range of fewer records is not cut among the tasks; a micro-batch of fewer records in
#: all is read and decoded by the driver (:mod:`ingest.stream.decoding`): one core decodes it either
#: way, and a Spark job's fixed cost (about 0.1 s on two cores) is more than its decoding. The same
#: bound as the driver's kept Kafka consumer, so every micro-batch the driver reads goes through it.
MIN_PIECE = KEPT_READ

log = logging.getLogger(__name__)


class Log(Protocol):
    """What the reader reads: :class:`~ingest.source.topiclog.TopicLog` or :class:`~ingest.source.kafkalog.KafkaLog`."""

    def exists(self, topic: str) -> bool: ...

    def start_offsets(self, topic: str) -> dict[int, int]: ...

    def end_offsets(self, topic: str) -> dict[int, int]: ...

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table: ...


def open_log(options: Mapping[str, str]) -> Log:
    """The log the reader's options name: ``path`` (embedded) or ``kafka`` (a KafkaSpec as JSON)."""
    if "kafka" in options:
        # Spark hands a data source its options with their names in lower case, and a plain dict of
        # them (a partition's copy) no longer finds "secretsFile": look the name up in any case.
        secrets_file = next((v for k, v in options.items() if k.lower() == "secretsfile"), None)
        return KafkaLog(KafkaSpec.model_validate_json(options["kafka"]), secrets_file or None)
    return TopicLog(options["path"])


class _Range(InputPartition):
    """One task's share of a micro-batch: offset ranges ``(topic, partition, start, end)``."""

    def __init__(self, spans: list[tuple[str, int, int, int]]) -> None:
        super().__init__(tuple(spans))
        self.spans = spans


class TopicLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader: offsets are ``{topic: {partition: next offset}}``, like Kafka's source."""

    def __init__(self, options: Mapping[str, str]) -> None:
        if ("path" not in options and "kafka" not in options) or "subscribe" not in options:
            raise TopicLogError("cdc_topiclog needs the options 'subscribe' and 'path' or 'kafka'")
        self.options = dict(options)
        self.topics = [t.strip() for t in options["subscribe"].split(",") if t.strip()]
        self.starting = options.get("startingOffsets", "earliest")
        self.max_rows = int(options["maxOffsetsPerTrigger"]) if "maxOffsetsPerTrigger" in options else None
        self.max_per_topic = int(options["maxRecordsPerTopic"]) if options.get("maxRecordsPerTopic") else None
        self.min_partitions = int(options.get("minPartitions", "1"))
        self.log = open_log(options)
        self.decode = options.get("decode")
        self._frozen: Offsets | None = None
        self._latest: Offsets | None = None  # what the last latestOffset saw, for reportLatestOffset
        self._away_since: float | None = None  # when the source stopped answering latestOffset

    def _end_offsets(self) -> Offsets:
        if self._frozen is not None:
            return self._frozen
        ends: Offsets = {}
        for topic in self.topics:
            if self.log.exists(topic) and (offsets := self.log.end_offsets(topic)):
                ends[topic] = {str(p): o for p, o in offsets.items()}
        return ends

    def initialOffset(self) -> Offsets:
        ends = self._end_offsets()
        firsts = {t: {str(p): o for p, o in self.log.start_offsets(t).items()} for t in ends}
        if self.starting in ("earliest", "latest"):
            latest = self.starting == "latest"
            return {t: {p: (e if latest else firsts[t].get(p, 0)) for p, e in parts.items()}
                    for t, parts in ends.items()}
        wanted: dict[str, dict[str, int]] = json.loads(self.starting)
        result: Offsets = {}
        for topic, parts in ends.items():
            result[topic] = {}
            for p, end in parts.items():
                asked = int(wanted.get(topic, {}).get(p, EARLIEST))
                first = firsts[topic].get(p, 0)
                result[topic][p] = first if asked == EARLIEST else end if asked == LATEST else min(asked, end)
        return result

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._frozen = None
        self._frozen = self._end_offsets()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """Where the next micro-batch ends. A source that does not answer (a broker restarting for longer
        than one request waits) has nothing new: the query keeps its offsets and asks again at the next
        trigger, so that a continuous run rides the outage out instead of ending.

        Raises:
            DataLossError: a partition ends before the offset the stream reads next (:func:`_refuse_ends_before`).
        """
        try:
            ends = self._latest = self._end_offsets()
        except SourceUnavailableError as exc:
            if self._away_since is None:
                self._away_since = time.monotonic()
                log.warning("%s; the stream waits for it and goes on from its offsets when it answers",
                            secrets.describe(exc))
            self.log = open_log(self.options)  # the next trigger asks with a new client, not one left broken
            return start
        if self._away_since is not None:
            log.warning("the source answers again after %.0f s; the stream goes on",
                        time.monotonic() - self._away_since)
            self._away_since = None
        _refuse_ends_before(start, ends)
        lag = {(t, p): max(0, e - start.get(t, {}).get(p, 0)) for t, parts in ends.items() for p, e in parts.items()}
        if self.max_per_topic is not None:
            # Each topic's share first (one table's MERGE), then the micro-batch's bound over what is left.
            for topic in ends:
                mine = {tp: behind for tp, behind in lag.items() if tp[0] == topic}
                lag.update(_share(mine, self.max_per_topic))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is not None:
            lag = _share(lag, budget)
        result: Offsets = {t: dict(parts) for t, parts in start.items()}
        for (topic, p), take in sorted(lag.items()):
            result.setdefault(topic, {})[p] = start.get(topic, {}).get(p, 0) + take
        return result

    def reportLatestOffset(self) -> Offsets:
        """The end offsets :meth:`latestOffset` saw (for Spark's progress metrics; as Spark's Kafka
        source reports them): asking the log again would cost a Kafka reader one more round of
        requests per micro-batch."""
        return self._latest if self._latest is not None else self._end_offsets()

    def partitions(self, start: Offsets, end: Offsets) -> list[_Range]:
        """As many tasks as ``minPartitions`` (the cores), of about equal record counts and the same mix.

        Like Kafka's ``minPartitions``, large partition ranges are cut so that every core decodes --
        here into one piece per task, so that every task gets the same share of every topic (tables
        differ in what a record costs to decode, and the micro-batch waits for its slowest task).
        Ranges under :data:`MIN_PIECE` records stay whole and go to the emptiest task, since each
        piece costs a read of its own.
        """
        spans = batch_spans(start, end)
        if not spans:
            return []
        tasks = max(1, self.min_partitions)
        bins: list[list[tuple[str, int, int, int]]] = [[] for _ in range(tasks)]
        sizes = [0] * tasks
        small = []
        for topic, partition, begin, stop in spans:
            if stop - begin < max(MIN_PIECE, tasks):
                small.append((topic, partition, begin, stop))
                continue
            cuts = [begin + (stop - begin) * i // tasks for i in range(tasks + 1)]
            for i in range(tasks):
                bins[i].append((topic, partition, cuts[i], cuts[i + 1]))
                sizes[i] += cuts[i + 1] - cuts[i]
        for piece in sorted(small, key=lambda s: s[2] - s[3]):  # largest first, into the emptiest task
            i = sizes.index(min(sizes))
            bins[i].append(piece)
            sizes[i] += piece[3] - piece[2]
        return [_Range(sorted(b)) for b in bins if b]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Range)
        log = open_log(self.options)
        # Unpickled per task; its decoders (schema plans) are cached per worker process by BatchDecoder.
        decoder = pickle.loads(base64.b64decode(self.decode)) if self.decode else None  # the engine wrote it
        for topic, p, begin, stop in partition.spans:
            # A span is read, then decoded, in steps of READ_STEP records: a worker holds one step.
            for lo in range(begin, stop, READ_STEP):
                for batch in log.read(topic, p, lo, min(stop, lo + READ_STEP)).to_batches(max_chunksize=DECODE_BATCH):
                    yield decoder.parts(batch) if decoder is not None else batch
        freeze_start_up()  # the worker has read and decoded once: what it holds now stays (ingest.heap)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: progress is recorded in the Delta tables, not in the log."""


def batch_spans(start: Mapping[str, Mapping[_P, int]], end: Mapping[str, Mapping[_P, int]]) \
        -> list[tuple[str, int, int, int]]:
    """The offset ranges ``(topic, partition, start, end)`` of a micro-batch from ``start`` to ``end``
    (a partition absent from ``start`` begins at 0): what its tasks read, or the driver
    (:mod:`ingest.stream.decoding`)."""
    spans = []
    for topic, parts in end.items():
        for p, stop in parts.items():
            begin = start.get(topic, {}).get(p, 0)
            if stop > begin:
                spans.append((topic, int(p), begin, stop))
    return spans


def _refuse_ends_before(start: Offsets, ends: Offsets) -> None:
    """Refuse a partition that ends before the offset the stream reads next. Kafka's end offsets only
    grow (a new leader answers "not available" until it has caught up, KIP-207), so the topic was
    deleted and created again while the stream read it, or the broker lost records. Reading on by
    offset would wait, then skip as many of the new topic's records as the old one had, without a
    word; a run's start stops that table alone (:class:`ingest.errors.TopicBehindTableError`).

    Raises:
        DataLossError: such a partition (terminal: the query stops).
    """
    for topic, parts in sorted(ends.items()):
        read = start.get(topic, {})
        # the last offset read is the one before the next, which a partition not read yet has at 0
        if behind := ends_before(parts, {p: read.get(p, 0) - 1 for p in parts}.get):
            p, (done, end) = next(iter(behind.items()))
            raise DataLossError(
                f"topic {topic} partition {p} ends at offset {end - 1}, before offset {done + 1} the stream reads "
                "next: the topic was deleted and created again, or the broker lost records. Start the run again: "
                "its start stops the table of this topic and runs the others "
                "(docs/operations.md#a-topic-that-ends-before-its-table)")


def _share(lag: dict[tuple[str, str], int], budget: int) -> dict[tuple[str, str], int]:
    """How many records each partition may take when together they may take ``budget``.

    Like Kafka's source: the budget is shared among the partitions in proportion to their lag. When
    rounding leaves nothing, the most-lagging partition takes what it can, so the stream progresses.
    """
    total = sum(lag.values())
    if total <= budget:
        return dict(lag)
    shares = {tp: behind * budget // total for tp, behind in lag.items()}
    if not any(shares.values()):
        first = max(lag, key=lambda tp: lag[tp])
        shares[first] = min(lag[first], max(1, budget))
    return shares


def read_ranges(log: Log, topic: str, start: dict[int, int], end: dict[int, int]) -> pa.Table:
    """The records ``start[p] <= offset < end[p]`` of ``topic``'s partitions, without Spark."""

    pieces = [log.read(topic, p, start[p], end[p]) for p in sorted(start) if end[p] > start[p]]
    return pa.concat_tables(pieces) if pieces else KAFKA_ROW_SCHEMA.empty_table()


def fetch_messages(log: Log, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
    """Raw key, value and timestamp of some messages, read again from ``log`` by their coordinates."""

    wanted: dict[tuple[str, int], set[int]] = {}
    for topic, partition, offset in coords:
        wanted.setdefault((topic, partition), set()).add(offset)
    out = {}
    for (topic, partition), offsets in wanted.items():
        rows = log.read(topic, partition, min(offsets), max(offsets) + 1)
        rows = rows.filter(pc.is_in(rows["offset"], pa.array(sorted(offsets), pa.int64())))
        for offset, key, value, ts in zip(*(rows[c].to_pylist() for c in ("offset", "key", "value", "timestamp")),
                                          strict=True):
            out[(topic, partition, offset)] = (key, value, ts)
    return out


def open_stream(spark: SparkSession, location: Mapping[str, str], topics: list[str], starting: str,
                max_records: int, decoder: Any = None, *, max_per_topic: int | None = None) -> DataFrame:
    """A stream of ``topics`` through this reader; ``location`` is ``{"path": ...}`` or ``{"kafka": ...}``.

    ``max_records`` bounds a micro-batch, ``max_per_topic`` (if given) each topic's share of it.
    ``minPartitions`` is the cores: a topic of one partition is still decoded by every core.
    """
    reader = spark.readStream.format(FORMAT_NAME)
    for key, value in location.items():
        reader = reader.option(key, value)
    reader = (reader.option("subscribe", ",".join(topics)).option("startingOffsets", starting)
              .option("maxOffsetsPerTrigger", str(max_records))
              .option("minPartitions", str(spark.sparkContext.defaultParallelism)))
    if max_per_topic is not None:
        reader = reader.option("maxRecordsPerTopic", str(max_per_topic))
    if decoder is not None:
        reader = reader.option("decode", encode_decoder(decoder))
    return reader.load()


def encode_decoder(decoder: Any) -> str:
    """A :class:`~ingest.decode.columnar.BatchDecoder` as the reader's ``decode`` option (no secrets in it)."""
    return base64.b64encode(pickle.dumps(decoder)).decode("ascii")


class TopicLogDataSource(DataSource):
    """``spark.readStream.format("cdc_topiclog")``: a topic log as a Kafka-shaped stream."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        if self.options.get("decode"):
            # the decoders (fastavro, orjson): only in a stream that decodes as it reads
            from ingest.decode.parts import PARTS_DDL

            return PARTS_DDL
        return KAFKA_SCHEMA_DDL

    def streamReader(self, schema: Any) -> TopicLogStreamReader:
        logs.inherit()  # called in the Python process Spark starts for the stream, which logs its outages
        return TopicLogStreamReader(self.options)
