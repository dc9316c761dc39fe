"""Confluent-framed Avro: envelopes, keys, flattened rows, control records, errors, pickling."""

from __future__ import annotations

import pickle
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ingest.decode import MessageDecoder
from ingest.decode.registry import EmbeddedSchemaRegistry, frame
from ingest.errors import ConfigError, DecodeError
from ingest.model import UNAVAILABLE, ChangeEvent, ColumnSpec, ControlRecord, SourcePosition

from .fixtures import (
    AVRO_ORDER_FIELDS,
    COORDS,
    MARKER,
    avro_encode,
    avro_envelope_schema,
    avro_key_schema,
    avro_order_row,
    dec_bytes,
    envelope,
    optional,
    pg_source,
)

PLACED_AT = datetime(2023, 11, 14, 22, 13, 20, 123456)
ENVELOPE = avro_envelope_schema(AVRO_ORDER_FIELDS)
KEY = avro_key_schema([{"name": "id", "type": "long"}])


@pytest.fixture
def registry(tmp_path: Path) -> EmbeddedSchemaRegistry:
    return EmbeddedSchemaRegistry(tmp_path / "registry")


@pytest.fixture
def decoder(registry: EmbeddedSchemaRegistry) -> MessageDecoder:
    return MessageDecoder(value_format="avro", registry=registry)


def value(
    registry: EmbeddedSchemaRegistry, record: dict[str, Any], schema: dict[str, Any] = ENVELOPE
) -> bytes:
    return avro_encode(registry, "shop.public.orders-value", schema, record)


def key(registry: EmbeddedSchemaRegistry, order_id: int) -> bytes:
    return avro_encode(registry, "shop.public.orders-key", KEY, {"id": order_id})


def change(decoder: MessageDecoder, key_bytes: bytes | None, value_bytes: bytes) -> ChangeEvent:
    event = decoder.decode(key_bytes, value_bytes, COORDS)
    assert isinstance(event, ChangeEvent)
    return event


