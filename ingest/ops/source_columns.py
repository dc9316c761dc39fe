"""The columns a table's source delivers now, for the checks that compare configuration with them.

A table's topic says its columns in its newest value schema (Avro: the schema last registered under
the topic's value subject) or in its newest change (JSON: a message names its own columns). ``ingest
check`` asks for them twice -- the columns a table names, and those its suite reads before the
table's first commit -- and :class:`SourceColumns` asks each table once, through one client. It also
says whether a topic's newest changes carry a Kafka key, which a table without ``primary_key`` is keyed by.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Container
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from ingest.config import IngestConfig, TableSpec
from ingest.decode.avro import newest_row_columns
from ingest.decode.columnar import DecoderSpec
from ingest.decode.registry import driver_registry
from ingest.errors import DecodeError, IngestError
from ingest.model import ChangeEvent, KafkaCoordinates
from ingest.source.kafkalog import KafkaLog
from ingest.source.topiclog import TopicLog

#: Where a table's source columns were read (the newest "schema under <subject>"), and the columns
#: (``None``: nothing holds them yet).
ColumnsOf = Callable[[TableSpec], tuple[str, tuple[str, ...] | None]]


def columns_from(config: IngestConfig) -> str:
    """Which check's subject says a table's source columns: the registry (Avro) or the source (JSON)."""
    return "registry" if config.source.value_format == "avro" else "source"


class SourceColumns:
    """The columns each table's source has now -- its topic's newest value schema (Avro) or newest
    change (JSON) -- asked once per table for the checks that need them (``columns``, ``quality``),
    through one registry client or one consumer, made at the first question and closed by :meth:`close`.
    """

    def __init__(self, config: IngestConfig, failed: Container[str]) -> None:
        self._config = config
        #: the check whose failure means nothing can be asked: ``registry`` (Avro) or ``source`` (JSON)
        self.subject = columns_from(config)
        self._failed = failed  # the checks failed so far
        self._log: KafkaLog | TopicLog | None = None
        self._found: dict[str, tuple[str, tuple[str, ...] | None] | IngestError] = {}

    def __call__(self, spec: TableSpec) -> tuple[str, tuple[str, ...] | None]:
        """Where the columns were read (``schema under <subject>``) and the columns (``None``: none yet).

        Raises:
            IngestError: the registry's or the source's check failed before, or this table's
                first question.
        """
        if self.subject in self._failed:
            raise IngestError(f"the {self.subject} check failed")
        if spec.name not in self._found:
            try:
                self._found[spec.name] = self._newest(spec)
            except IngestError as exc:
                self._found[spec.name] = exc
        found = self._found[spec.name]
        if isinstance(found, IngestError):
            raise found
        return found

    def keyed(self, spec: TableSpec) -> tuple[int, int]:
        """Among the newest records of the table's topic: how many carry a change (a value), and
        how many of those have a Kafka key (none, for a source table without a primary key; a
        truncate has none either); ``(0, 0)`` while the topic does not exist or holds nothing."""
        log = self._source_log()
        if not log.exists(spec.topic):
            return 0, 0
        records = _tail(log, spec.topic)
        if records is None:
            return 0, 0
        changes = records.filter(pc.is_valid(records["value"]))
        return changes.num_rows, pc.count(changes["key"]).as_py()

    def _source_log(self) -> KafkaLog | TopicLog:
        if self._log is None:
            kafka = self._config.source.kafka
            secrets_file = str(self._config.secrets_path) if self._config.secrets_path else None
            # one consumer for every read (a table's partitions, the tables)
            self._log = (KafkaLog(kafka, secrets_file, keep_open=True) if kafka is not None
                         else TopicLog(self._config.log_dir))
        return self._log

    @functools.cached_property
    def _newest(self) -> ColumnsOf:
        if self.subject == "registry":
            return _newest_schema_columns(self._config)
        return _newest_change_columns(self._config, self._source_log())

    def close(self) -> None:
        if isinstance(self._log, KafkaLog):
            self._log.close()


def _newest_schema_columns(config: IngestConfig) -> ColumnsOf:
    """Avro: the row columns of the schema last registered under the topic's value subject.

    Raises:
        DecodeError: the newest schema is not a Debezium change's (a wrong topic).
    """
    registry = driver_registry(config)

    def columns(spec: TableSpec) -> tuple[str, tuple[str, ...] | None]:
        return f"schema under {spec.topic}-value", newest_row_columns(registry, spec.topic)
    return columns


def _newest_change_columns(config: IngestConfig, log: KafkaLog | TopicLog) -> ColumnsOf:
    """JSON: the row columns of the newest change among the last records of each partition of the topic
    in ``log`` (a JSON message names its own columns; no registry holds them)."""
    decoder = DecoderSpec.for_source(config)()  # no key override: the check is whether the key is there

    def columns(spec: TableSpec) -> tuple[str, tuple[str, ...] | None]:
        where = f"change in topic {spec.topic}"
        if not log.exists(spec.topic):
            return where, None
        records = _tail(log, spec.topic)
        if records is None:
            return where, None
        refused: list[DecodeError] = []
        for record in records.select(["key", "value", "partition", "offset"]).to_pylist():
            try:
                event = decoder.decode(record["key"], record["value"],
                                       KafkaCoordinates(spec.topic, record["partition"], record["offset"]))
            except DecodeError as exc:
                refused.append(exc)
                continue
            if isinstance(event, ChangeEvent) and event.columns:
                return where, tuple(c.name for c in event.columns)
        if refused:
            raise DecodeError(f"none of the newest {records.num_rows} records of topic {spec.topic} is a change "
                              f"as a run decodes it ({len(refused)} refused: {refused[0].reason})")
        return where, None
    return columns


def _tail(log: KafkaLog | TopicLog, topic: str) -> pa.Table | None:
    """The last :data:`_TAIL` records of each partition of ``topic``, newest first (``None``: none)."""
    starts = log.start_offsets(topic)
    tails = [log.read(topic, p, max(starts.get(p, 0), end - _TAIL), end)
             for p, end in log.end_offsets(topic).items() if end > starts.get(p, 0)]
    if not tails:
        return None
    return pa.concat_tables(tails).sort_by([("timestamp", "descending"), ("offset", "descending")])


#: Records read from the end of each partition to find the newest change (heartbeats, tombstones
#: and schema changes sit among them).
_TAIL: Final = 20
