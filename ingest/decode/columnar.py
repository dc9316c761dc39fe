"""Kafka rows in, typed columnar change rows out: the decode step that runs in Spark's executors.

:class:`BatchDecoder` is the function Spark runs in ``mapInArrow`` (and the embedded log's reader
runs as it reads). It turns a batch of Kafka-shaped rows into *parts* (:mod:`ingest.decode.parts`):
one per value schema, one of tombstones per key shape, one of the messages that carry no change.
Spark cannot know a part's types before it has seen the batch (a schema may change in any
message), so each part travels as an Arrow IPC stream in one binary cell; the driver unifies the
parts into the table's schema (:mod:`ingest.apply.batch`). Raw bytes travel only with messages
that did not decode.

Two paths, one set of rules. Envelopes of a schema already seen take the *fast path*: the record is
read, its position and key names are worked out, and its raw image is kept; each schema's images
are then converted column by column with the schema's field plans. Anything else -- tombstones,
flattened rows, control records, schemaless JSON, and any group in which a value does not convert
-- goes message by message through :class:`~ingest.decode.MessageDecoder`, which has the final
word on every rule and every error message.

This module imports nothing heavy (no Spark, Delta, pandas or Great Expectations): Python workers
start fast.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.decode import MessageDecoder
from ingest.decode.columns import twin_of
from ingest.decode.envelope import snapshot_mark, transaction_of
from ingest.decode.position import optional_int, source_position
from ingest.decode.values import ConvertError
from ingest.errors import DecodeError, RegistryUnavailableError
from ingest.heap import freeze_start_up
from ingest.model import SNAPSHOT, STREAMED, KafkaCoordinates

if TYPE_CHECKING:
    from ingest.config import IngestConfig, TableSpec, TlsSpec

from ingest.decode.parts import ROW_OPS, TS, Message, PartsBuilder, arrow_type_of, assemble, write_parts
from ingest.decode.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry, PrefetchedSchemaRegistry


class _NeedsSlowPath(Exception):
    """The fast path leaves this group to the per-message decoder."""


class _Group:
    """Envelopes of one value schema and key on the fast path, converted column by column."""

    def __init__(self, plan: Any, names: tuple[str, ...]) -> None:
        self.plan = plan.for_key(names)
        self.names = names
        self.messages: list[Message] = []
        self.ops: list[str] = []
        self.positions: list[str] = []
        self.source_ts: list[int | None] = []
        self.images: list[dict[str, Any]] = []
        self.txns: list[str | None] = []
        self.txn_orders: list[int | None] = []
        self.snapshots: list[str | None] = []

    def add(self, message: Message, change: _FastChange) -> None:
        self.messages.append(message)
        self.ops.append(change.op)
        self.positions.append(change.position)
        self.source_ts.append(change.source_ts_ms)
        self.images.append(change.image)
        self.txns.append(change.transaction[0] if change.transaction else None)
        self.txn_orders.append(change.transaction[1] if change.transaction else None)
        self.snapshots.append(change.snapshot)

    def finish(self, decoder: MessageDecoder, out: PartsBuilder) -> None:
        try:
            out.converted.append(self._convert(out.source))
        except (ConvertError, DecodeError, ArithmeticError, TypeError, ValueError, OverflowError,
                pa.ArrowInvalid, pa.ArrowTypeError, _NeedsSlowPath):
            # Some value does not fit: the per-message decoder says which, message by message.
            for message in self.messages:
                out.slow(decoder, message)

    def _convert(self, source: pa.Table) -> pa.RecordBatch:
        fields = self.plan.image
        if any(name not in {f.name for f in fields} for name in self.names):
            raise _NeedsSlowPath
        n = len(self.images)
        toast: list[list[str] | None] = [None] * n
        user: list[pa.Array] = []
        for (name, convert, markers, spec), raw in zip(fields, self._columns(), strict=True):
            # The placeholder is rare: looked for by C-level scans, replaced row by row if found.
            if markers and any(marker in raw for marker in markers):
                raw = list(raw)
                for i, v in enumerate(raw):
                    if v is not None and v in markers:
                        raw[i] = None
                        toast[i] = [*(toast[i] or ()), name]
            if name in self.names and None in raw:
                raise _NeedsSlowPath  # a null key: the per-message decoder names it
            arrow = arrow_type_of(spec.type)
            column = twin_of(convert)
            if column is not None:
                try:
                    user.append(column(raw, arrow))
                    continue
                except Exception:  # any doubt: value by value below, which has the last word
                    pass
            values = raw if convert is None else [None if v is None else convert(v) for v in raw]
            user.append(pa.array(values, arrow))
        key_columns = json.dumps(list(self.names))
        given = {
            "_cdc_kind": pa.array(["change"] * n, pa.string()),
            "_cdc_op": pa.array(self.ops, pa.string()),
            "_cdc_position": pa.array(self.positions, pa.string()),
            "_cdc_source_ts": pa.array([None if t is None else t * 1000 for t in self.source_ts],
                                       pa.int64()).cast(TS),
            "_cdc_flattened": pa.array([False] * n, pa.bool_()),
            "_cdc_toast": pa.array(toast, pa.list_(pa.string())),
            "_cdc_key_columns": pa.array([key_columns] * n, pa.string()),
            "_cdc_schema": pa.array([self.plan.schema_ref] * n, pa.string()),
            "_cdc_txn": pa.array(self.txns, pa.string()),
            "_cdc_txn_order": pa.array(self.txn_orders, pa.int64()),
            "_cdc_snapshot": pa.array(self.snapshots, pa.string()),
        }
        return assemble("changes", self.plan.columns, [m[1] for m in self.messages], given, user, source)


    def _columns(self) -> list[Sequence[Any]]:
        """The images' values, column by column in the plan's order (``None`` where one lacks a column)."""
        names = [f.name for f in self.plan.image]
        if not names:
            return []
        get = itemgetter(*names)
        try:
            if len(names) == 1:
                return [list(map(get, self.images))]
            return list(zip(*map(get, self.images), strict=True))
        except KeyError:  # some image lacks a column (a null): one by one
            return [[image.get(name) for image in self.images] for name in names]


@dataclass(frozen=True, slots=True)
class _FastChange:
    """What the fast path reads of an ordinary envelope; its image is converted with its group's."""

    names: tuple[str, ...]
    op: str
    position: str
    source_ts_ms: int | None
    image: dict[str, Any]
    transaction: tuple[str, int] | None
    snapshot: str | None


