"""Wire shapes: Debezium's Avro and JsonConverter schemas, value encodings, malformed messages."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest
from harness.simulator.encode import (
    MALFORMED_KINDS,
    AvroChangeEncoder,
    Envelope,
    JsonChangeEncoder,
    malformed_message,
)
from harness.simulator.model import UTC, default_tables
from harness.simulator.wire import UNAVAILABLE_VALUE, unscaled_bytes, variable_scale, zoned_timestamp

from ingest.decode.registry import EmbeddedSchemaRegistry, frame

TABLES = default_tables()
SOURCE: dict[str, Any] = {
    "version": "2.7.3.Final",
    "connector": "postgresql",
    "name": "demo",
    "ts_ms": 1717401600000,
    "snapshot": "false",
    "db": "shop",
    "sequence": '["100","120"]',
    "ts_us": 1717401600000123,
    "ts_ns": 1717401600000123000,
    "schema": "public",
    "table": "products",
    "txId": 7,
    "lsn": 120,
    "xmin": None,
}
PRODUCT: dict[str, Any] = {
    "id": 5,
    "sku": "SKU-000005",
    "name": "Eco Lamp",
    "category": "home",
    "price": Decimal("19.99"),
    "weight_kg": Decimal("1.250"),
    "in_stock": True,
    "created_at": dt.datetime(2024, 1, 2, 3, 4, 5, 6),
}
CUSTOMER: dict[str, Any] = {
    "id": 9,
    "email": "a@b.c",
    "full_name": "A B",
    "segment": "smb",
    "country_code": None,
    "birth_date": dt.date(1990, 5, 17),
    "balance": Decimal("-12.50"),
    "created_at": dt.datetime(2024, 1, 1),
    "updated_at": dt.datetime(2024, 6, 3, 8, 0, 0, 120000, tzinfo=UTC),
    "profile": '{"tags": [], "visits": 3}',
    "notes": "x" * 3000,
}


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def test_avro_envelope_schema_is_debezium_shaped(tmp_path: Path) -> None:
    enc = AvroChangeEncoder(EmbeddedSchemaRegistry(tmp_path), "demo")
    key_id, value_id = enc.schema_ids(TABLES["customers"])
    registry = EmbeddedSchemaRegistry(tmp_path)
    assert registry.subjects() == {
        "demo.public.customers-key": [key_id],
        "demo.public.customers-value": [value_id],
    }
    envelope = registry.get_schema(value_id)
    assert (envelope["name"], envelope["namespace"]) == ("Envelope", "demo.public.customers")
    assert envelope["connect.name"] == "demo.public.customers.Envelope"
    assert [f["name"] for f in envelope["fields"]] == [
        "before",
        "after",
        "source",
        "transaction",
        "op",
        "ts_ms",
        "ts_us",
        "ts_ns",
    ]
    value = _field(envelope, "before")["type"][1]
    assert value["connect.name"] == "demo.public.customers.Value" and _field(envelope, "after")["type"] == [
        "null",
        "Value",
    ]
    balance = _field(value, "balance")["type"]
    assert balance == {
        "type": "bytes",
        "scale": 2,
        "precision": 12,
        "connect.version": 1,
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "12"},
        "connect.name": "org.apache.kafka.connect.data.Decimal",
        "logicalType": "decimal",
    }
    assert _field(value, "created_at")["type"]["connect.name"] == "io.debezium.time.MicroTimestamp"
    assert _field(value, "updated_at")["type"]["connect.name"] == "io.debezium.time.ZonedTimestamp"
    assert _field(value, "birth_date")["type"][1] == {
        "type": "int",
        "connect.version": 1,
        "connect.name": "io.debezium.time.Date",
    }
    assert _field(value, "segment")["type"]["connect.parameters"] == {"allowed": "consumer,smb,enterprise"}
    assert _field(value, "profile")["type"][1]["connect.name"] == "io.debezium.data.Json"
    assert _field(value, "notes") == {"name": "notes", "type": ["null", "string"], "default": None}
    source = _field(envelope, "source")["type"]
    assert source["connect.name"] == "io.debezium.connector.postgresql.Source"
    assert [f["name"] for f in source["fields"]][-5:] == ["schema", "table", "txId", "lsn", "xmin"]
    key = registry.get_schema(key_id)
    assert key["connect.name"] == "demo.public.customers.Key" and key["fields"] == [
        {"name": "id", "type": "int"}
    ]


def test_avro_special_types(tmp_path: Path) -> None:
    enc = AvroChangeEncoder(EmbeddedSchemaRegistry(tmp_path), "demo")
    products = EmbeddedSchemaRegistry(tmp_path).get_schema(enc.schema_ids(TABLES["products"])[1])
    value = _field(products, "before")["type"][1]
    assert _field(value, "weight_kg")["type"][1]["connect.name"] == "io.debezium.data.VariableScaleDecimal"
    assert [f["name"] for f in _field(value, "weight_kg")["type"][1]["fields"]] == ["scale", "value"]
    orders = EmbeddedSchemaRegistry(tmp_path).get_schema(enc.schema_ids(TABLES["orders"])[1])
    order_value = _field(orders, "before")["type"][1]
    assert _field(order_value, "quantity")["type"] == {"type": "int", "connect.type": "int16"}
    assert _field(order_value, "id")["type"] == "long"


@pytest.mark.parametrize(
    ("table", "op", "before", "after"),
    [
        ("products", "c", None, PRODUCT),
        ("products", "u", None, {**PRODUCT, "weight_kg": None}),
        ("products", "d", TABLES["products"].key_only_image(PRODUCT), None),
        ("customers", "u", CUSTOMER, {**CUSTOMER, "notes": UNAVAILABLE_VALUE}),
        ("orders", "t", None, None),
    ],
)
def test_assembled_avro_equals_fastavro_envelope(
    tmp_path: Path, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> None:
    enc = AvroChangeEncoder(EmbeddedSchemaRegistry(tmp_path), "demo")
    definition = TABLES[table]
    message = enc.value(definition, Envelope(op, before, after, {**SOURCE, "table": table}, 1717401600050123))
    schema_id = enc.schema_ids(definition)[1]
    decoded: dict[str, Any] = fastavro.schemaless_reader(  # type: ignore[assignment]
        io.BytesIO(message[5:]), enc.envelope_schema(definition), None
    )
    assert message[:5] == frame(schema_id, b"")
    assert decoded["op"] == op and decoded["source"]["table"] == table and decoded["transaction"] is None
    assert (decoded["ts_ms"], decoded["ts_us"], decoded["ts_ns"]) == (
        1717401600050,
        1717401600050123,
        1717401600050123000,
    )
    assert (decoded["before"] is None) == (before is None) and (decoded["after"] is None) == (after is None)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, enc.envelope_schema(definition), decoded)
    assert buf.getvalue() == message[5:]


def test_avro_values_decode_to_source_values(tmp_path: Path, ref: SimpleNamespace) -> None:
    enc = AvroChangeEncoder(EmbeddedSchemaRegistry(tmp_path), "demo")
    for table, row in (("products", PRODUCT), ("customers", CUSTOMER)):
        message = enc.value(TABLES[table], Envelope("c", None, row, SOURCE, 1))
        rec = ref.Rec(f"demo.public.{table}", 0, 0, enc.key(TABLES[table], (row["id"],)), message, 0)
        event = ref.decode("avro", EmbeddedSchemaRegistry(tmp_path), table, rec)
        assert event.kind == "change" and event.key == (row["id"],)
        expected = {
            k: (v.quantize(Decimal(1).scaleb(-18)) if k == "weight_kg" else v) for k, v in row.items()
        }
        assert event.after == expected


def test_json_message_is_jsonconverter_shaped(ref: SimpleNamespace) -> None:
    enc = JsonChangeEncoder("demo")
    message = json.loads(enc.value(TABLES["products"], Envelope("c", None, PRODUCT, SOURCE, 1)))
    assert set(message) == {"schema", "payload"}
    schema, payload = message["schema"], message["payload"]
    assert schema["name"] == "demo.public.products.Envelope" and schema["type"] == "struct"
    after_schema = next(f for f in schema["fields"] if f["field"] == "after")
    price = next(f for f in after_schema["fields"] if f["field"] == "price")
    assert price == {
        "type": "bytes",
        "optional": False,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "price",
    }
    assert payload["after"]["price"] == base64.b64encode((1999).to_bytes(2, "big")).decode()
    assert payload["after"]["weight_kg"] == {
        "scale": 3,
        "value": base64.b64encode((1250).to_bytes(2, "big")).decode(),
    }
    assert payload["after"]["created_at"] == 1704164645000006
    assert (
        payload["op"] == "c"
        and payload["source"]["sequence"] == '["100","120"]'
        and payload["before"] is None
    )
    key = json.loads(enc.key(TABLES["products"], (5,)))
    assert key == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "int32", "optional": False, "field": "id"}],
            "optional": False,
            "name": "demo.public.products.Key",
        },
        "payload": {"id": 5},
    }
    assert ref.to_source_value("products", "price", payload["after"]["price"], "json") == Decimal("19.99")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x00\x80"),
        (-1, b"\xff"),
        (-128, b"\x80"),
        (-129, b"\xff\x7f"),
        (1999, b"\x07\xcf"),
    ],
)
def test_unscaled_bytes_match_java_biginteger(value: int, expected: bytes) -> None:
    assert unscaled_bytes(value) == expected


def test_variable_scale_and_zoned_timestamp() -> None:
    assert variable_scale(Decimal("1.250")) == (3, (1250).to_bytes(2, "big"))
    assert variable_scale(Decimal("7")) == (0, b"\x07")
    assert variable_scale(Decimal("-0.5")) == (1, b"\xfb")
    assert zoned_timestamp(dt.datetime(2024, 6, 3, 8, 0, tzinfo=UTC)) == "2024-06-03T08:00:00Z"
    assert zoned_timestamp(dt.datetime(2024, 6, 3, 8, 0, 0, 120000, tzinfo=UTC)) == "2024-06-03T08:00:00.12Z"
    assert zoned_timestamp(dt.datetime(2024, 6, 3, 8, 0, 0, 5, tzinfo=UTC)) == "2024-06-03T08:00:00.000005Z"


@pytest.mark.parametrize("value_format", ["avro", "json"])
def test_every_malformed_kind_is_rejected_by_a_strict_reader(
    tmp_path: Path, ref: SimpleNamespace, value_format: str
) -> None:
    registry = EmbeddedSchemaRegistry(tmp_path)
    enc: AvroChangeEncoder | JsonChangeEncoder = (
        AvroChangeEncoder(registry, "demo") if value_format == "avro" else JsonChangeEncoder("demo")
    )
    envelope = Envelope("u", CUSTOMER, CUSTOMER, {**SOURCE, "table": "customers"}, 1)
    good = ref.Rec(
        "demo.public.customers",
        0,
        0,
        enc.key(TABLES["customers"], (9,)),
        enc.value(TABLES["customers"], envelope),
        0,
    )
    assert ref.decode(value_format, registry, "customers", good).kind == "change"
    for kind in MALFORMED_KINDS[value_format]:
        key, value = malformed_message(enc, kind, TABLES["customers"], (9,), CUSTOMER, envelope)
        event = ref.decode(value_format, registry, "customers", ref.Rec("t", 0, 0, key, value, 0))
        assert event.kind == "malformed", kind
    # The registry's topic subjects stay clean: broken variants live under record-name subjects.
    if isinstance(enc, AvroChangeEncoder):
        assert registry.subjects()["demo.public.customers-value"] == [enc.schema_ids(TABLES["customers"])[1]]
