"""How a query's micro-batches reach the driver: as decoded parts, never raw rows.

:class:`Decoding` holds what decoding needs -- each topic's decoder spec with the registry's schemas,
the driver's registry client, and the source when it decodes as it reads -- and the three ways a
micro-batch's parts are got: the executors decode it (``mapInArrow``) and the driver collects the
parts; the source's reader decoded it already; or, for a small micro-batch, the driver reads and
decodes it itself, without a Spark job (:meth:`Decoding.read_here`). A table's retry decodes its
share again (:meth:`Decoding.redecoded`), and quarantine fetches a message's raw bytes again
(:meth:`Decoding.raw_fetch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ingest import secrets
from ingest.apply.batch import RawFetch
from ingest.config import IngestConfig, TableSpec
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.decode.parts import PARTS_DDL, part_kind, read_parts
from ingest.decode.registry import ConfluentSchemaRegistry, confluent_registry
from ingest.errors import RegistryUnavailableError
from ingest.lake.location import Location
from ingest.source.reader import MIN_PIECE, batch_spans
from ingest.source.sources import DecodingSource, decodes_at_read, source_for
from ingest.stream import checkpoint as checkpoints

log = logging.getLogger(__name__)


class Decoding:
    """The decoding of one query's micro-batches (see the module)."""

    def __init__(self, config: IngestConfig, specs: list[TableSpec], checkpoint: Location | None) -> None:
        self.specs_by_topic = {s.topic: DecoderSpec.for_table(config, s) for s in specs}
        self.decoder = BatchDecoder(self.specs_by_topic)
        self.registry = _driver_registry(config)
        #: the source, when it decodes as it reads (the stream's rows are then parts)
        self.source = cast(DecodingSource, source_for(config)) if decodes_at_read(config) else None
        #: the query's checkpoint, whose offsets log says where a micro-batch starts and ends (:meth:`read_here`)
        self.checkpoint = checkpoint
        #: the last micro-batch whose offsets were read there, and where it ends (where the next starts)
        self._last_end: tuple[int, dict[str, dict[int, int]]] | None = None

    def also(self, topic: str, spec: DecoderSpec) -> None:
        """Decode ``topic`` too, a topic the query reads for no table (the transaction topic)."""
        self.specs_by_topic[topic] = spec
        self.decoder = BatchDecoder(self.specs_by_topic)

    def parts(self, frame: DataFrame) -> DataFrame:
        """The micro-batch's parts as a DataFrame: decoded as the source read them, or by ``mapInArrow``."""
        return frame if self.source is not None else frame.mapInArrow(self.decoder, PARTS_DDL)

    @staticmethod
    def collect(parts: DataFrame, exclude: set[str] | None = None) -> list[Any]:
        """Parts on the driver, less those of the ``exclude`` topics (left on the executors)."""
        if exclude:
            parts = parts.mapInArrow(_without_topics(exclude), PARTS_DDL)
        return read_parts(parts.toArrow().column("part").to_pylist())

    def read_here(self, batch_id: int) -> list[Any] | None:
        """A small micro-batch read and decoded by the driver, without a Spark job; ``None`` when the
        reader's tasks decode it instead.

        The driver reads it when its source decodes as it reads, and the query's offsets log says
        where it starts (the batch before it ends there) and ends, and it holds fewer than
        :data:`~ingest.source.reader.MIN_PIECE` records. Such a batch is one task's work in Spark
        too; the job around it (plan, schedule, a Python worker, the parts sent back) cost about
        0.1 s on two cores, several times the reading and decoding, and shared the cores with the
        batch being applied. The first batch of a checkpoint, and larger ones, are Spark's.

        A batch read here is applied before the callback returns, not beside the next micro-batch:
        there is no decoding left to overlap. Spark's next micro-batch then takes in every record
        that arrived while this one was applied; started beside it, it would have left them for the
        one after, and waited for this apply before its own.
        """
        if self.source is None or self.checkpoint is None or batch_id == 0:
            return None
        topics = list(self.specs_by_topic)  # the tables' and the transaction topic
        last, self._last_end = self._last_end, None
        start = last[1] if last is not None and last[0] == batch_id - 1 else \
            checkpoints.batch_offsets(self.checkpoint, batch_id - 1, topics)
        end = checkpoints.batch_offsets(self.checkpoint, batch_id, topics) if start is not None else None
        if start is None or end is None:
            return None
        self._last_end = batch_id, end  # where the next batch starts (an object store's read saved)
        spans = batch_spans(start, end)
        if sum(stop - begin for _, _, begin, stop in spans) >= MIN_PIECE:
            return None
        ranges: dict[str, tuple[dict[int, int], dict[int, int]]] = {}
        for topic, partition, begin, stop in spans:
            lo, hi = ranges.setdefault(topic, ({}, {}))
            lo[partition], hi[partition] = begin, stop
        return [part for topic, (lo, hi) in ranges.items()
                for part in self.decoder.decode(self.source.read_arrow(topic, lo, hi))]

    def prefetch_schemas(self, active: list[TableSpec]) -> None:
        """Hand the executors every schema of the active topics, so they need not call the registry:
        with each micro-batch's ``mapInArrow``, or, for a reader that decodes as it reads, once in
        the decoder its stream starts with (a schema registered later, the workers fetch themselves).

        A registry the driver cannot read is not an error here: the workers then try themselves, and
        a table whose schemas stay unreachable fails its batch as before (retried, then stopped).
        """
        if self.registry is None:
            return
        for spec in active:
            try:
                found = self.registry.subject_schemas([f"{spec.topic}-key", f"{spec.topic}-value"])
            except RegistryUnavailableError as exc:
                log.warning("table %s: schemas not prefetched (%s); the executors will ask the registry",
                            spec.name, secrets.describe(exc))
                continue
            known = self.specs_by_topic[spec.topic]
            self.specs_by_topic[spec.topic] = replace(known, schemas=tuple(sorted(found.items())))
        self.decoder = BatchDecoder(self.specs_by_topic)

    def redecoded(self, spec: TableSpec, frame: DataFrame | None, parts: list[Any]) -> list[Any]:
        """The table's share decoded again, for a retry: by ``mapInArrow``, or, where the source decoded
        as it read and some message found the registry unavailable, here from the same offsets read
        again."""
        if self.source is None:
            if frame is None:
                return parts
            return self.collect(frame.filter(frame.topic == spec.topic).mapInArrow(self.decoder, PARTS_DDL))
        if not unavailable(parts):
            return parts  # decoded without the registry's help, or with it: reading again changes nothing
        start: dict[int, int] = {}
        end: dict[int, int] = {}
        for part in parts:
            if part.num_rows:
                for partition, offset in zip(part.column("_cdc_partition").to_pylist(),
                                             part.column("_cdc_offset").to_pylist(), strict=True):
                    start[partition] = min(start.get(partition, offset), offset)
                    end[partition] = max(end.get(partition, offset + 1), offset + 1)
        return self.decoder.decode(self.source.read_arrow(spec.topic, start, end)) if start else parts

    def raw_fetch(self, frame: DataFrame | None) -> RawFetch:
        """What finds messages' raw key, value and timestamp again, for quarantine: the source, or the micro-batch."""
        if self.source is not None:
            return self.source.fetch
        return lambda coords: fetch_raw(frame, coords)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.source is not None:
            self.source.close()


