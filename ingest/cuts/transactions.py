"""The connector's transaction topic, read on the driver: the END record of each committed transaction.

Debezium (``provide.transaction.metadata: true``) writes a BEGIN and an END record per source
transaction to ``<topic.prefix>.transaction``, in commit order; the END record counts the
transaction's changes per data collection. Only END records matter to cuts: a transaction whose
END is not there yet cannot be placed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ingest.config import IngestConfig
from ingest.cuts.calculus import Transaction, Unprovable
from ingest.decode.columnar import DecoderSpec
from ingest.decode.position import optional_int
from ingest.errors import DecodeError
from ingest.source.kafkalog import KafkaLog
from ingest.source.topiclog import TopicLog

if TYPE_CHECKING:
    from ingest.source.reader import Log

#: Records read from the transaction topic at a time.
STEP = 20_000


class TransactionTopic:
    """Reads a connector's transaction topic from where the last read ended."""

    def __init__(self, config: IngestConfig) -> None:
        assert config.source.transactions is not None
        self.topic = config.source.transactions.topic
        self.log = log_of(config)
        self.decoder = DecoderSpec.for_source(config)()

    def read(self, start: int) -> tuple[list[Transaction], int]:
        """The END records at offsets from ``start`` on, and the offset after the last one read.

        Raises:
            Unprovable: the topic has more than one partition (its records then have no one order).
        """
        if not self.log.exists(self.topic):
            return [], start
        ends = self.log.end_offsets(self.topic)
        if len(ends) > 1:
            raise Unprovable(f"transaction topic {self.topic} has {len(ends)} partitions: the order of its "
                             "transactions is kept in one partition only")
        end = ends.get(0, 0)
        start = max(start, self.log.start_offsets(self.topic).get(0, 0))
        found: list[Transaction] = []
        for lo in range(start, end, STEP):
            found.extend(self._ends(lo, min(end, lo + STEP)))
        return found, max(start, end)

    def _ends(self, start: int, end: int) -> Iterator[Transaction]:
        records = self.log.read(self.topic, 0, start, end)
        for offset, value in zip(records["offset"].to_pylist(), records["value"].to_pylist(), strict=True):
            if value is None:
                continue
            try:
                record, _plan = self.decoder.read_value(value)
            except DecodeError as exc:
                raise Unprovable(f"transaction topic {self.topic} offset {offset} does not decode: {exc.reason}") \
                    from None
            txn = end_record(record, 0, offset)
            if txn is not None:
                yield txn


def end_record(record: Any, partition: int, offset: int) -> Transaction | None:
    """The transaction an END record closes (``None`` for a BEGIN or anything else)."""
    if not isinstance(record, dict) or record.get("status") != "END" or record.get("id") is None:
        return None
    counts: dict[str, int] = {}
    for entry in record.get("data_collections") or ():
        if isinstance(entry, dict) and entry.get("data_collection") is not None:
            counts[str(entry["data_collection"])] = optional_int(entry.get("event_count")) or 0
    ts_ms = optional_int(record.get("ts_ms"))
    commit = datetime.fromtimestamp(ts_ms / 1000, UTC) if ts_ms is not None else None
    return Transaction(str(record["id"]), partition, offset, commit, counts)


def log_of(config: IngestConfig) -> Log:
    """The configured source's records, read on the driver (the embedded log, or Kafka with librdkafka)."""
    if config.source.kind == "kafka":
        assert config.source.kafka is not None
        return KafkaLog(config.source.kafka, str(config.secrets_path) if config.secrets_path else None)
    return TopicLog(config.log_dir)
