"""Kafka rows in, typed columnar change rows out: the decode step that runs in Spark's executors.

:class:`BatchDecoder` is the function Spark runs in ``mapInArrow``. Its output is made of *parts*:
Arrow record batches of change rows, one per value schema (every schema version of a table), plus
one of tombstones per key shape and one of the messages that carry no change (errors, heartbeats,
schema changes, transaction markers). A part's user columns have their schema's Delta types
(:class:`~ingest.events.ColumnSpec`, kept in the part's schema metadata); its framework columns are
:data:`FRAME`.

Spark cannot know those types before it has seen the batch (a schema may change in any message), so
each part travels as an Arrow IPC stream in one binary cell. The driver unifies the parts into the
table's schema (:mod:`ingest.apply.microbatch`): it handles schemas, counts and commit metadata,
never a batch's rows as Python objects. Raw bytes travel only with messages that did not decode
(quarantine keeps them); the raw bytes of a change the quality gate holds are fetched again from
the source by its coordinates.

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

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ingest.decode import MessageDecoder
from ingest.decode.envelope import optional_int, source_position
from ingest.decode.semantic import ConvertError
from ingest.errors import DecodeError, RegistryUnavailableError
from ingest.events import SNAPSHOT, STREAMED, UNAVAILABLE, ChangeEvent, ColumnSpec, ControlRecord, KafkaCoordinates

if TYPE_CHECKING:
    from ingest.config import IngestConfig, TableSpec

#: Output of the decode step: one Arrow IPC stream (a part) per row.
PARTS_DDL: Final = "part binary"
PARTS_SCHEMA: Final = pa.schema([("part", pa.binary())])
COLUMNS_KEY: Final = b"cdc.columns"
KIND_KEY: Final = b"cdc.part"
#: A column type the driver decides (a tombstone's key values: cast to the table's key types).
INFERRED: Final = "inferred"

_TS: Final = pa.timestamp("us", tz="UTC")
#: Framework columns of every part, before the user columns.
FRAME: Final = pa.schema([
    ("_cdc_kind", pa.string()),  # change | tombstone | error | heartbeat | schema_change | transaction | message
    ("_cdc_op", pa.string()),
    ("_cdc_position", pa.string()),
    ("_cdc_topic", pa.string()),
    ("_cdc_partition", pa.int32()),
    ("_cdc_offset", pa.int64()),
    ("_cdc_timestamp", _TS),  # the Kafka timestamp
    ("_cdc_source_ts", _TS),
    ("_cdc_flattened", pa.bool_()),
    ("_cdc_toast", pa.list_(pa.string())),  # columns that held the unchanged-TOAST placeholder
    ("_cdc_key_columns", pa.string()),  # JSON list of the primary-key columns
    ("_cdc_schema", pa.string()),
    ("_cdc_reason", pa.string()),
    ("_cdc_raw_key", pa.binary()),
    ("_cdc_raw_value", pa.binary()),
])
_FRAME_NAMES: Final = tuple(FRAME.names)
#: Framework columns taken from the input batch by row number.
_FROM_INPUT: Final = {"_cdc_topic": "topic", "_cdc_partition": "partition", "_cdc_offset": "offset",
                      "_cdc_timestamp": "timestamp"}
_ROW_OPS: Final = frozenset({"c", "u", "r", "d"})
Message = tuple[KafkaCoordinates, int, Any, Any]  # coordinates, row in the input batch, key, value


def _arrow_type(type_name: str) -> pa.DataType:
    from ingest.deltaio import arrow_type

    return arrow_type(type_name)


def user_field(index: int) -> str:
    """The name a part gives its ``index``-th user column (see :func:`columns_of` for the real one)."""
    return f"_u{index}"


def columns_of(schema: pa.Schema) -> tuple[ColumnSpec, ...]:
    """The user columns a part declares (Delta types), from its schema metadata."""
    raw = json.loads((schema.metadata or {}).get(COLUMNS_KEY, b"[]"))
    return tuple(ColumnSpec(name, typ, nullable, semantic) for name, typ, nullable, semantic in raw)


def part_kind(schema: pa.Schema) -> str:
    """``changes``, ``tombstones`` or ``meta``."""
    return (schema.metadata or {}).get(KIND_KEY, b"changes").decode()


def read_parts(blobs: Sequence[bytes]) -> list[pa.RecordBatch]:
    """The parts of a decoded batch, from their IPC streams (the inverse of :meth:`BatchDecoder.parts`)."""
    out = []
    for blob in blobs:
        with pa.ipc.open_stream(pa.py_buffer(blob)) as reader:
            out.extend(reader)
    return out


def _metadata(kind: str, columns: tuple[ColumnSpec, ...]) -> dict[bytes, bytes]:
    return {KIND_KEY: kind.encode(),
            COLUMNS_KEY: json.dumps([[c.name, c.type, c.nullable, c.semantic] for c in columns]).encode()}


def _assemble(kind: str, columns: tuple[ColumnSpec, ...], rows: list[int], given: dict[str, pa.Array],
              user: list[pa.Array], source: pa.Table) -> pa.RecordBatch:
    """A part: framework columns (given, taken from the input by row, or null) and user columns."""
    n = len(rows)
    taken = source.take(pa.array(rows, pa.int64())) if n else source.slice(0, 0)
    arrays = []
    for name in _FRAME_NAMES:
        if name in given:
            arrays.append(given[name])
        elif name in _FROM_INPUT:
            arrays.append(taken.column(_FROM_INPUT[name]).combine_chunks().cast(FRAME.field(name).type))
        else:
            arrays.append(pa.nulls(n, FRAME.field(name).type))
    # User columns travel under positional names: a source column may be called anything, even
    # like a framework column (the driver refuses that, naming it); their names are in the metadata.
    fields = [*FRAME, *(pa.field(user_field(i), a.type) for i, a in enumerate(user))]
    return pa.RecordBatch.from_arrays(arrays + user, schema=pa.schema(fields, metadata=_metadata(kind, columns)))


def _typed(col: ColumnSpec, values: list[Any]) -> pa.Array:
    if col.type == INFERRED:
        return pa.array(values)
    return pa.array(values, _arrow_type(col.type))


@dataclass(slots=True)
class _Rows:
    """Rows decoded message by message, gathered for one part."""

    kind: str  # "changes" | "tombstones" | "meta"
    columns: tuple[ColumnSpec, ...]
    rows: list[int] = field(default_factory=list)
    frame: dict[str, list[Any]] = field(default_factory=dict)
    values: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.frame = {n: [] for n in _FRAME_NAMES if n not in _FROM_INPUT}
        self.values = {c.name: [] for c in self.columns}

    def add(self, kind: str, row: int, *, op: str | None = None, position: str | None = None,
            source_ts_ms: int | None = None, flattened: bool = False, toast: list[str] | None = None,
            key_columns: tuple[str, ...] = (), schema: str | None = None, reason: str | None = None,
            raw_key: bytes | None = None, raw_value: bytes | None = None,
            image: dict[str, Any] | None = None) -> None:
        f = self.frame
        self.rows.append(row)
        f["_cdc_kind"].append(kind)
        f["_cdc_op"].append(op)
        f["_cdc_position"].append(position)
        f["_cdc_source_ts"].append(None if source_ts_ms is None else source_ts_ms * 1000)
        f["_cdc_flattened"].append(flattened)
        f["_cdc_toast"].append(toast)
        f["_cdc_key_columns"].append(json.dumps(list(key_columns)) if key_columns else None)
        f["_cdc_schema"].append(schema)
        f["_cdc_reason"].append(reason)
        f["_cdc_raw_key"].append(raw_key)
        f["_cdc_raw_value"].append(raw_value)
        get = image.get if image is not None else (lambda _name: None)
        for name, column in self.values.items():
            column.append(get(name))

    def part(self, source: pa.Table) -> pa.RecordBatch:
        given = {}
        for name, values in self.frame.items():
            typ = FRAME.field(name).type
            given[name] = (pa.array(values, pa.int64()).cast(typ) if name == "_cdc_source_ts"
                           else pa.array(values, typ))
        user = [_typed(c, self.values[c.name]) for c in self.columns]
        return _assemble(self.kind, self.columns, self.rows, given, user, source)


class PartsBuilder:
    """The parts being gathered for one input batch (rows by their number in ``source``)."""

    def __init__(self, source: pa.Table) -> None:
        self.source = source
        self.changes: dict[int, tuple[tuple[ColumnSpec, ...], _Rows]] = {}
        self.tombstones: dict[tuple[str, ...], _Rows] = {}
        self.meta = _Rows("meta", ())
        self.converted: list[pa.RecordBatch] = []

    def parts(self) -> list[pa.RecordBatch]:
        out = list(self.converted)
        out += [rows.part(self.source) for _, rows in self.changes.values()]
        out += [rows.part(self.source) for rows in self.tombstones.values()]
        if self.meta.rows:
            out.append(self.meta.part(self.source))
        return out

    def error(self, message: Message, reason: str, *, raw_value: bool = True) -> None:
        _coords, row, key, value = message
        self.meta.add("error", row, reason=reason, raw_key=key, raw_value=value if raw_value else None)

    def slow(self, decoder: MessageDecoder, message: Message, *, record: Any = None, plan: Any = None) -> None:
        """One message through the per-message decoder (the reference for every rule)."""
        coords, row, key, value = message
        try:
            result = (decoder.event_of(record, plan, key, coords) if record is not None
                      else decoder.decode(key, value, coords))
        except DecodeError as exc:
            self.error(message, exc.reason)
            return
        except RegistryUnavailableError:
            raise  # not the message's fault: fail the batch (the table stops, a rerun retries)
        except Exception as exc:  # a decoder bug must not lose the message either
            self.error(message, f"decoder failure: {type(exc).__name__}: {exc}")
            return
        if isinstance(result, ControlRecord):
            self.control(result, row, key)
        else:
            self.change(result, row)

    def control(self, record: ControlRecord, row: int, key: Any) -> None:
        if record.kind != "tombstone":
            self.meta.add(record.kind, row)
        elif record.key is None:
            self.meta.add("tombstone", row, reason=record.key_error or "no key", raw_key=key)
        else:
            names = tuple(record.key_columns)
            rows = self.tombstones.get(names)
            if rows is None:
                rows = self.tombstones[names] = _Rows("tombstones", tuple(ColumnSpec(n, INFERRED) for n in names))
            rows.add("tombstone", row, key_columns=names, image=record.key)

    def change(self, event: ChangeEvent, row: int) -> None:
        columns = event.columns
        entry = self.changes.get(id(columns))
        if entry is None:
            # Key columns the image lacks (a key from the Kafka key only) still need a column.
            known = {c.name for c in columns}
            extra = tuple(ColumnSpec(k, INFERRED) for k in event.key_columns if k not in known)
            entry = self.changes[id(columns)] = (columns, _Rows("changes", columns + extra))
        image = event.after if event.after is not None else event.before
        if image is not None and event.key:
            image = {**image, **event.key}
        toast = None
        if event.unavailable:
            toast = sorted(event.unavailable)
            image = {k: (None if v is UNAVAILABLE else v) for k, v in (image or {}).items()}
        entry[1].add("change", row, op=event.op, position=event.position.encode(), source_ts_ms=event.source_ts_ms,
                     flattened=event.flattened, toast=toast, key_columns=event.key_columns,
                     schema=event.schema_ref, image=image)


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

    def add(self, message: Message, op: str, position: str, source_ts_ms: int | None, image: dict[str, Any]) -> None:
        self.messages.append(message)
        self.ops.append(op)
        self.positions.append(position)
        self.source_ts.append(source_ts_ms)
        self.images.append(image)

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
        for name, convert, markers, spec in fields:
            raw = [image.get(name) for image in self.images]
            if markers:
                for i, v in enumerate(raw):
                    if v is not None and v in markers:
                        raw[i] = None
                        toast[i] = [*(toast[i] or ()), name]
            if name in self.names and None in raw:
                raise _NeedsSlowPath  # a null key: the per-message decoder names it
            values = raw if convert is None else [None if v is None else convert(v) for v in raw]
            user.append(pa.array(values, _arrow_type(spec.type)))
        key_columns = json.dumps(list(self.names))
        given = {
            "_cdc_kind": pa.array(["change"] * n, pa.string()),
            "_cdc_op": pa.array(self.ops, pa.string()),
            "_cdc_position": pa.array(self.positions, pa.string()),
            "_cdc_source_ts": pa.array([None if t is None else t * 1000 for t in self.source_ts],
                                       pa.int64()).cast(_TS),
            "_cdc_flattened": pa.array([False] * n, pa.bool_()),
            "_cdc_toast": pa.array(toast, pa.list_(pa.string())),
            "_cdc_key_columns": pa.array([key_columns] * n, pa.string()),
            "_cdc_schema": pa.array([self.plan.schema_ref] * n, pa.string()),
        }
        return _assemble("changes", self.plan.columns, [m[1] for m in self.messages], given, user, source)


def _fast_change(decoder: MessageDecoder, record: Any, plan: Any, key: bytes | None, coords: KafkaCoordinates
                 ) -> tuple[tuple[str, ...], str, str, int | None, dict[str, Any]] | None:
    """``(key names, op, encoded position, source ts, raw image)`` of an ordinary envelope, else ``None``."""
    if plan is None or plan.kind != "envelope" or type(record) is not dict:
        return None
    op = record.get("op")
    if op not in _ROW_OPS:
        return None
    image = record.get("after") if op != "d" else record.get("before")
    source = record.get("source")
    if type(image) is not dict or type(source) is not dict:
        return None
    names = decoder.key_names(key)
    if not names:
        return None
    try:
        position = source_position(source, SNAPSHOT if op == "r" else STREAMED, coords, trust_connector=True)
    except DecodeError:
        return None
    ts_ms = optional_int(source.get("ts_ms"))
    if ts_ms is None:
        ts_ms = optional_int(record.get("ts_ms"))
    return names, op, position.encode(), ts_ms, image


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

    def parts(self, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
        """One input batch as a batch of IPC parts (one row per part)."""
        blobs = []
        for part in self.decode(batch):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_batch(part)
            blobs.append(sink.getvalue().to_pybytes())
        return pa.RecordBatch.from_arrays([pa.array(blobs, pa.binary())], schema=PARTS_SCHEMA)

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
            return self._decode_topic(self.decoder(names[0]), batch)
        except RegistryUnavailableError as exc:
            source = pa.table({name: batch.column(name) for name in ("topic", "partition", "offset", "timestamp")})
            out = PartsBuilder(source)
            for row in range(batch.num_rows):
                out.meta.add("unavailable", row, reason=exc.args[0] if exc.args else str(exc))
            return out.parts()

    def _decode_topic(self, decoder: MessageDecoder, batch: pa.RecordBatch | pa.Table) -> list[pa.RecordBatch]:
        source = pa.table({name: batch.column(name) for name in ("topic", "partition", "offset", "timestamp")})
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
                out.error(message, exc.reason)
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
            names, op, position, source_ts_ms, image = fast
            group = groups.get((id(plan), names))
            if group is None:
                group = groups[(id(plan), names)] = _Group(plan, names)
            group.add(message, op, position, source_ts_ms, image)
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
    secrets_file: str | None = None
    keep_before: bool = True
    schemas: tuple[tuple[int, str], ...] = ()  # (id, schema JSON) the driver fetched for this topic

    @classmethod
    def for_table(cls, config: IngestConfig, spec: TableSpec, *, keep_before: bool = False) -> DecoderSpec:
        """The decoder of one configured table (source format, registry, key override)."""
        source = config.source
        return cls(
            value_format=source.value_format,
            registry_dir=str(config.registry_dir) if source.registry.kind == "embedded" else None,
            registry_url=source.registry.url if source.registry.kind == "confluent" else None,
            key_columns=spec.primary_key,
            registry_credentials_env=source.registry.credentials_env,
            secrets_file=str(config.secrets_path) if config.secrets_path else None,
            keep_before=keep_before,
        )

    def __call__(self) -> MessageDecoder:
        from ingest.decode.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry, PrefetchedSchemaRegistry

        registry: Any = None
        if self.registry_url:
            url, env, file = self.registry_url, self.registry_credentials_env, self.secrets_file
            registry = PrefetchedSchemaRegistry(self.schemas, lambda: ConfluentSchemaRegistry.from_settings(
                url, credentials_env=env, secrets_file=file))
        elif self.registry_dir:
            registry = EmbeddedSchemaRegistry(self.registry_dir)
        return MessageDecoder(value_format=self.value_format,  # type: ignore[arg-type]
                              registry=registry, key_columns=self.key_columns, keep_before=self.keep_before)