def _fast_change(decoder: MessageDecoder, record: Any, plan: Any, key: bytes | None, coords: KafkaCoordinates
                 ) -> _FastChange | None:
    """What the fast path takes of an ordinary envelope (:class:`_FastChange`), else ``None``."""
    if plan is None or plan.kind != "envelope" or type(record) is not dict:
        return None
    op = record.get("op")
    if op not in ROW_OPS:
        return None
    image = record.get("after") if op != "d" else record.get("before")
    source = record.get("source")
    if type(image) is not dict or type(source) is not dict:
        return None
    names = decoder.key_names(key)
    if not names:
        return None
    if op == "u" and decoder.key_columns and _may_move(record.get("before"), image, names):
        return None  # the per-message decoder splits a move of a configured key
    try:
        position = source_position(source, SNAPSHOT if op == "r" else STREAMED, coords, trust_connector=True)
    except DecodeError:
        return None
    ts_ms = optional_int(source.get("ts_ms"))
    if ts_ms is None:
        ts_ms = optional_int(record.get("ts_ms"))
    block = record.get("transaction")
    return _FastChange(names, op, position.encode(), ts_ms, image,
                       None if block is None else transaction_of(block, source.get("connector")),
                       snapshot_mark(source.get("snapshot")) if op == "r" else None)


def _may_move(before: Any, after: dict[str, Any], names: tuple[str, ...]) -> bool:
    """Whether an update's before image holds other values in the key columns ``names`` (raw, as
    sent: equal raw values are equal keys)."""
    return type(before) is dict and any(before.get(n) is not None and before.get(n) != after.get(n) for n in names)


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector held off while a batch decodes.

    Decoding allocates a few objects per message -- parsed records, rows, strings -- none of them in
    a cycle: reference counting frees them as before. The collector's passes, which the allocations
    trigger, found nothing and cost a fifth of a JSON batch's decode (``gc.disable`` per batch,
    alternating with and without: 5.5 against 7.0 s of CPU for 214,460 records). A cycle made
    meanwhile waits for the next pass.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_DECODERS: dict[Any, MessageDecoder] = {}


