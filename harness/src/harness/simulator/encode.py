"""Debezium envelopes as bytes: Confluent-framed Avro (AvroConverter) or JsonConverter JSON.

The shapes follow what Debezium's PostgreSQL connector (2.x/3.x) emits: an ``Envelope`` record
with ``before``/``after`` images of ``<server>.<schema>.<table>.Value``, the
``io.debezium.connector.postgresql.Source`` block, the optional ``event.block`` transaction,
``op`` and ``ts_ms``/``ts_us``/``ts_ns``; keys are ``<server>.<schema>.<table>.Key`` records.
Semantic types carry ``connect.name`` (Avro) or ``name`` (JSON) exactly as the converters write
them, so the decoder is exercised against the real thing rather than a friendly subset.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, Protocol

import fastavro

from harness.simulator import wire
from harness.simulator.model import Key, Row, TableDef
from harness.simulator.wire import ImageConverter, ValueFormat
from ingest.decode.registry import SchemaRegistry, frame

DEBEZIUM_VERSION: Final = "2.7.3.Final"
#: A schema id no registry hands out; used for the "unknown schema id" malformed messages.
UNKNOWN_SCHEMA_ID: Final = 0x7FFF_FFF0
MalformedKind = Literal[
    "wrong_magic", "unknown_schema_id", "truncated_avro", "invalid_json", "invalid_utf8",
    "unknown_op", "null_primary_key",
]
MALFORMED_KINDS: Final[dict[str, tuple[MalformedKind, ...]]] = {
    "avro": ("wrong_magic", "unknown_schema_id", "truncated_avro", "invalid_utf8", "unknown_op",
             "null_primary_key"),
    "json": ("invalid_json", "invalid_utf8", "unknown_op", "null_primary_key"),
}
_UTF8_MARKER: Final = "~~~~~~~~"


def topic_name(prefix: str, table: str) -> str:
    """Debezium's default topic for a PostgreSQL table: ``<topic.prefix>.<schema>.<table>``."""
    return f"{prefix}.public.{table}"


@dataclass(frozen=True, slots=True)
class Envelope:
    """One change event before serialization, with images in source (Python) values.

    Args:
        op: ``r``, ``c``, ``u``, ``d`` or ``t`` (anything else only in malformed messages).
        before: the old row image, or ``None``.
        after: the new row image, or ``None``; an unchanged TOASTed column holds
            :data:`UNAVAILABLE_VALUE`.
        source: the ``io.debezium.connector.postgresql.Source`` block.
        ts_us: when the connector processed the event (envelope ``ts_ms``/``ts_us``/``ts_ns``).
    """

    op: str
    before: Row | None
    after: Row | None
    source: dict[str, Any]
    ts_us: int

    @property
    def ts_ms(self) -> int:
        return self.ts_us // 1000


def _bogus(table: TableDef, row: Row, *, null_key: bool) -> Row:
    """A row image that must never reach a target table (so accepting it shows as a mismatch)."""
    bogus = dict(row)
    for col in table.columns:
        if col.kind == "string" and col.name not in table.key:
            bogus[col.name] = "MALFORMED"
            break
    if null_key:
        for name in table.key:
            bogus[name] = None
    return bogus


class ChangeEncoder(Protocol):
    """Serializes keys and envelopes of one value format."""

    def key(self, table: TableDef, key: Key) -> bytes:
        """The Kafka key of a row."""
        ...

    def value(self, table: TableDef, envelope: Envelope, *, nullable_key: bool = False) -> bytes:
        """The Kafka value of a change event (``nullable_key``: a schema variant whose key may be null)."""
        ...

    def null_key(self, table: TableDef) -> bytes:
        """A Kafka key whose primary-key columns are all null (only for malformed messages)."""
        ...


