"""Semantic types through both wires: same column type and the exact same Python value."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ingest.decode import MessageDecoder
from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.decode.semantic import convert_image, field_plan
from ingest.decode.values import fit_decimal
from ingest.errors import DecodeError
from ingest.model import UNAVAILABLE, ChangeEvent

from .fixtures import (
    COORDS,
    MARKER,
    avro_decimal,
    avro_encode,
    avro_envelope_schema,
    avro_semantic,
    cfield,
    dec_b64,
    dec_bytes,
    envelope,
    envelope_schema,
    json_message,
    optional,
    pg_source,
)

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VSD = "io.debezium.data.VariableScaleDecimal"
VSD_AVRO = {
    "type": "record",
    "name": "VariableScaleDecimal",
    "namespace": "io.debezium.data",
    "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
    "connect.version": 1,
    "connect.doc": "Variable scaled decimal",
    "connect.name": VSD,
}
VSD_JSON_FIELDS = [cfield("scale", "int32", optional=False), cfield("value", "bytes", optional=False)]
POINT_AVRO = {
    "type": "record",
    "name": "Point",
    "namespace": "io.debezium.data.geometry",
    "fields": [
        {"name": "x", "type": "double"},
        {"name": "y", "type": "double"},
        {"name": "srid", "type": ["null", "int"], "default": None},
    ],
    "connect.name": "io.debezium.data.geometry.Point",
}
POINT_JSON_FIELDS = [
    cfield("x", "float64", optional=False),
    cfield("y", "float64", optional=False),
    cfield("srid", "int32"),
]
PLACED = datetime(2023, 11, 14, 22, 13, 20, 123456)


@dataclass(frozen=True)
class Case:
    """One column: its JSON schema and value, its Avro type and value, and what must come out."""

    id: str
    json_field: dict[str, Any]
    json_value: Any
    avro_type: Any
    avro_value: Any
    delta: str
    expected: Any


def sem(base: str, name: str, **params: str) -> dict[str, Any]:
    return cfield("v", base, optional=False, name=name, parameters=params or None)


CASES = [
    Case(
        "int8",
        cfield("v", "int8", optional=False),
        -5,
        {"type": "int", "connect.type": "int8"},
        -5,
        "byte",
        -5,
    ),
    Case(
        "int16",
        cfield("v", "int16", optional=False),
        300,
        {"type": "int", "connect.type": "int16"},
        300,
        "short",
        300,
    ),
    Case("int32", cfield("v", "int32", optional=False), 70000, "int", 70000, "integer", 70000),
    Case("int64", cfield("v", "int64", optional=False), 2**40, "long", 2**40, "long", 2**40),
    Case("float32", cfield("v", "float32", optional=False), 1.5, "float", 1.5, "float", 1.5),
    Case("float64", cfield("v", "float64", optional=False), 2.25, "double", 2.25, "double", 2.25),
    Case("boolean", cfield("v", "boolean", optional=False), True, "boolean", True, "boolean", True),
    Case("string", cfield("v", "string", optional=False), "héllo", "string", "héllo", "string", "héllo"),
    Case(
        "bytes",
        cfield("v", "bytes", optional=False),
        "AP9hYg==",
        "bytes",
        b"\x00\xffab",
        "binary",
        b"\x00\xffab",
    ),
    Case(
        "decimal",
        sem("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "10"}),
        dec_b64(1999),
        avro_decimal(10, 2),
        dec_bytes(1999),
        "decimal(10,2)",
        Decimal("19.99"),
    ),
    Case(
        "decimal-negative",
        sem("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "10"}),
        dec_b64(-1999),
        avro_decimal(10, 2),
        dec_bytes(-1999),
        "decimal(10,2)",
        Decimal("-19.99"),
    ),
    Case(
        "decimal-38-digits",
        sem("bytes", DECIMAL, scale="0", **{"connect.decimal.precision": "38"}),
        dec_b64(10**38 - 1),
        avro_decimal(38, 0),
        dec_bytes(10**38 - 1),
        "decimal(38,0)",
        Decimal(10**38 - 1),
    ),
    Case(
        "decimal-default-precision",
        sem("bytes", DECIMAL, scale="3"),
        dec_b64(5),
        {"type": "bytes", "connect.name": DECIMAL, "connect.parameters": {"scale": "3"}},
        dec_bytes(5),
        "decimal(38,3)",
        Decimal("0.005"),
    ),
    Case(
        "variable-scale-decimal",
        cfield("v", "struct", optional=False, name=VSD, fields=VSD_JSON_FIELDS),
        {"scale": 3, "value": dec_b64(123456)},
        VSD_AVRO,
        {"scale": 3, "value": dec_bytes(123456)},
        "decimal(38,18)",
        Decimal("123.456000000000000000"),
    ),
    Case(
        "variable-scale-decimal-trailing-zeros",
        cfield("v", "struct", optional=False, name=VSD, fields=VSD_JSON_FIELDS),
        {"scale": 20, "value": dec_b64(15 * 10**19)},
        VSD_AVRO,
        {"scale": 20, "value": dec_bytes(15 * 10**19)},
        "decimal(38,18)",
        Decimal("1.500000000000000000"),
    ),
    Case(
        "debezium-date",
        sem("int32", "io.debezium.time.Date"),
        19675,
        avro_semantic("int", "io.debezium.time.Date"),
        19675,
        "date",
        date(2023, 11, 14),
    ),
    Case(
        "connect-date",
        sem("int32", "org.apache.kafka.connect.data.Date"),
        -1,
        avro_semantic("int", "org.apache.kafka.connect.data.Date", logicalType="date"),
        -1,
        "date",
        date(1969, 12, 31),
    ),
    Case(
        "time-ms",
        sem("int32", "io.debezium.time.Time"),
        3_723_004,
        avro_semantic("int", "io.debezium.time.Time"),
        3_723_004,
        "long",
        3_723_004_000,
    ),
    Case(
        "micro-time",
        sem("int64", "io.debezium.time.MicroTime"),
        3_723_004_005,
        avro_semantic("long", "io.debezium.time.MicroTime"),
        3_723_004_005,
        "long",
        3_723_004_005,
    ),
    Case(
        "nano-time",
        sem("int64", "io.debezium.time.NanoTime"),
        3_723_004_005_006,
        avro_semantic("long", "io.debezium.time.NanoTime"),
        3_723_004_005_006,
        "long",
        3_723_004_005,
    ),
    Case(
        "connect-time",
        sem("int32", "org.apache.kafka.connect.data.Time"),
        3_723_004,
        avro_semantic("int", "org.apache.kafka.connect.data.Time", logicalType="time-millis"),
        3_723_004,
        "long",
        3_723_004_000,
    ),
    Case(
        "zoned-time",
        sem("string", "io.debezium.time.ZonedTime"),
        "01:02:03.004Z",
        avro_semantic("string", "io.debezium.time.ZonedTime"),
        "01:02:03.004Z",
        "string",
        "01:02:03.004Z",
    ),
    Case(
        "timestamp-ms",
        sem("int64", "io.debezium.time.Timestamp"),
        1_700_000_000_123,
        avro_semantic("long", "io.debezium.time.Timestamp"),
        1_700_000_000_123,
        "timestamp_ntz",
        datetime(2023, 11, 14, 22, 13, 20, 123000),
    ),
    Case(
        "micro-timestamp",
        sem("int64", "io.debezium.time.MicroTimestamp"),
        1_700_000_000_123_456,
        avro_semantic("long", "io.debezium.time.MicroTimestamp"),
        1_700_000_000_123_456,
        "timestamp_ntz",
        PLACED,
    ),
    Case(
        "micro-timestamp-before-epoch",
        sem("int64", "io.debezium.time.MicroTimestamp"),
        -1,
        avro_semantic("long", "io.debezium.time.MicroTimestamp"),
        -1,
        "timestamp_ntz",
        datetime(1969, 12, 31, 23, 59, 59, 999999),
    ),
    Case(
        "nano-timestamp",
        sem("int64", "io.debezium.time.NanoTimestamp"),
        1_700_000_000_123_456_789,
        avro_semantic("long", "io.debezium.time.NanoTimestamp"),
        1_700_000_000_123_456_789,
        "timestamp_ntz",
        PLACED,
    ),
    Case(
        "connect-timestamp",
        sem("int64", "org.apache.kafka.connect.data.Timestamp"),
        1_700_000_000_123,
        avro_semantic("long", "org.apache.kafka.connect.data.Timestamp", logicalType="timestamp-millis"),
        1_700_000_000_123,
        "timestamp",
        datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC),
    ),
    Case(
        "zoned-timestamp",
        sem("string", "io.debezium.time.ZonedTimestamp"),
        "2023-11-15T00:13:20.123456+02:00",
        avro_semantic("string", "io.debezium.time.ZonedTimestamp"),
        "2023-11-15T00:13:20.123456+02:00",
        "timestamp",
        PLACED.replace(tzinfo=UTC),
    ),
    Case(
        "zoned-timestamp-z",
        sem("string", "io.debezium.time.ZonedTimestamp"),
        "2023-11-14T22:13:20Z",
        avro_semantic("string", "io.debezium.time.ZonedTimestamp"),
        "2023-11-14T22:13:20Z",
        "timestamp",
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC),
    ),
    Case(
        "json",
        sem("string", "io.debezium.data.Json"),
        '{"b": 1}',
        avro_semantic("string", "io.debezium.data.Json"),
        '{"b": 1}',
        "string",
        '{"b": 1}',
    ),
    Case(
        "uuid",
        sem("string", "io.debezium.data.Uuid"),
        "6f1c8a44-3c1e-4c1a-9d59-1b8c0f2e7a10",
        avro_semantic("string", "io.debezium.data.Uuid"),
        "6f1c8a44-3c1e-4c1a-9d59-1b8c0f2e7a10",
        "string",
        "6f1c8a44-3c1e-4c1a-9d59-1b8c0f2e7a10",
    ),
    Case(
        "enum",
        sem("string", "io.debezium.data.Enum", allowed="new,paid"),
        "paid",
        avro_semantic("string", "io.debezium.data.Enum"),
        "paid",
        "string",
        "paid",
    ),
    Case(
        "enum-set",
        sem("string", "io.debezium.data.EnumSet", allowed="a,b,c"),
        "a,c",
        avro_semantic("string", "io.debezium.data.EnumSet"),
        "a,c",
        "string",
        "a,c",
    ),
    Case(
        "xml",
        sem("string", "io.debezium.data.Xml"),
        "<a/>",
        avro_semantic("string", "io.debezium.data.Xml"),
        "<a/>",
        "string",
        "<a/>",
    ),
    Case(
        "year-keeps-base-type",
        sem("int32", "io.debezium.time.Year"),
        2024,
        avro_semantic("int", "io.debezium.time.Year"),
        2024,
        "integer",
        2024,
    ),
    Case(
        "bits-keeps-base-type",
        sem("bytes", "io.debezium.data.Bits", length="8"),
        "Dw==",
        avro_semantic("bytes", "io.debezium.data.Bits"),
        b"\x0f",
        "binary",
        b"\x0f",
    ),
    Case(
        "unknown-struct",
        cfield(
            "v", "struct", optional=False, name="io.debezium.data.geometry.Point", fields=POINT_JSON_FIELDS
        ),
        {"x": 1.0, "y": 2.5, "srid": None},
        POINT_AVRO,
        {"x": 1.0, "y": 2.5, "srid": None},
        "string",
        '{"srid": null, "x": 1.0, "y": 2.5}',
    ),
    Case(
        "array",
        cfield("v", "array", optional=False, items={"type": "int32", "optional": False}),
        [3, 1, 2],
        {"type": "array", "items": "int"},
        [3, 1, 2],
        "string",
        "[3, 1, 2]",
    ),
    Case(
        "map",
        cfield(
            "v",
            "map",
            optional=False,
            keys={"type": "string", "optional": False},
            values={"type": "int32", "optional": True},
        ),
        {"b": 2, "a": None},
        {"type": "map", "values": ["null", "int"]},
        {"b": 2, "a": None},
        "string",
        '{"a": null, "b": 2}',
    ),
]

# PostgreSQL's infinity and -infinity as Debezium 3.6's PostgreSQL connector sends them (seen on the real
# stack: tests/stack/test_types.py), and the infinity date of later Debezium versions (+5877611-06-21):
# written as Delta's latest and earliest values to the second, as Spark's own PostgreSQL reader gives them.
LATEST, EARLIEST = datetime(9999, 12, 31, 23, 59, 59), datetime(1, 1, 1)
INFINITIES = [
    ("micro-timestamp", "int64", "long", "io.debezium.time.MicroTimestamp", "timestamp_ntz",
     {9_223_372_036_825_200_000: LATEST, -9_223_372_036_832_400_000: EARLIEST}),
    ("timestamp-ms", "int64", "long", "io.debezium.time.Timestamp", "timestamp_ntz",
     {9_223_372_036_825_200: LATEST, -9_223_372_036_832_400: EARLIEST}),
    ("zoned-timestamp", "string", "string", "io.debezium.time.ZonedTimestamp", "timestamp",
     {"infinity": LATEST.replace(tzinfo=UTC), "-infinity": EARLIEST.replace(tzinfo=UTC)}),
    ("date", "int32", "int", "io.debezium.time.Date", "date",
     {-2_147_472_692: LATEST.date(), 2_146_033_979: LATEST.date(), -2_147_472_691: EARLIEST.date()}),
]
CASES += [
    Case(f"{name}-{wire_value}", sem(base, semantic), wire_value, avro_semantic(avro, semantic), wire_value, delta,
         expected)
    for name, base, avro, semantic, delta, values in INFINITIES for wire_value, expected in values.items()
]

def item(base: str, name: str | None = None, **params: str) -> dict[str, Any]:
    """An array's element schema as JsonConverter writes it (optional, as PostgreSQL's are)."""
    return {"type": base, "optional": True, **({"name": name} if name else {}),
            **({"parameters": params} if params else {})}


# Arrays of a semantic type: each element as a column of its type, JSON as PostgreSQL's array_to_json.
ARRAYS = [
    ("date", item("int32", "io.debezium.time.Date"), optional(avro_semantic("int", "io.debezium.time.Date")),
     [19_782, None, -2_147_472_692], [19_782, None, -2_147_472_692], '["2024-02-29", null, "9999-12-31"]'),
    ("numeric-12-2", item("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "12"}),
     optional(avro_decimal(12, 2)), [dec_b64(150), dec_b64(-225), None], [dec_bytes(150), dec_bytes(-225), None],
     "[1.50, -2.25, null]"),
    ("numeric", {**item("struct", VSD), "fields": VSD_JSON_FIELDS}, optional(VSD_AVRO),
     [{"scale": 1, "value": dec_b64(15)}, {"scale": 0, "value": dec_b64(10**30)}],
     [{"scale": 1, "value": dec_bytes(15)}, {"scale": 0, "value": dec_bytes(10**30)}],
     "[1.5, 1000000000000000000000000000000]"),
    ("timestamp", item("int64", "io.debezium.time.MicroTimestamp"),
     optional(avro_semantic("long", "io.debezium.time.MicroTimestamp")),
     [1_709_208_000_500_000, 0], [1_709_208_000_500_000, 0], '["2024-02-29T12:00:00.5", "1970-01-01T00:00:00"]'),
    ("timestamptz", item("string", "io.debezium.time.ZonedTimestamp"),
     optional(avro_semantic("string", "io.debezium.time.ZonedTimestamp")),
     ["2024-02-29T13:00:00.25+01:00"], ["2024-02-29T13:00:00.25+01:00"], '["2024-02-29T12:00:00.25+00:00"]'),
    ("point", {**item("struct", "io.debezium.data.geometry.Point"), "fields": POINT_JSON_FIELDS}, optional(POINT_AVRO),
     [{"x": 1.0, "y": 2.5, "srid": None}], [{"x": 1.0, "y": 2.5, "srid": None}],
     '[{"srid": null, "x": 1.0, "y": 2.5}]'),
    ("uuid", item("string", "io.debezium.data.Uuid"), optional(avro_semantic("string", "io.debezium.data.Uuid")),
     ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"], ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
     '["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]'),
]
CASES += [
    Case(f"array-of-{name}", cfield("v", "array", optional=False, items=json_items), json_value,
         {"type": "array", "items": avro_items}, avro_value, "string", expected)
    for name, json_items, avro_items, json_value, avro_value, expected in ARRAYS
]


def decode_json(case: Case) -> ChangeEvent:
    schema = envelope_schema([cfield("id", "int64", optional=False), case.json_field])
    value = json_message(
        envelope("c", after={"id": 1, "v": case.json_value}, source=pg_source(lsn=2, committed=1)), schema
    )
    event = MessageDecoder(value_format="json", registry=None, key_columns=("id",)).decode(
        None, value, COORDS
    )
    assert isinstance(event, ChangeEvent)
    return event


def decode_avro(case: Case, registry: EmbeddedSchemaRegistry) -> ChangeEvent:
    schema = avro_envelope_schema([{"name": "id", "type": "long"}, {"name": "v", "type": case.avro_type}])
    record = envelope("c", after={"id": 1, "v": case.avro_value}, source=pg_source(lsn=2, committed=1))
    value = avro_encode(registry, f"semantic-{case.id}-value", schema, record)
    event = MessageDecoder(value_format="avro", registry=registry, key_columns=("id",)).decode(
        None, value, COORDS
    )
    assert isinstance(event, ChangeEvent)
    return event


@pytest.fixture
def registry(tmp_path: Path) -> EmbeddedSchemaRegistry:
    return EmbeddedSchemaRegistry(tmp_path / "registry")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("wire", ["json", "avro"])
def test_semantic_type(case: Case, wire: str, registry: EmbeddedSchemaRegistry) -> None:
    event = decode_json(case) if wire == "json" else decode_avro(case, registry)
    assert event.after is not None
    value = event.after["v"]
    assert value == case.expected
    assert type(value) is type(case.expected)
    if isinstance(case.expected, Decimal):
        assert str(value) == str(case.expected)  # same scale, not just the same number
    if isinstance(case.expected, datetime):
        assert value.tzinfo == case.expected.tzinfo
    spec = event.columns[1]
    assert (spec.name, spec.type, spec.nullable) == ("v", case.delta, False)


ERROR_CASES = [
    (
        "micro-timestamp-after-9999",
        sem("int64", "io.debezium.time.MicroTimestamp"),
        253_402_300_800_000_000,
        avro_semantic("long", "io.debezium.time.MicroTimestamp"),
        253_402_300_800_000_000,
        r"^timestamp out of range: 253402300800000000 us since epoch \(column 'v'\)$",
    ),
    (
        "micro-timestamp-next-to-infinity",
        sem("int64", "io.debezium.time.MicroTimestamp"),
        9_223_372_036_825_200_001,
        avro_semantic("long", "io.debezium.time.MicroTimestamp"),
        9_223_372_036_825_200_001,
        r"^timestamp out of range: 9223372036825200001 us since epoch \(column 'v'\)$",
    ),
    (
        "timestamp-before-year-1",
        sem("int64", "io.debezium.time.Timestamp"),
        -62_135_596_800_001,
        avro_semantic("long", "io.debezium.time.Timestamp"),
        -62_135_596_800_001,
        r"^timestamp out of range: -62135596800001 ms since epoch \(column 'v'\)$",
    ),
    (
        "connect-timestamp-out-of-range",
        sem("int64", "org.apache.kafka.connect.data.Timestamp"),
        2**62,
        avro_semantic("long", "org.apache.kafka.connect.data.Timestamp"),
        2**62,
        r"^timestamp out of range: 4611686018427387904 ms since epoch \(column 'v'\)$",
    ),
    (
        "zoned-timestamp-out-of-range",
        sem("string", "io.debezium.time.ZonedTimestamp"),
        "+10000-01-01T00:00:00Z",
        avro_semantic("string", "io.debezium.time.ZonedTimestamp"),
        "+10000-01-01T00:00:00Z",
        r"^timestamp out of range or malformed: '\+10000-01-01T00:00:00Z' \(column 'v'\)$",
    ),
    (
        "date-out-of-range",
        sem("int32", "io.debezium.time.Date"),
        3_000_000,
        avro_semantic("int", "io.debezium.time.Date"),
        3_000_000,
        r"^date out of range: 3000000 days since epoch \(column 'v'\)$",
    ),
    (
        "decimal-overflow",
        sem("bytes", DECIMAL, scale="2", **{"connect.decimal.precision": "5"}),
        dec_b64(123456),
        avro_decimal(5, 2),
        dec_bytes(123456),
        r"^decimal overflow: 1234.56 does not fit decimal\(5,2\) \(column 'v'\)$",
    ),
    (
        "vsd-too-many-fraction-digits",
        cfield("v", "struct", optional=False, name=VSD, fields=VSD_JSON_FIELDS),
        {"scale": 19, "value": dec_b64(1)},
        VSD_AVRO,
        {"scale": 19, "value": dec_bytes(1)},
        r"^decimal overflow: 1E-19 cannot be represented exactly in decimal\(38,18\) \(column 'v'\)$",
    ),
    (
        "vsd-too-many-integer-digits",
        cfield("v", "struct", optional=False, name=VSD, fields=VSD_JSON_FIELDS),
        {"scale": 0, "value": dec_b64(10**20)},
        VSD_AVRO,
        {"scale": 0, "value": dec_bytes(10**20)},
        r"^decimal overflow: 100000000000000000000 cannot be represented exactly in decimal\(38,18\)"
        r" \(column 'v'\)$",
    ),
]


@pytest.mark.parametrize(
    ("case_id", "json_field", "json_value", "avro_type", "avro_value", "reason"),
    ERROR_CASES,
    ids=[c[0] for c in ERROR_CASES],
)
@pytest.mark.parametrize("wire", ["json", "avro"])
def test_semantic_errors(
    case_id: str,
    json_field: dict[str, Any],
    json_value: Any,
    avro_type: Any,
    avro_value: Any,
    reason: str,
    wire: str,
    registry: EmbeddedSchemaRegistry,
) -> None:
    case = Case(case_id, json_field, json_value, avro_type, avro_value, "", None)
    with pytest.raises(DecodeError, match=reason):
        decode_json(case) if wire == "json" else decode_avro(case, registry)


@pytest.mark.parametrize(
    ("base", "wire", "raw"),
    [
        ("string", "json", MARKER),
        ("bytes", "json", base64.b64encode(MARKER.encode()).decode()),
        ("bytes", "avro", MARKER.encode()),
        ("array", "json", [MARKER]),
        ("array", "avro", [MARKER.encode()]),
        ("array", "avro", list(MARKER.encode())),  # int[] placeholder: the marker's bytes as numbers
        ("map", "json", {MARKER: MARKER}),
    ],
)
def test_unchanged_toast_placeholders(base: str, wire: str, raw: Any) -> None:
    plan = field_plan("doc", base=base, semantic=None, params={}, nullable=True, wire=wire)  # type: ignore[arg-type]
    values, unavailable = convert_image({"doc": raw}, (plan,))
    assert values == {"doc": UNAVAILABLE}
    assert unavailable == frozenset({"doc"})


def test_placeholder_only_counts_in_text_like_columns() -> None:
    plan = field_plan("n", base="int64", semantic=None, params={}, nullable=True, wire="avro")
    assert plan.toast == ()


@pytest.mark.parametrize(
    ("semantic", "base", "params", "already_converted", "expected"),
    [
        # fastavro turns logical types into Python objects itself; those must pass unchanged.
        (
            DECIMAL,
            "bytes",
            {"scale": "2", "connect.decimal.precision": "6"},
            Decimal("12.3"),
            Decimal("12.30"),
        ),
        ("io.debezium.time.Date", "int32", {}, date(2020, 2, 29), date(2020, 2, 29)),
        ("org.apache.kafka.connect.data.Time", "int32", {}, time(1, 2, 3, 4000), 3_723_004_000),
        (
            "org.apache.kafka.connect.data.Timestamp",
            "int64",
            {},
            datetime(2020, 1, 1, 1, tzinfo=UTC),
            datetime(2020, 1, 1, 1, tzinfo=UTC),
        ),
        ("timestamp-micros", "int64", {}, 1, datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
        ("local-timestamp-millis", "int64", {}, 1, datetime(1970, 1, 1, 0, 0, 0, 1000)),
    ],
)
def test_converters_accept_fastavro_logical_values(
    semantic: str, base: str, params: dict[str, str], already_converted: Any, expected: Any
) -> None:
    plan = field_plan("v", base=base, semantic=semantic, params=params, nullable=True, wire="avro")
    assert plan.convert is not None
    value = plan.convert(already_converted)
    assert value == expected
    assert str(value) == str(expected)


def test_wide_source_precision_is_capped_at_38_and_checked() -> None:
    plan = field_plan(
        "v",
        base="bytes",
        semantic=DECIMAL,
        params={"scale": "2", "connect.decimal.precision": "60"},
        nullable=True,
        wire="avro",
    )
    assert plan.spec.type == "decimal(38,2)"
    assert convert_image({"v": dec_bytes(10**37)}, (plan,))[0] == {"v": Decimal(10**37).scaleb(-2)}
    with pytest.raises(
        DecodeError, match=r"^decimal overflow: .* does not fit decimal\(38,2\) \(column 'v'\)$"
    ):
        convert_image({"v": dec_bytes(10**38)}, (plan,))


def test_fit_decimal_never_rounds() -> None:
    assert str(fit_decimal(Decimal("1.5"), 5, 3)) == "1.500"
    with pytest.raises(ValueError, match="decimal overflow"):
        fit_decimal(Decimal("1.2345"), 10, 3)
    with pytest.raises(ValueError, match="decimal overflow"):
        fit_decimal(Decimal("NaN"), 10, 3)


@pytest.mark.parametrize(
    ("wire_value", "expected"),
    [(12.3, "12.30"), (7, "7.00"), (dec_b64(-5), "-0.05")],
)
def test_json_decimal_numeric_format_and_base64(wire_value: Any, expected: str) -> None:
    # decimal.format=NUMERIC sends a JSON number; the default (BASE64) the unscaled bytes.
    plan = field_plan(
        "v",
        base="bytes",
        semantic=DECIMAL,
        params={"scale": "2", "connect.decimal.precision": "6"},
        nullable=True,
        wire="json",
    )
    assert plan.convert is not None
    assert str(plan.convert(wire_value)) == expected
