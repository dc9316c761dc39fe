"""Builders of Debezium messages in the shapes Debezium and Kafka Connect produce.

The values are our own (a small ``shop`` database); the shapes follow what the PostgreSQL and MySQL
connectors send through JsonConverter and Confluent's AvroConverter.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import fastavro

from ingest.decode import MessageDecoder
from ingest.decode.registry import EmbeddedSchemaRegistry, frame
from ingest.model import ChangeEvent, KafkaCoordinates

COORDS = KafkaCoordinates(topic="shop.public.orders", partition=2, offset=41, timestamp_ms=1_700_000_000_000)
MARKER = "__debezium_unavailable_value"


# --- Kafka Connect JSON schemas (JsonConverter, schemas.enable=true) ----------------------------


def cfield(
    field: str,
    type_: str,
    *,
    optional: bool = True,
    name: str | None = None,
    parameters: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One field of a Connect struct schema, as JsonConverter writes it."""
    out: dict[str, Any] = {"type": type_, "optional": optional}
    if name is not None:
        out["name"] = name
        out["version"] = 1
    if parameters is not None:
        out["parameters"] = parameters
    out.update(extra)
    out["field"] = field
    return out


def cstruct(
    fields: list[dict[str, Any]], *, name: str, optional: bool = False, field: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if field is not None:
        out["field"] = field
    return out


ORDER_FIELDS = [
    cfield("id", "int64", optional=False),
    cfield("customer", "string"),
    cfield(
        "amount",
        "bytes",
        name="org.apache.kafka.connect.data.Decimal",
        parameters={"scale": "2", "connect.decimal.precision": "10"},
    ),
    cfield("placed_at", "int64", name="io.debezium.time.MicroTimestamp"),
    cfield("notes", "string"),
]

PG_SOURCE_FIELDS = [
    cfield("version", "string", optional=False),
    cfield("connector", "string", optional=False),
    cfield("name", "string", optional=False),
    cfield("ts_ms", "int64", optional=False),
    cfield(
        "snapshot",
        "string",
        name="io.debezium.data.Enum",
        parameters={"allowed": "true,first,first_in_data_collection,last,false,incremental"},
    ),
    cfield("db", "string", optional=False),
    cfield("sequence", "string"),
    cfield("schema", "string", optional=False),
    cfield("table", "string", optional=False),
    cfield("txId", "int64"),
    cfield("lsn", "int64"),
    cfield("xmin", "int64"),
]

MYSQL_SOURCE_FIELDS = [
    cfield("version", "string", optional=False),
    cfield("connector", "string", optional=False),
    cfield("name", "string", optional=False),
    cfield("ts_ms", "int64", optional=False),
    cfield("snapshot", "string", name="io.debezium.data.Enum"),
    cfield("db", "string", optional=False),
    cfield("table", "string"),
    cfield("server_id", "int64", optional=False),
    cfield("gtid", "string"),
    cfield("file", "string", optional=False),
    cfield("pos", "int64", optional=False),
    cfield("row", "int32", optional=False),
    cfield("thread", "int64"),
    cfield("query", "string"),
]


def envelope_schema(
    value_fields: list[dict[str, Any]],
    *,
    topic: str = "shop.public.orders",
    source_fields: list[dict[str, Any]] | None = None,
    connector: str = "postgresql",
) -> dict[str, Any]:
    """A Debezium envelope schema around ``value_fields``."""
    value = f"{topic}.Value"
    return cstruct(
        [
            cstruct(value_fields, name=value, optional=True, field="before"),
            cstruct(value_fields, name=value, optional=True, field="after"),
            cstruct(
                source_fields or PG_SOURCE_FIELDS,
                name=f"io.debezium.connector.{connector}.Source",
                field="source",
            ),
            cfield(
                "transaction",
                "struct",
                fields=[
                    cfield("id", "string", optional=False),
                    cfield("total_order", "int64", optional=False),
                    cfield("data_collection_order", "int64", optional=False),
                ],
                name="event.block",
            ),
            cfield("op", "string", optional=False),
            cfield("ts_ms", "int64"),
        ],
        name=f"{topic}.Envelope",
    )


def key_schema(fields: list[dict[str, Any]], *, topic: str = "shop.public.orders") -> dict[str, Any]:
    return cstruct(fields, name=f"{topic}.Key")


# --- payloads ------------------------------------------------------------------------------------


def pg_source(
    *,
    lsn: int | None,
    committed: int | None,
    ts_ms: int = 1_700_000_000_123,
    snapshot: Any = "false",
    table: str = "orders",
    tx_id: int | None = 880,
) -> dict[str, Any]:
    """A PostgreSQL ``source`` block; ``sequence`` is the JSON text ``["<committed>","<lsn>"]``."""
    pair = [None if committed is None else str(committed), None if lsn is None else str(lsn)]
    sequence = json.dumps(pair, separators=(",", ":"))  # Debezium writes it without spaces
    return {
        "version": "2.7.3.Final",
        "connector": "postgresql",
        "name": "shop",
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": "shop",
        "sequence": sequence,
        "schema": "public",
        "table": table,
        "txId": tx_id,
        "lsn": lsn,
        "xmin": None,
    }


def mysql_source(
    *,
    file: str = "binlog.000012",
    pos: int = 4711,
    row: int = 0,
    ts_ms: int = 1_700_000_100_000,
    snapshot: Any = "false",
    table: str = "orders",
) -> dict[str, Any]:
    return {
        "version": "2.7.3.Final",
        "connector": "mysql",
        "name": "shop",
        "ts_ms": ts_ms,
        "snapshot": snapshot,
        "db": "shop",
        "table": table,
        "server_id": 5501,
        "gtid": None,
        "file": file,
        "pos": pos,
        "row": row,
        "thread": 19,
        "query": None,
    }


def envelope(
    op: str | None,
    *,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    ts_ms: int = 1_700_000_000_999,
) -> dict[str, Any]:
    out: dict[str, Any] = {"before": before, "after": after, "source": source, "transaction": None}
    if op is not None:
        out["op"] = op
    out["ts_ms"] = ts_ms
    return out


def dec_b64(unscaled: int, length: int | None = None) -> str:
    """JsonConverter's text for a Decimal: base64 of the big-endian two's-complement unscaled value."""
    return base64.b64encode(dec_bytes(unscaled, length)).decode()


def dec_bytes(unscaled: int, length: int | None = None) -> bytes:
    size = length or max(1, (unscaled.bit_length() + 8) // 8)
    return unscaled.to_bytes(size, "big", signed=True)


def order_row(
    order_id: int,
    *,
    customer: str = "Ada",
    amount_cents: int = 1999,
    placed_at_us: int = 1_700_000_000_123_456,
    notes: str | None = "leave at door",
) -> dict[str, Any]:
    """An ``orders`` row as JsonConverter sends it."""
    return {
        "id": order_id,
        "customer": customer,
        "amount": dec_b64(amount_cents),
        "placed_at": placed_at_us,
        "notes": notes,
    }


def json_message(
    payload: Any, schema: dict[str, Any] | None = None, *, wrap: bool | None = None, pretty: bool = False
) -> bytes:
    """Serialise like JsonConverter: compact ``{"schema":...,"payload":...}`` or a bare payload."""
    body = (
        {"schema": schema, "payload": payload} if (schema is not None if wrap is None else wrap) else payload
    )
    text = json.dumps(body, indent=2) if pretty else json.dumps(body, separators=(",", ":"))
    return text.encode()


# --- Avro (Confluent AvroConverter shapes) -------------------------------------------------------


def avro_decimal(precision: int, scale: int) -> dict[str, Any]:
    return {
        "type": "bytes",
        "scale": scale,
        "precision": precision,
        "connect.version": 1,
        "connect.parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "logicalType": "decimal",
    }


def avro_semantic(base: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"type": base, "connect.version": 1, "connect.name": name, **extra}


def optional(avro_type: Any) -> list[Any]:
    return ["null", avro_type]


AVRO_PG_SOURCE: dict[str, Any] = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.postgresql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {
            "name": "snapshot",
            "type": [
                avro_semantic(
                    "string",
                    "io.debezium.data.Enum",
                    **{"connect.parameters": {"allowed": "true,last,false"}},
                ),
                "null",
            ],
            "default": "false",
        },
        {"name": "db", "type": "string"},
        {"name": "sequence", "type": optional("string"), "default": None},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "txId", "type": optional("long"), "default": None},
        {"name": "lsn", "type": optional("long"), "default": None},
        {"name": "xmin", "type": optional("long"), "default": None},
    ],
    "connect.name": "io.debezium.connector.postgresql.Source",
}