def unavailable(parts: list[Any]) -> bool:
    """Whether some message of the parts could not be decoded because the registry did not answer."""
    return any(part.num_rows and part_kind(part.schema) == "meta"
               and pc.any(pc.equal(part.column("_cdc_kind"), "unavailable")).as_py() for part in parts)


def fetch_raw(frame: DataFrame, coords: list[tuple[str, int, int]]) -> dict[tuple[str, int, int], tuple[Any, Any, Any]]:
    """Raw key, value and timestamp of some messages of a micro-batch, read again from the source."""
    by_topic_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in coords:
        by_topic_partition.setdefault((topic, partition), []).append(offset)
    condition: Any = None
    for (topic, partition), offsets in by_topic_partition.items():
        clause = (F.col("topic") == topic) & (F.col("partition") == partition) & F.col("offset").isin(offsets)
        condition = clause if condition is None else condition | clause
    rows = frame.filter(condition).select("topic", "partition", "offset", "key", "value", "timestamp").toArrow()
    return {(t, p, o): (k, v, ts) for t, p, o, k, v, ts in zip(*(rows[c].to_pylist() for c in rows.column_names),
                                                               strict=True)}


def _without_topics(topics: set[str]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function that drops the parts of ``topics``."""

    def keep(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            blobs = [b for b in batch.column(0).to_pylist()
                     if not any(p.num_rows and p.column("_cdc_topic")[0].as_py() in topics for p in read_parts([b]))]
            yield pa.RecordBatch.from_pydict({"part": blobs}, schema=pa.schema([("part", pa.binary())]))
    return keep


def _driver_registry(config: IngestConfig) -> ConfluentSchemaRegistry | None:
    """The driver's client of a Confluent-compatible registry (None for the embedded one)."""
    try:
        return confluent_registry(config)
    except RegistryUnavailableError as exc:
        log.warning("schema registry client not created on the driver (%s); the executors will ask it",
                    secrets.describe(exc))
        return None
