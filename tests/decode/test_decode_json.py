"""JsonConverter messages: envelopes with and without schema, keys, caching, errors."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

import pytest

from ingest.decode import decode_message
from ingest.errors import DecodeError
from ingest.model import UNAVAILABLE, ChangeEvent, ColumnSpec, SourcePosition

from .fixtures import (
    COORDS,
    MARKER,
    MYSQL_SOURCE_FIELDS,
    ORDER_FIELDS,
    ORDERS_SCHEMA,
    cfield,
    dec_b64,
    envelope,
    envelope_schema,
    json_change,
    json_decoder,
    json_key,
    json_message,
    key_schema,
    mysql_source,
    order_row,
    pg_source,
)

PLACED_AT = datetime(2023, 11, 14, 22, 13, 20, 123456)  # 1_700_000_000_123_456 us, naive
SCHEMA = ORDERS_SCHEMA


def test_pg_create_with_schema() -> None:
    value = json_message(
        envelope("c", after=order_row(7), source=pg_source(lsn=5000, committed=4000)), SCHEMA
    )
    event = json_change(value, json_key(7))
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
    assert event.snapshot == "false"
    assert event.source_ts_ms == 1_700_000_000_123
    assert event.unavailable == frozenset()
    assert event.columns == (
        ColumnSpec("id", "long", False, None),
        ColumnSpec("customer", "string", True, None),
        ColumnSpec("amount", "decimal(10,2)", True, "org.apache.kafka.connect.data.Decimal"),
        ColumnSpec("placed_at", "timestamp_ntz", True, "io.debezium.time.MicroTimestamp"),
        ColumnSpec("notes", "string", True, None),
    )
    assert event.schema_ref is not None and event.schema_ref.startswith("json:")
    assert len(event.schema_ref) == len("json:") + 12


def test_pg_update_keeps_before_and_marks_toast() -> None:
    before = order_row(7, notes="old")
    after = order_row(7, customer="Ada L.", notes=MARKER)
    value = json_message(
        envelope("u", before=before, after=after, source=pg_source(lsn=5100, committed=5050)), SCHEMA
    )
    event = json_change(value, json_key(7))
    assert event.op == "u"
    assert event.after is not None and event.after["notes"] is UNAVAILABLE
    assert event.after["customer"] == "Ada L."
    assert event.before is not None and event.before["notes"] == "old"
    assert event.unavailable == frozenset({"notes"})


def test_pg_delete_uses_before_image() -> None:
    before = {
        "id": 7,
        "customer": None,
        "amount": None,
        "placed_at": None,
        "notes": None,
    }  # REPLICA IDENTITY DEFAULT
    value = json_message(envelope("d", before=before, source=pg_source(lsn=5200, committed=5150)), SCHEMA)
    event = json_change(value, json_key(7))
    assert (event.op, event.key, event.after, event.before) == ("d", {"id": 7}, None, before)
    assert event.is_delete
    assert event.position == SourcePosition(5150, 5200, 0, 1)


def test_pg_truncate_has_no_key() -> None:
    value = json_message(envelope("t", source=pg_source(lsn=5300, committed=5250)), SCHEMA)
    event = json_change(value, None)
    assert (event.op, event.key, event.key_columns, event.after, event.before) == ("t", {}, (), None, None)
    assert event.position == SourcePosition(5250, 5300, 0, 1)


def test_pg_snapshot_read_is_phase_zero() -> None:
    value = json_message(
        envelope("r", after=order_row(8), source=pg_source(lsn=4000, committed=None, snapshot="first")),
        SCHEMA,
    )
    event = json_change(value, json_key(8))
    assert event.op == "r"
    assert event.snapshot == "first"
    assert event.position == SourcePosition(4000, 4000, 0, 0)


MYSQL_FIELDS = [
    cfield("sku", "string", optional=False),
    cfield("qty", "int32", optional=False),
    cfield("price", "float64"),
]
MYSQL_SCHEMA = envelope_schema(
    MYSQL_FIELDS, topic="shop.shop.stock", source_fields=MYSQL_SOURCE_FIELDS, connector="mysql"
)


@pytest.mark.parametrize(
    ("op", "before", "after", "expected_key"),
    [
        ("c", None, {"sku": "A-1", "qty": 3, "price": 2.5}, {"sku": "A-1"}),
        ("u", {"sku": "A-1", "qty": 3, "price": 2.5}, {"sku": "A-1", "qty": 2, "price": 2.5}, {"sku": "A-1"}),
        ("d", {"sku": "A-1", "qty": 2, "price": 2.5}, None, {"sku": "A-1"}),
        ("t", None, None, {}),
    ],
)
def test_mysql_ops(op: str, before: Any, after: Any, expected_key: dict[str, Any]) -> None:
    source = mysql_source(file="binlog.000012", pos=4711, row=1)
    value = json_message(envelope(op, before=before, after=after, source=source), MYSQL_SCHEMA)
    key_bytes = json_message({"sku": "A-1"}, key_schema([cfield("sku", "string", optional=False)]))
    event = json_change(value, None if op == "t" else key_bytes)
    assert event.op == op
    assert event.key == expected_key
    assert event.position == SourcePosition(12, 4711, 1, 1)
    assert event.after == after
    assert event.before == before
    if op != "t":
        assert [c.type for c in event.columns] == ["string", "integer", "double"]


def test_mysql_price_int_becomes_float() -> None:
    value = json_message(
        envelope("c", after={"sku": "B", "qty": 1, "price": 3}, source=mysql_source()), MYSQL_SCHEMA
    )
    event = json_change(value, key_columns=("sku",))
    assert event.after == {"sku": "B", "qty": 1, "price": 3.0}
    assert isinstance(event.after["price"], float)


def test_without_schema_infers_types() -> None:
    row = {"id": 9, "name": "Bo", "score": 1.5, "vip": True, "prefs": {"b": 1, "a": [1, 2]}, "gone": None}
    value = json_message(envelope("c", after=row, source=pg_source(lsn=10, committed=5)))
    event = json_change(value, json_key(9, with_schema=False))
    assert event.schema_ref is None
    assert event.key == {"id": 9}
    assert event.after == {
        "id": 9,
        "name": "Bo",
        "score": 1.5,
        "vip": True,
        "prefs": '{"a": [1, 2], "b": 1}',
        "gone": None,
    }
    assert [(c.name, c.type) for c in event.columns] == [
        ("id", "long"),
        ("name", "string"),
        ("score", "double"),
        ("vip", "boolean"),
        ("prefs", "string"),
        ("gone", "void"),  # no type known: another message or the table gives it (else string)
    ]


def test_without_schema_null_schema_wrapper_and_toast_array() -> None:
    row = {"id": 9, "tags": [MARKER], "body": MARKER}
    value = json_message(
        {"schema": None, "payload": envelope("u", after=row, source=pg_source(lsn=1, committed=1))},
        wrap=False,
    )
    event = json_change(value, key_columns=("id",))
    assert event.after == {"id": 9, "tags": UNAVAILABLE, "body": UNAVAILABLE}
    assert event.unavailable == frozenset({"tags", "body"})


def test_compact_and_pretty_messages_decode_alike() -> None:
    payload = envelope("c", after=order_row(7), source=pg_source(lsn=5000, committed=4000))
    dec = json_decoder()
    first = dec.decode(json_key(7), json_message(payload, SCHEMA), COORDS)
    again = dec.decode(json_key(7), json_message(payload, SCHEMA), COORDS)  # the cached fast path
    pretty = dec.decode(json_key(7), json_message(payload, SCHEMA, pretty=True), COORDS)
    assert first == again == pretty


def test_fast_path_still_reports_bad_payload() -> None:
    dec = json_decoder()
    good = json_message(envelope("c", after=order_row(7), source=pg_source(lsn=1, committed=1)), SCHEMA)
    dec.decode(json_key(7), good, COORDS)
    broken = good[:-3] + b"!}"
    with pytest.raises(DecodeError, match=r"^json: invalid JSON at line 1 column \d+: "):
        dec.decode(json_key(7), broken, COORDS)


def test_key_columns_override_reads_image_and_skips_kafka_key() -> None:
    value = json_message(
        envelope("c", after=order_row(7, customer="Cy"), source=pg_source(lsn=1, committed=1)), SCHEMA
    )
    event = json_change(value, b"\xff not even json", key_columns=("customer", "id"))
    assert event.key == {"customer": "Cy", "id": 7}
    assert event.key_columns == ("customer", "id")


def test_key_columns_override_falls_back_to_kafka_key() -> None:
    # A delete with REPLICA IDENTITY NOTHING has no before image at all.
    value = json_message(envelope("d", before=None, source=pg_source(lsn=1, committed=1)), SCHEMA)
    event = json_change(value, json_key(7), key_columns=("id",))
    assert event.key == {"id": 7}


@pytest.mark.parametrize(
    ("value", "key_bytes", "key_columns", "reason"),
    [
        (
            b'{"op": "c", "after": {"id": 1}, "source": {}',
            None,
            None,
            r"^json: invalid JSON at line 1 column 45: Expecting ',' delimiter$",
        ),
        (b'{"op": "c", "after": {"id": "\xff"}}', None, None, r"^json: value is not valid UTF-8"),
        (
            json_message(envelope("c", after={"id": 1}, source={})),
            b'{"id": "\xfe"}',
            None,
            r"^key: json: key is not valid UTF-8 \(byte 8\)$",
        ),
        (
            json_message(envelope(None, after={"id": 1}, source={"connector": "postgresql"})),
            None,
            ("id",),
            r"^envelope: missing 'op'$",
        ),
        (
            json_message(envelope("x", after={"id": 1}, source={})),
            None,
            ("id",),
            r"^envelope: unknown op 'x'$",
        ),
        (
            json_message(envelope("c", after={"id": None}, source={})),
            None,
            ("id",),
            r"^key: null primary key column 'id'$",
        ),
        (
            json_message(envelope("c", after={"id": 1}, source={})),
            None,
            ("sku",),
            r"^key: null primary key column 'sku' \(missing from the row image and the Kafka key\)$",
        ),
        (
            json_message(envelope("c", after={"id": 1}, source={})),
            json_message({"id": None}),
            None,
            r"^key: null primary key column 'id'$",
        ),
        (
            json_message(envelope("c", after={"id": 1}, source={})),
            None,
            None,
            r"^key: the message has no Kafka key, and its table has no primary_key configured$",
        ),
        (
            json_message(envelope("c", after={"id": 1}, source={})),
            b"{nope",
            None,
            r"^key: json: invalid JSON at line 1 column 2: ",
        ),
        (
            json_message(envelope("u", after=None, source={})),
            None,
            ("id",),
            r"^envelope: op 'u' without an 'after'",
        ),
        (json_message([1, 2]), None, None, r"^envelope: value is a list, not a record$"),
        (
            json_message(envelope("c", after={"id": 1}, source={"connector": "postgresql", "lsn": -4})),
            None,
            ("id",),
            r"^envelope: source.lsn is not an unsigned integer of at most 128 bits: -4$",
        ),
        (
            json_message(envelope("c", after={"id": 1}, source={"lsn": 3, "sequence": "[1"})),
            None,
            ("id",),
            r"^envelope: source.sequence is not a JSON array",
        ),
        (
            json_message(
                envelope("c", after={"id": 1}, source={"connector": "mysql", "file": "bin", "pos": 1})
            ),
            None,
            ("id",),
            r"^envelope: cannot read a binlog sequence number from source.file 'bin'$",
        ),
    ],
)
def test_errors(
    value: bytes, key_bytes: bytes | None, key_columns: tuple[str, ...] | None, reason: str
) -> None:
    with pytest.raises(DecodeError, match=reason):
        json_decoder(key_columns).decode(key_bytes, value, COORDS)


@pytest.mark.parametrize(
    ("field", "wire", "reason"),
    [
        (cfield("id", "int64", optional=False), "7", r"^expected int64, got '7' \(column 'id'\)$"),
        (cfield("id", "int8", optional=False), 300, r"^expected int8, got 300 \(column 'id'\)$"),
        (cfield("id", "boolean"), 1, r"^expected a boolean, got 1 \(column 'id'\)$"),
        (cfield("id", "bytes"), "***", r"^invalid base64 '\*\*\*'"),
        (
            cfield(
                "id",
                "bytes",
                name="org.apache.kafka.connect.data.Decimal",
                parameters={"scale": "2", "connect.decimal.precision": "4"},
            ),
            dec_b64(10000),
            r"^decimal overflow: 100.00 does not fit decimal\(4,2\) \(column 'id'\)$",
        ),
    ],
)
def test_schema_type_mismatch_is_quarantined(field: dict[str, Any], wire: Any, reason: str) -> None:
    schema = envelope_schema([field])
    value = json_message(envelope("c", after={"id": wire}, source=pg_source(lsn=1, committed=1)), schema)
    with pytest.raises(DecodeError, match=reason):
        json_decoder(("id",)).decode(None, value, COORDS)


def test_unknown_connect_type_is_refused() -> None:
    schema = envelope_schema([cfield("id", "int128")])
    value = json_message(envelope("c", after={"id": 1}, source={}), schema)
    with pytest.raises(DecodeError, match=r"^schema: column 'id' has unknown Connect type 'int128'$"):
        json_decoder(("id",)).decode(None, value, COORDS)


def test_decode_message_reuses_a_decoder() -> None:
    value = json_message(
        envelope("c", after=order_row(7), source=pg_source(lsn=5000, committed=4000)), SCHEMA
    )
    first = decode_message(json_key(7), value, COORDS, value_format="json", registry=None)
    second = decode_message(json_key(7), value, COORDS, value_format="json", registry=None)
    assert first == second
    assert isinstance(first, ChangeEvent) and first.after is not None
    assert first.after["amount"] == Decimal("19.99")


def test_schema_ref_follows_schema_not_layout() -> None:
    other = envelope_schema([*ORDER_FIELDS, cfield("coupon", "string")])
    payload = envelope("c", after={**order_row(7), "coupon": None}, source=pg_source(lsn=1, committed=1))
    a = json_change(json_message(payload, SCHEMA), json_key(7))
    b = json_change(json_message(payload, other), json_key(7))
    c = json_change(json.dumps({"payload": payload, "schema": SCHEMA}).encode(), json_key(7))
    assert a.schema_ref == c.schema_ref != b.schema_ref


def test_float_and_double_as_jsonconverter_names_them_including_non_finite_values() -> None:
    """JsonConverter writes FLOAT32/FLOAT64 as "float"/"double" and NaN, +-Infinity as strings."""
    import math

    from tests.decode.fixtures import cfield, envelope_schema

    schema = envelope_schema([cfield("id", "int32", optional=False), cfield("r", "float"), cfield("d", "double")])
    rows = [{"id": 1, "r": 1.5, "d": -2.25}, {"id": 2, "r": "NaN", "d": "Infinity"},
            {"id": 3, "r": None, "d": "-Infinity"}]
    got = []
    for row in rows:
        value = json_message(envelope("c", after=row, source=pg_source(lsn=10 + row["id"], committed=9)), schema)
        event = json_change(value, json_key(row["id"]))
        got.append(event.after)
        assert {c.name: c.type for c in event.columns} == {"id": "integer", "r": "float", "d": "double"}
    assert got[0] == {"id": 1, "r": 1.5, "d": -2.25}
    assert math.isnan(got[1]["r"]) and got[1]["d"] == math.inf and got[2]["d"] == -math.inf


@pytest.mark.parametrize(("value", "reason"), [
    (b"\x00\x00\x00\x00\x01\x02\xff\xfe",
     r"value is not valid UTF-8 \(byte 6\); it starts like Avro in the Confluent framing"),
    (b"\x00\x00\x00\x00\x01\x02", r"invalid JSON at line 1 column 1: Expecting value; it starts like Avro"),
])
def test_avro_read_as_json_is_named_in_the_reason(value: bytes, reason: str) -> None:
    """A table read as JSON from an Avro topic quarantined each message as "not valid UTF-8"."""
    with pytest.raises(DecodeError, match=r"^json: " + reason):
        json_decoder().decode(json_key(7), value, COORDS)


def test_a_columns_source_default_is_read_from_its_schema_as_text() -> None:
    """JsonConverter writes a column's default in the field schema, as a wire value of its type."""
    fields = [
        cfield("id", "int32", optional=False),
        cfield("region", "string", default="eu"),
        cfield("quote", "string", default="it's"),
        cfield("qty", "int32", optional=False, default=5),
        cfield("active", "boolean", default=True),
        cfield("price", "bytes", name="org.apache.kafka.connect.data.Decimal",
               parameters={"scale": "2", "connect.decimal.precision": "10"}, default=dec_b64(150)),
        cfield("since", "int64", name="io.debezium.time.MicroTimestamp", default=1_700_000_000_123_456),
        cfield("blob", "bytes", default="AP8="),
        cfield("plain", "string"),
        cfield("nulled", "string", default=None),
    ]
    schema = envelope_schema(fields)
    row = {"id": 1, "region": "us", "quote": None, "qty": 1, "active": False, "price": None, "since": None,
           "blob": None, "plain": None, "nulled": None}
    event = json_change(json_message(envelope("c", after=row, source=pg_source(lsn=10, committed=9)), schema),
                        json_key(1))
    assert {c.name: c.default for c in event.columns} == {
        "id": None, "region": "'eu'", "quote": "'it''s'", "qty": "5", "active": "true", "price": "1.50",
        "since": "2023-11-14 22:13:20.123456", "blob": "'\\x00ff'", "plain": None, "nulled": None,
    }
    assert event.after is not None and event.after["region"] == "us"  # a default never stands in for a value
    assert ColumnSpec("region", "string", True, None) in event.columns  # nor does it make another column