AVRO_ORDER_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": optional("string"), "default": None},
    {"name": "amount", "type": optional(avro_decimal(10, 2)), "default": None},
    {
        "name": "placed_at",
        "type": optional(avro_semantic("long", "io.debezium.time.MicroTimestamp")),
        "default": None,
    },
    {"name": "notes", "type": optional("string"), "default": None},
]


def avro_envelope_schema(
    value_fields: list[dict[str, Any]],
    *,
    namespace: str = "shop.public.orders",
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An Envelope record the way AvroConverter renders Debezium's Connect schema."""
    value = {"type": "record", "name": "Value", "fields": value_fields, "connect.name": f"{namespace}.Value"}
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": namespace,
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": source or AVRO_PG_SOURCE},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": optional("long"), "default": None},
            {
                "name": "transaction",
                "type": [
                    "null",
                    {
                        "type": "record",
                        "name": "block",
                        "namespace": "event",
                        "fields": [
                            {"name": "id", "type": "string"},
                            {"name": "total_order", "type": "long"},
                            {"name": "data_collection_order", "type": "long"},
                        ],
                        "connect.version": 1,
                        "connect.name": "event.block",
                    },
                ],
                "default": None,
            },
        ],
        "connect.version": 1,
        "connect.name": f"{namespace}.Envelope",
    }