class AvroChangeEncoder:
    """Debezium through Confluent's ``AvroConverter``: schemas in the registry, framed payloads.

    Schemas are registered lazily, on the first event of each table version, under
    ``<topic>-key`` and ``<topic>-value`` (TopicNameStrategy), just as the converter does when it
    first meets a new Connect schema.

    Args:
        registry: where schemas are registered.
        prefix: the connector's ``topic.prefix`` (also the schema namespace root).
    """

    def __init__(self, registry: SchemaRegistry, prefix: str) -> None:
        self._registry = registry
        self._prefix = prefix
        self._values: dict[tuple[str, int, bool], _AvroValue] = {}
        self._keys: dict[tuple[str, bool], tuple[int, Any]] = {}
        self._key_bytes: dict[tuple[str, Key], bytes] = {}
        # Encoded row images by object identity: an update's before image is the row object the
        # previous event sent as after, so it is encoded once. The row is kept in the entry, so its
        # id cannot be reused while cached.
        self._images: dict[int, tuple[Row, tuple[str, int, bool], bytes]] = {}

    def _value_schema(self, table: TableDef, nullable_key: bool = False) -> _AvroValue:
        cache_key = (table.name, table.version, nullable_key)
        if cache_key not in self._values:
            schema = wire.avro_envelope_schema(self._prefix, table, nullable_key=nullable_key)
            ns = f"{self._prefix}.public.{table.name}"
            # The broken variant goes under its record name, so the topic's subject stays clean.
            subject = f"{ns}.Envelope" if nullable_key else f"{topic_name(self._prefix, table.name)}-value"
            schema_id = self._registry.register(subject, schema)
            value_schema = schema["fields"][0]["type"][1]
            # Everything after before/after, as one record: same bytes as those envelope fields.
            tail_schema = {"type": "record", "name": "EnvelopeTail", "namespace": ns,
                           "fields": schema["fields"][2:]}
            self._values[cache_key] = _AvroValue(
                schema_id, fastavro.parse_schema(schema), fastavro.parse_schema(value_schema),
                fastavro.parse_schema(tail_schema), ImageConverter(table, "avro"), cache_key,
            )
        return self._values[cache_key]

    def _key_schema(self, table: TableDef, nullable_key: bool = False) -> tuple[int, Any]:
        cache_key = (table.name, nullable_key)
        if cache_key not in self._keys:
            schema = wire.avro_key_schema(self._prefix, table, nullable_key=nullable_key)
            ns = f"{self._prefix}.public.{table.name}"
            subject = f"{ns}.Key" if nullable_key else f"{topic_name(self._prefix, table.name)}-key"
            self._keys[cache_key] = (self._registry.register(subject, schema), fastavro.parse_schema(schema))
        return self._keys[cache_key]

    def schema_ids(self, table: TableDef) -> tuple[int, int]:
        """``(key schema id, value schema id)`` of a table version, registering them if new."""
        return self._key_schema(table)[0], self._value_schema(table).schema_id

    def key(self, table: TableDef, key: Key) -> bytes:
        cached = self._key_bytes.get((table.name, key))
        if cached is None:
            schema_id, parsed = self._key_schema(table)
            cached = frame(schema_id, _avro(parsed, dict(zip(table.key, key, strict=True))))
            self._key_bytes[(table.name, key)] = cached
        return cached

    def value(self, table: TableDef, envelope: Envelope, *, nullable_key: bool = False) -> bytes:
        # Avro binary of a record is the concatenation of its fields, so the envelope is assembled
        # from separately encoded parts (images are cached); `envelope_schema` holds the same layout.
        v = self._value_schema(table, nullable_key)
        tail = {
            "source": envelope.source,
            "transaction": None,  # provide.transaction.metadata is off, as by default
            "op": envelope.op,
            "ts_ms": envelope.ts_us // 1000,
            "ts_us": envelope.ts_us,
            "ts_ns": envelope.ts_us * 1000,
        }
        return frame(v.schema_id, self._image(v, envelope.before) + self._image(v, envelope.after)
                     + _avro(v.tail_parsed, tail))

    def _image(self, v: _AvroValue, row: Row | None) -> bytes:
        if row is None:
            return b"\x00"  # union branch 0: null
        hit = self._images.get(id(row))
        if hit is not None and hit[0] is row and hit[1] == v.cache_key:
            return hit[2]
        raw = b"\x02" + _avro(v.value_parsed, v.convert.row(row))  # union branch 1: the Value record
        if len(self._images) >= _IMAGE_CACHE_SIZE:
            self._images.clear()
        self._images[id(row)] = (row, v.cache_key, raw)
        return raw

    def envelope_schema(self, table: TableDef) -> Any:
        """The parsed envelope schema of a table version (for checks against fastavro)."""
        return self._value_schema(table).envelope_parsed

    def null_key(self, table: TableDef) -> bytes:
        schema_id, parsed = self._key_schema(table, nullable_key=True)
        return frame(schema_id, _avro(parsed, dict.fromkeys(table.key)))


