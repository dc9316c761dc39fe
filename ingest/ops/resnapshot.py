"""Re-snapshotting tables while their streams keep flowing: Debezium's incremental snapshot.

``ingest resnapshot <table>`` writes an ``execute-snapshot`` signal to the table's connector through
its Kafka signal channel (``signal.enabled.channels`` with ``kafka``; ``source.kafka.signal_topic``
names the topic, Debezium's ``<topic.prefix>-signal`` by default). The connector then reads the
table again in chunks, between watermarks it writes to its signal table, and emits the rows as
snapshot reads (``op: r``, ``source.snapshot: incremental``) among the live changes, dropping a
chunk's read of a row that changed while the chunk was open. The engine applies them as any
change: by source position, so a read never undoes a later change, and a deleted row is not read.
A row missing from the lake comes back; the audit counts the reads (``snapshot_reads``).

A connector that takes no signals from Kafka reads them from its signal table (Debezium's ``source``
channel): ``--signal-table`` with ``--source-db`` inserts the same signal there instead.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError, first_line
from ingest.source.producer import Outgoing, produce

if TYPE_CHECKING:
    from ingest.verify.source_db import SourceDatabase


@dataclass(frozen=True, slots=True)
class Signal:
    """One ``execute-snapshot`` signal: to which connector (its topic prefix), on which topic, for
    which of its tables (Debezium's data collections, ``<schema>.<table>``)."""

    prefix: str
    topic: str
    collections: tuple[str, ...]
    tables: tuple[str, ...]
    where: str | None = None  # read only the rows matching this SQL condition (Debezium's additional-conditions)

    def value(self) -> dict[str, object]:
        data: dict[str, object] = {"data-collections": list(self.collections), "type": "incremental"}
        if self.where is not None:
            data["additional-conditions"] = [{"data-collection": c, "filter": self.where} for c in self.collections]
        return {"type": "execute-snapshot", "data": data}

    def row(self) -> tuple[str, str, str]:
        """The signal as a signal table's ``(id, type, data)`` row."""
        value = self.value()
        return str(uuid.uuid4()), str(value["type"]), json.dumps(value["data"])


def signals_for(config: IngestConfig, tables: list[str], where: str | None = None) -> list[Signal]:
    """The signals that ask for ``tables``, one per connector; with ``where``, for the rows of the one
    table in ``tables`` that match it (an SQL condition the source database evaluates).

    Raises:
        ConfigError: an unknown table, a source that is not Kafka, a topic not named
            ``<prefix>.<schema>.<table>`` without ``source_table``, or ``where`` with more than one
            table, or empty.
    """
    if config.source.kind != "kafka" or config.source.kafka is None:
        raise ConfigError("ingest resnapshot asks a Debezium connector through Kafka: the source is not Kafka")
    if where is not None and (len(tables) != 1 or not where.strip()):
        raise ConfigError("--where selects rows of one table: name exactly one table, and a condition such as "
                          "\"id IN (5, 9)\"")
    by_prefix: dict[str, list[tuple[str, str]]] = {}
    for name in tables:
        spec = config.table(name)
        prefix, collection = _connector_of(spec)
        by_prefix.setdefault(prefix, []).append((collection, spec.name))
    topic = config.source.kafka.signal_topic
    return [Signal(prefix, topic.format(prefix=prefix), tuple(c for c, _ in found), tuple(t for _, t in found),
                   where)
            for prefix, found in sorted(by_prefix.items())]


def send(config: IngestConfig, signals: list[Signal]) -> None:
    """Write each signal to its topic, keyed by its connector's prefix (as Debezium requires).

    Raises:
        SourceUnavailableError: Kafka did not take a signal.
    """
    now = int(time.time() * 1000)
    for signal in signals:
        record = Outgoing(0, signal.prefix.encode(), json.dumps(signal.value()).encode(), now)
        produce(config, signal.topic, [record], partitions=1)


def insert(source: SourceDatabase, dsn: str, table: str, signals: list[Signal]) -> None:
    """Insert each signal into the signal table ``table`` (``<schema>.<table>``) of the source database
    ``dsn``, where a connector whose ``signal.data.collection`` it is reads it.

    Raises:
        ConfigError: ``table`` is not ``<schema>.<table>``, or the database refused the insert (no
            such table, no ``INSERT`` privilege): one line with its cause.
    """
    if len(table.split(".")) != 2 or not all(table.split(".")):
        raise ConfigError(f"signal table {table!r} is not <schema>.<table> (the connector's signal.data.collection)")
    with source.connect(dsn) as conn:
        for signal in signals:
            try:
                source.insert_signal(conn, table, signal.row())
            except source.Error as exc:
                raise ConfigError(f"signal table {table}: {first_line(exc)}") from None


def insert_at(dsn: str, table: str, signals: list[Signal]) -> str:
    """:func:`insert` into the database ``dsn`` names; returns where the signals went (for a reader).

    Raises:
        EnvironmentProblem: no client for that database is installed.
        ConfigError: the database refused the insert.
        SourceUnavailableError: the database did not take the connection: one line with its cause.
    """
    # the source databases' clients (extras of the distribution): loaded for a source database only
    from ingest.verify.source_db import reached, source_database

    source = source_database(dsn)
    where = source.describe(dsn)
    with reached(source, where):
        insert(source, dsn, table, signals)
    return f"{table} ({where})"


def _connector_of(spec: TableSpec) -> tuple[str, str]:
    """``(topic prefix, data collection)`` of a table: ``<prefix>.<schema>.<table>`` topics."""
    prefix = spec.topic_prefix()
    if prefix is None:
        raise ConfigError(f"table {spec.name}: topic {spec.topic!r} is not <prefix>.<schema>.<table>, so its "
                          "connector cannot be told which table to read again")
    return prefix, spec.source_table or spec.topic.removeprefix(prefix + ".")