def avro_key_schema(fields: list[dict[str, Any]], *, namespace: str = "shop.public.orders") -> dict[str, Any]:
    return {
        "type": "record",
        "name": "Key",
        "namespace": namespace,
        "fields": fields,
        "connect.name": f"{namespace}.Key",
    }


def avro_encode(registry: EmbeddedSchemaRegistry, subject: str, schema: dict[str, Any], record: Any) -> bytes:
    """Register ``schema`` and return ``record`` in the Confluent wire format."""
    schema_id = registry.register(subject, schema)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return frame(schema_id, buffer.getvalue())


def avro_order_row(
    order_id: int,
    *,
    customer: str | None = "Ada",
    amount: bytes | None = None,
    placed_at_us: int | None = 1_700_000_000_123_456,
    notes: str | None = "leave at door",
) -> dict[str, Any]:
    """An ``orders`` row as AvroConverter writes it (decimals as unscaled bytes)."""
    return {
        "id": order_id,
        "customer": customer,
        "amount": dec_bytes(1999) if amount is None else amount,
        "placed_at": placed_at_us,
        "notes": notes,
    }


# --- JsonConverter shortcuts for the orders table ------------------------------------------------

ORDERS_SCHEMA = envelope_schema(ORDER_FIELDS)
ORDERS_KEY_SCHEMA = key_schema([cfield("id", "int64", optional=False)])


def json_key(order_id: int, *, with_schema: bool = True) -> bytes:
    return json_message({"id": order_id}, ORDERS_KEY_SCHEMA if with_schema else None)


def json_decoder(key_columns: tuple[str, ...] | None = None) -> MessageDecoder:
    return MessageDecoder(value_format="json", registry=None, key_columns=key_columns)


def json_change(value: bytes, key_bytes: bytes | None = None, **kwargs: Any) -> ChangeEvent:
    """Decode with a fresh JSON decoder and insist on a change event."""
    event = json_decoder(**kwargs).decode(key_bytes, value, COORDS)
    assert isinstance(event, ChangeEvent)
    return event