def test_create(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    record = envelope("c", after=avro_order_row(7), source=pg_source(lsn=5000, committed=4000))
    event = change(decoder, key(registry, 7), value(registry, record))
    assert event.op == "c"
    assert event.key == {"id": 7}
    assert event.key_columns == ("id",)
    assert event.after == {
        "id": 7,
        "customer": "Ada",
        "amount": Decimal("19.99"),
        "placed_at": PLACED_AT,
        "notes": "leave at door",
    }
    assert event.before is None
    assert event.position == SourcePosition(4000, 5000, 0, 1)
    assert event.schema_ref == f"avro:{registry.register('shop.public.orders-value', ENVELOPE)}"
    assert event.schema_ref == "avro:2"  # the key's schema was registered first
    assert event.snapshot == "false"
    assert event.source_ts_ms == 1_700_000_000_123
    assert event.columns == (
        ColumnSpec("id", "long", False, None),
        ColumnSpec("customer", "string", True, None),
        ColumnSpec("amount", "decimal(10,2)", True, "org.apache.kafka.connect.data.Decimal"),
        ColumnSpec("placed_at", "timestamp_ntz", True, "io.debezium.time.MicroTimestamp"),
        ColumnSpec("notes", "string", True, None),
    )


def test_update_with_toast(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    record = envelope(
        "u",
        before=avro_order_row(7, notes="x"),
        after=avro_order_row(7, notes=MARKER),
        source=pg_source(lsn=5100, committed=5050),
    )
    event = change(decoder, key(registry, 7), value(registry, record))
    assert event.after is not None and event.after["notes"] is UNAVAILABLE
    assert event.before is not None and event.before["notes"] == "x"
    assert event.unavailable == frozenset({"notes"})


def test_delete_and_truncate(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    before = {"id": 7, "customer": None, "amount": None, "placed_at": None, "notes": None}
    deleted = change(
        decoder,
        key(registry, 7),
        value(registry, envelope("d", before=before, source=pg_source(lsn=5200, committed=5150))),
    )
    assert (deleted.op, deleted.key, deleted.after, deleted.before) == ("d", {"id": 7}, None, before)
    truncated = change(
        decoder, None, value(registry, envelope("t", source=pg_source(lsn=5300, committed=5250)))
    )
    assert (truncated.op, truncated.key, truncated.key_columns) == ("t", {}, ())
    assert truncated.position == SourcePosition(5250, 5300, 0, 1)
    assert [c.name for c in truncated.columns] == ["id", "customer", "amount", "placed_at", "notes"]


def test_snapshot_read(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    record = envelope(
        "r", after=avro_order_row(8), source=pg_source(lsn=4000, committed=None, snapshot="last")
    )
    event = change(decoder, key(registry, 8), value(registry, record))
    assert (event.op, event.snapshot, event.position) == ("r", "last", SourcePosition(4000, 4000, 0, 0))


def test_composite_avro_key(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    key_schema = avro_key_schema(
        [{"name": "tenant", "type": "string"}, {"name": "id", "type": "long"}], namespace="shop.public.lines"
    )
    key_bytes = avro_encode(registry, "shop.public.lines-key", key_schema, {"tenant": "eu", "id": 7})
    record = envelope("c", after=avro_order_row(7), source=pg_source(lsn=1, committed=1))
    event = change(decoder, key_bytes, value(registry, record))
    assert event.key == {"tenant": "eu", "id": 7}
    assert event.key_columns == ("tenant", "id")


def test_key_columns_override_does_not_read_kafka_key(registry: EmbeddedSchemaRegistry) -> None:
    decoder = MessageDecoder(value_format="avro", registry=registry, key_columns=("customer",))
    record = envelope("c", after=avro_order_row(7, customer="Bea"), source=pg_source(lsn=1, committed=1))
    event = change(decoder, b"\x07garbage", value(registry, record))
    assert (event.key, event.key_columns) == ({"customer": "Bea"}, ("customer",))


def test_logical_decimal_without_connect_name(
    decoder: MessageDecoder, registry: EmbeddedSchemaRegistry
) -> None:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 3}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ]
    record = envelope(
        "c", after={"id": 1, "price": dec_bytes(-1500), "at": 1}, source=pg_source(lsn=1, committed=1)
    )
    event = change(decoder, key(registry, 1), value(registry, record, avro_envelope_schema(fields)))
    assert event.after is not None
    assert str(event.after["price"]) == "-1.500"
    assert event.columns[1] == ColumnSpec(
        "price", "decimal(6,3)", False, "org.apache.kafka.connect.data.Decimal"
    )
    assert event.columns[2].type == "timestamp"
    assert event.after["at"].isoformat() == "1970-01-01T00:00:00.000001+00:00"


def test_flattened_avro_row(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    schema = {
        "type": "record",
        "name": "Value",
        "namespace": "shop.public.orders",
        "fields": [
            *AVRO_ORDER_FIELDS[:2],
            {"name": "__op", "type": optional("string"), "default": None},
            {"name": "__lsn", "type": optional("long"), "default": None},
            {"name": "__deleted", "type": optional("string"), "default": None},
        ],
    }
    row = {"id": 4, "customer": "Eve", "__op": "d", "__lsn": 321, "__deleted": "true"}
    event = change(decoder, key(registry, 4), avro_encode(registry, "flat-value", schema, row))
    assert (event.op, event.before, event.after) == ("d", {"id": 4, "customer": "Eve"}, None)
    assert event.position == SourcePosition(321, 321, 0, 1)
    assert event.flattened
    assert [c.name for c in event.columns] == ["id", "customer"]


@pytest.mark.parametrize(
    ("schema", "record", "expected"),
    [
        (
            {
                "type": "record",
                "name": "Heartbeat",
                "namespace": "io.debezium.connector.common",
                "fields": [{"name": "ts_ms", "type": "long"}],
                "connect.name": "io.debezium.connector.common.Heartbeat",
            },
            {"ts_ms": 42},
            ControlRecord("heartbeat", "ts_ms=42"),
        ),
        (
            {
                "type": "record",
                "name": "TransactionMetadataValue",
                "namespace": "io.debezium.connector.common",
                "fields": [
                    {"name": "status", "type": "string"},
                    {"name": "id", "type": "string"},
                    {"name": "event_count", "type": optional("long"), "default": None},
                    {
                        "name": "data_collections",
                        "type": optional(
                            {
                                "type": "array",
                                "items": {
                                    "type": "record",
                                    "name": "ConnectDefault",
                                    "fields": [
                                        {"name": "data_collection", "type": "string"},
                                        {"name": "event_count", "type": "long"},
                                    ],
                                },
                            }
                        ),
                        "default": None,
                    },
                    {"name": "ts_ms", "type": "long"},
                ],
            },
            {
                "status": "END",
                "id": "77:9",
                "event_count": 1,
                "data_collections": [{"data_collection": "public.orders", "event_count": 1}],
                "ts_ms": 5,
            },
            ControlRecord("transaction", "END 77:9"),
        ),
        (
            {
                "type": "record",
                "name": "SchemaChangeValue",
                "namespace": "io.debezium.connector.mysql",
                "fields": [
                    {"name": "databaseName", "type": "string"},
                    {"name": "ddl", "type": optional("string")},
                    {"name": "tableChanges", "type": {"type": "array", "items": "string"}},
                ],
            },
            {"databaseName": "shop", "ddl": "DROP TABLE tmp", "tableChanges": []},
            ControlRecord("schema_change", "DROP TABLE tmp"),
        ),
    ],
)
def test_control_records(
    decoder: MessageDecoder,
    registry: EmbeddedSchemaRegistry,
    schema: dict[str, Any],
    record: dict[str, Any],
    expected: ControlRecord,
) -> None:
    assert decoder.decode(None, avro_encode(registry, "control-value", schema, record), COORDS) == expected


def test_tombstone(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    # The key travels with the tombstone: in a flattened stream it is the delete of that key.
    assert decoder.decode(key(registry, 7), None, COORDS) == ControlRecord("tombstone", key={"id": 7},
                                                                            key_columns=("id",))
    unreadable = decoder.decode(b"\x00\x00\x00\x03\xe7", None, COORDS)
    assert unreadable.kind == "tombstone" and unreadable.key is None
    assert unreadable.key_error is not None and unreadable.key_error.startswith("key:")


def test_errors(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    good = value(registry, envelope("c", after=avro_order_row(7), source=pg_source(lsn=1, committed=1)))
    k = key(registry, 7)
    cases = [
        (k, b"\x01" + good[1:], r"^confluent framing: magic byte is 0x01, expected 0x00$"),
        (k, b"\x00\x00", r"^confluent framing: message of 2 bytes is shorter than the 5-byte header$"),
        (k, b'{"before": null, "after": {"id": 7}}',
         r"^confluent framing: magic byte is 0x7b, expected 0x00; it starts like JSON: is source.value_format json\?$"),
        (k, frame(9999, good[5:]), r"^avro: unknown schema id 9999$"),
        (k, good[:-9], r"^avro: truncated or corrupt payload for schema id 1: EOFError: "),
        (k, good + b"\x00\x00", r"^avro: 2 bytes left after the record for schema id 1 \(wrong schema\?\)$"),
        (b"\x05" + k[1:], good, r"^key: confluent framing: magic byte is 0x05, expected 0x00$"),
        (k[:-1], good, r"^key: avro: truncated or corrupt payload for schema id 2: "),
        (frame(4242, k[5:]), good, r"^key: avro: unknown schema id 4242$"),
        (None, good, r"^key: the message has no Kafka key, and its table has no primary_key configured$"),
    ]
    for key_bytes, value_bytes, reason in cases:
        with pytest.raises(DecodeError, match=reason):
            decoder.decode(key_bytes, value_bytes, COORDS)


def test_null_key_value_is_refused(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    key_schema = avro_key_schema([{"name": "id", "type": optional("long"), "default": None}], namespace="k2")
    key_bytes = avro_encode(registry, "k2-key", key_schema, {"id": None})
    good = value(registry, envelope("c", after=avro_order_row(7), source=pg_source(lsn=1, committed=1)))
    with pytest.raises(DecodeError, match=r"^key: null primary key column 'id'$"):
        decoder.decode(key_bytes, good, COORDS)


def test_decoder_pickles_without_caches(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    record = envelope("c", after=avro_order_row(7), source=pg_source(lsn=5000, committed=4000))
    message, key_bytes = value(registry, record), key(registry, 7)
    before = decoder.decode(key_bytes, message, COORDS)  # warms the caches
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone.decode(key_bytes, message, COORDS) == before
    assert len(pickle.dumps(decoder)) < 1000  # no parsed schemas travel with it


def test_config_errors(registry: EmbeddedSchemaRegistry) -> None:
    with pytest.raises(ConfigError, match="needs a schema registry"):
        MessageDecoder(value_format="avro", registry=None)
    with pytest.raises(ConfigError, match="value_format must be 'avro' or 'json'"):
        MessageDecoder(value_format="protobuf", registry=registry)  # type: ignore[arg-type]


def test_unchanged_toast_bytes_column(decoder: MessageDecoder, registry: EmbeddedSchemaRegistry) -> None:
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "blob", "type": optional("bytes"), "default": None},
        {"name": "tags", "type": optional({"type": "array", "items": "string"}), "default": None},
    ]
    record = envelope(
        "u", after={"id": 1, "blob": MARKER.encode(), "tags": [MARKER]}, source=pg_source(lsn=3, committed=2)
    )
    event = change(decoder, key(registry, 1), value(registry, record, avro_envelope_schema(fields)))
    assert event.after == {"id": 1, "blob": UNAVAILABLE, "tags": UNAVAILABLE}
    assert event.unavailable == frozenset({"blob", "tags"})


def test_a_columns_source_default_is_read_from_its_schema_as_text(
    decoder: MessageDecoder, registry: EmbeddedSchemaRegistry
) -> None:
    """The Connect converters keep a column's default twice: as the field's Avro default (a union
    then lists the type before null) and as ``connect.default`` on the type; either is read."""
    fields: list[dict[str, Any]] = [
        {"name": "id", "type": "long"},
        {"name": "region", "type": [{"type": "string", "connect.default": "eu"}, "null"], "default": "eu"},
        {"name": "tier", "type": {"type": "int", "connect.default": 3}, "default": 3},
        {"name": "price", "type": [{"type": "bytes", "scale": 2, "precision": 10, "logicalType": "decimal",
                                    "connect.default": "\u0000\u0096", "connect.parameters": {"scale": "2"},
                                    "connect.name": "org.apache.kafka.connect.data.Decimal"}, "null"],
         "default": "\u0000\u0096"},
        {"name": "on_type_only", "type": ["null", {"type": "boolean", "connect.default": True}], "default": None},
        {"name": "plain", "type": optional("string"), "default": None},
    ]
    row = {"id": 1, "region": "us", "tier": 1, "price": None, "on_type_only": None, "plain": None}
    record = envelope("c", after=row, source=pg_source(lsn=1, committed=1))
    event = change(decoder, key(registry, 1), value(registry, record, avro_envelope_schema(fields)))
    assert {c.name: c.default for c in event.columns} == {
        "id": None, "region": "'eu'", "tier": "3", "price": "1.50", "on_type_only": "true", "plain": None}
    assert event.after is not None and (event.after["region"], event.after["tier"]) == ("us", 1)