class BatchDecoder:
    """Decodes Kafka-shaped Arrow batches into typed parts (see module docstring).

    Args:
        factories: the decoder of each topic -- a :class:`DecoderSpec` (or any picklable factory
            of a :class:`~ingest.decode.MessageDecoder`) per topic, or one for every topic.
    """

    def __init__(self, factories: Mapping[str, Any] | Any) -> None:
        self.factories = dict(factories) if isinstance(factories, Mapping) else factories

    def factory(self, topic: str) -> Any:
        if isinstance(self.factories, dict):
            return self.factories[topic]
        return self.factories

    def decoder(self, topic: str) -> MessageDecoder:
        # One decoder (and its schema plans) per worker process and table, across tasks and batches.
        factory = self.factory(topic)
        cached = _DECODERS.get(factory)
        if cached is None:
            if len(_DECODERS) >= 64:
                _DECODERS.clear()
            cached = _DECODERS[factory] = factory()
        return cached

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield self.parts(batch)
        freeze_start_up()  # the worker has read and decoded once: what it holds now stays (ingest.heap)

    def parts(self, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """One input batch as a batch of IPC parts (one row per part)."""
        return write_parts(self.decode(batch))

    def decode(self, batch: pa.RecordBatch | pa.Table) -> list[pa.RecordBatch]:
        """Decode every message of ``batch`` into parts; a message that fails becomes an ``error`` row.

        A schema registry that does not answer fails no message and no other topic: the topic's
        messages become one ``unavailable`` row each (the driver then retries, or stops that table).
        """
        topics = batch.column("topic")
        names = pc.unique(topics).to_pylist()
        if len(names) > 1:
            return [part for name in names for part in self.decode(batch.filter(pc.equal(topics, name)))]
        try:
            with _no_cycle_collection():
                return self._decode_topic(self.decoder(names[0]), batch)
        except RegistryUnavailableError as exc:
            source = pa.table({name: batch.column(name) for name in ("topic", "partition", "offset", "timestamp")})
            out = PartsBuilder(source)
            for row in range(batch.num_rows):
                out.meta.add("unavailable", row, reason=exc.args[0] if exc.args else str(exc))
            return out.parts()

    def _decode_topic(self, decoder: MessageDecoder, batch: pa.RecordBatch | pa.Table) -> list[pa.RecordBatch]:
        source = pa.table({name: batch.column(name) for name in ("topic", "partition", "offset", "timestamp",
                                                                 "headers") if name in batch.schema.names})
        # Only what decoding needs becomes Python objects; the rest is taken from the input by row.
        millis = pc.divide(pc.cast(pc.cast(batch.column("timestamp"), pa.timestamp("us")), pa.int64()), 1000)
        out = PartsBuilder(source)
        groups: dict[tuple[int, tuple[str, ...]], _Group] = {}
        for row, (topic, partition, offset, ts_ms, key, value) in enumerate(zip(
                batch.column("topic").to_pylist(), batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(), millis.to_pylist(), batch.column("key").to_pylist(),
                batch.column("value").to_pylist(), strict=True)):
            message = (KafkaCoordinates(topic, partition, offset, ts_ms), row, key, value)
            if value is None:
                out.slow(decoder, message)
                continue
            try:
                record, plan = decoder.read_value(value)
            except DecodeError as exc:
                out.error(decoder, message, exc.reason)
                continue
            except RegistryUnavailableError:
                raise
            except Exception:  # the per-message decoder names the problem
                out.slow(decoder, message)
                continue
            fast = _fast_change(decoder, record, plan, key, message[0])
            if fast is None:
                out.slow(decoder, message, record=record, plan=plan)
                continue
            group = groups.get((id(plan), fast.names))
            if group is None:
                group = groups[(id(plan), fast.names)] = _Group(plan, fast.names)
            group.add(message, fast)
        for group in groups.values():
            group.finish(decoder, out)
        return out.parts()


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """How to build a table's :class:`~ingest.decode.MessageDecoder` in a worker (picklable).

    Where the registry's credentials are found travels, never the credentials, so no secret is in
    the pickled plan. ``schemas`` are the topic's schemas the driver already fetched (see
    :class:`~ingest.decode.registry.PrefetchedSchemaRegistry`); only an id outside them makes the worker
    call the registry, with credentials looked up in the worker.
    """

    value_format: str
    registry_dir: str | None = None
    registry_url: str | None = None
    key_columns: tuple[str, ...] | None = None
    registry_credentials_env: str | None = None
    registry_tls: TlsSpec | None = None
    secrets_file: str | None = None
    keep_before: bool = True
    schemas: tuple[tuple[int, str], ...] = ()  # (id, schema JSON) the driver fetched for this topic

    @classmethod
    def for_table(cls, config: IngestConfig, spec: TableSpec, *, keep_before: bool = False) -> DecoderSpec:
        """The decoder of one configured table (source format, registry, key override)."""
        return replace(cls.for_source(config), key_columns=spec.primary_key, keep_before=keep_before)

    @classmethod
    def for_source(cls, config: IngestConfig) -> DecoderSpec:
        """The decoder of the source's other topics (a transaction topic): no key, no table."""
        source = config.source
        return cls(
            value_format=source.value_format,
            registry_dir=str(config.registry_dir) if source.registry.kind == "embedded" else None,
            registry_url=source.registry.url if source.registry.kind == "confluent" else None,
            registry_credentials_env=source.registry.credentials_env,
            registry_tls=source.registry.tls,
            secrets_file=str(config.secrets_path) if config.secrets_path else None,
        )

    def __call__(self) -> MessageDecoder:

        registry: Any = None
        if self.registry_url:
            url, env, file, tls = self.registry_url, self.registry_credentials_env, self.secrets_file, self.registry_tls
            registry = PrefetchedSchemaRegistry(self.schemas, lambda: ConfluentSchemaRegistry.from_settings(
                url, credentials_env=env, secrets_file=file, tls=tls))
        elif self.registry_dir:
            registry = EmbeddedSchemaRegistry(self.registry_dir)
        return MessageDecoder(value_format=self.value_format,  # type: ignore[arg-type]
                              registry=registry, key_columns=self.key_columns, keep_before=self.keep_before)