class JsonChangeEncoder:
    """Debezium through Kafka's ``JsonConverter`` with ``schemas.enable=true``.

    Every message carries its Connect schema next to the payload (``{"schema":…,"payload":…}``);
    decimals are base64 of the unscaled two's-complement bytes (``decimal.format=BASE64``).

    Args:
        prefix: the connector's ``topic.prefix``.
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._values: dict[tuple[str, int, bool], tuple[bytes, ImageConverter]] = {}
        self._keys: dict[tuple[str, bool], bytes] = {}
        self._key_bytes: dict[tuple[str, Key], bytes] = {}

    def _value_schema(self, table: TableDef, nullable_key: bool = False) -> tuple[bytes, ImageConverter]:
        cache_key = (table.name, table.version, nullable_key)
        if cache_key not in self._values:
            schema = wire.connect_envelope_schema(self._prefix, table, nullable_key=nullable_key)
            self._values[cache_key] = (_dumps(schema), ImageConverter(table, "json"))
        return self._values[cache_key]

    def _key_schema(self, table: TableDef, nullable_key: bool = False) -> bytes:
        cache_key = (table.name, nullable_key)
        if cache_key not in self._keys:
            schema = wire.connect_key_schema(self._prefix, table, nullable_key=nullable_key)
            self._keys[cache_key] = _dumps(schema)
        return self._keys[cache_key]

    def key(self, table: TableDef, key: Key) -> bytes:
        cached = self._key_bytes.get((table.name, key))
        if cached is None:
            payload = dict(zip(table.key, key, strict=True))
            cached = _with_schema(self._key_schema(table), payload)
            self._key_bytes[(table.name, key)] = cached
        return cached

    def value(self, table: TableDef, envelope: Envelope, *, nullable_key: bool = False) -> bytes:
        schema, convert = self._value_schema(table, nullable_key)
        datum = _envelope_datum(envelope, convert(envelope.before), convert(envelope.after))
        return _with_schema(schema, datum)

    def null_key(self, table: TableDef) -> bytes:
        return _with_schema(self._key_schema(table, nullable_key=True), dict.fromkeys(table.key))


def make_encoder(value_format: ValueFormat, registry: SchemaRegistry, prefix: str) -> ChangeEncoder:
    """The encoder for ``value_format`` (keys use the same converter as values, as in Debezium)."""
    if value_format == "avro":
        return AvroChangeEncoder(registry, prefix)
    if value_format == "json":
        return JsonChangeEncoder(prefix)
    raise ValueError(f"value_format must be 'avro' or 'json', not {value_format!r}")


def malformed_message(
    encoder: ChangeEncoder, kind: MalformedKind, table: TableDef, key: Key, row: Row, envelope: Envelope
) -> tuple[bytes | None, bytes]:
    """An undecodable or invalid ``(key, value)`` modelled on a real event of ``table``.

    The look-alikes that do decode (unknown op, null key) carry a row marked ``MALFORMED``, so a
    consumer that wrongly applies one shows up as a mismatch against the truth.
    """
    if kind == "null_primary_key":
        bad = replace(envelope, op="u", after=_bogus(table, row, null_key=True))
        return encoder.null_key(table), encoder.value(table, bad, nullable_key=True)
    good_key = encoder.key(table, key)
    if kind == "unknown_op":
        bad = replace(envelope, op="x", after=_bogus(table, row, null_key=False))
        return good_key, encoder.value(table, bad)
    if kind == "invalid_utf8":
        # A marker of the same length is swapped for bytes that are not UTF-8, so the framing
        # (Avro string lengths) stays valid and only the text decoding fails.
        raw = encoder.value(table, replace(envelope, source={**envelope.source, "db": _UTF8_MARKER}))
        return good_key, raw.replace(_UTF8_MARKER.encode(), b"\xff" * len(_UTF8_MARKER), 1)
    real = encoder.value(table, envelope)
    if kind == "wrong_magic":
        return good_key, b"\x01" + real[1:]
    if kind == "unknown_schema_id":
        return good_key, frame(UNKNOWN_SCHEMA_ID, real[5:])
    if kind == "truncated_avro":
        return good_key, real[: 5 + (len(real) - 5) // 2]
    if kind == "invalid_json":
        return good_key, real[: len(real) // 2]
    raise ValueError(f"unknown malformed kind {kind!r}")


def _envelope_datum(envelope: Envelope, before: Any, after: Any) -> dict[str, Any]:
    # Field order follows Debezium's envelope schema; JSON payloads keep it.
    return {
        "before": before,
        "after": after,
        "source": envelope.source,
        "transaction": None,
        "op": envelope.op,
        "ts_ms": envelope.ts_us // 1000,
        "ts_us": envelope.ts_us,
        "ts_ns": envelope.ts_us * 1000,
    }


@dataclass(frozen=True, slots=True)
class _AvroValue:
    schema_id: int
    envelope_parsed: Any
    value_parsed: Any
    tail_parsed: Any
    convert: ImageConverter
    cache_key: tuple[str, int, bool]


_IMAGE_CACHE_SIZE: Final = 100_000


def _avro(parsed: Any, datum: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, datum)
    return buf.getvalue()


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _with_schema(schema_json: bytes, payload: Any) -> bytes:
    # The schema part is the same for every message of a table version: splice, don't re-dump.
    return b'{"schema":' + schema_json + b',"payload":' + _dumps(payload) + b"}"
