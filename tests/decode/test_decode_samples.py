"""Real Debezium events (../shared/debezium-samples) decode, read in place and never copied here.

Most samples are AsciiDoc extracts with documentation shorthand (``"schema": { ... }``, trailing
commas, ``{context}`` placeholders, two objects back to back); :func:`documents` undoes exactly that
shorthand so the payloads underneath are decoded as Debezium sent them.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import fastavro
import pytest

from ingest.decode import MessageDecoder
from ingest.decode.jsonconv import JsonCodec
from ingest.decode.registry import EmbeddedSchemaRegistry, frame
from ingest.errors import DecodeError
from ingest.model import ChangeEvent, ColumnSpec, ControlRecord, KafkaCoordinates, SourcePosition

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "debezium-samples"
pytestmark = pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"Debezium samples not present at {SAMPLES}")

COORDS = KafkaCoordinates(topic="samples", partition=0, offset=17)
KAFKA = SourcePosition.kafka(0, 17)
ID = ("id",)

# file -> (key_columns, expected events or control records, one per JSON document in the file)
EXPECTED: dict[str, tuple[tuple[str, ...] | None, list[dict[str, Any] | ControlRecord]]] = {
    "postgres-create.json": (
        ID,
        [
            {
                "op": "c",
                "key": {"id": 1},
                "snapshot": "true",
                "source_ts_ms": 1559033904863,
                "position": SourcePosition(24023119, 24023128, 0, 1),
            }
        ],
    ),
    "postgres-create-real-2.1.4.json": (
        ID,
        [
            {
                "op": "c",
                "key": {"id": 1005},
                "snapshot": "false",
                "position": SourcePosition(34442256, 34466480, 0, 1),
            }
        ],
    ),
    "postgres-update.json": (
        ID,
        [{"op": "u", "key": {"id": 1}, "position": SourcePosition(24023128, 24023128, 0, 1)}],
    ),
    "postgres-delete.json": (
        ID,
        [{"op": "d", "key": {"id": 1}, "after": None, "position": SourcePosition(46523128, 46523128, 0, 1)}],
    ),
    "postgres-truncate.json": (None, [{"op": "t", "key": {}, "position": SourcePosition(46523128, 46523128, 0, 1)}]),
    "postgres-message-transactional.json": (None, [ControlRecord("message", "foo")]),
    "postgres-transaction-boundary-events.json": (
        None,
        [
            ControlRecord("transaction", "BEGIN 571:53195829"),
            ControlRecord("transaction", "END 571:53195832"),
        ],
    ),
    "postgres-create-with-transaction-block.json": (
        ("pk",),
        [{"op": "c", "key": {"pk": "2"}, "position": KAFKA, "source_ts_ms": 1580390884335}],
    ),
    "mysql-create.json": (
        ID,
        [{"op": "c", "key": {"id": 1004}, "snapshot": "false", "position": SourcePosition(3, 154, 0, 1)}],
    ),
    "mysql-update.json": (ID, [{"op": "u", "key": {"id": 1004}, "position": SourcePosition(3, 484, 0, 1)}]),
    "mysql-delete.json": (ID, [{"op": "d", "key": {"id": 1004}, "position": SourcePosition(3, 805, 0, 1)}]),
    "mysql-truncate.json": (None, [{"op": "t", "key": {}, "position": SourcePosition(3, 484, 0, 1)}]),
    "mysql-schema-change-value.json": (
        None,
        [
            ControlRecord(
                "schema_change", "ALTER TABLE customers ADD middle_name varchar(255) AFTER first_name"
            )
        ],
    ),
    "mysql-transaction-boundary-events.json": (
        None,
        [
            ControlRecord("transaction", "BEGIN 0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"),
            ControlRecord("transaction", "END 0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"),
        ],
    ),
    "mysql-tutorial-read-snapshot-value.json": (
        ID,
        [{"op": "r", "key": {"id": 1004}, "snapshot": "true", "position": SourcePosition(3, 154, 0, 0)}],
    ),
    "mysql-tutorial-update-value.json": (
        ID,
        [{"op": "u", "snapshot": None, "position": SourcePosition(3, 364, 0, 1)}],
    ),
    "mysql-tutorial-delete-value.json": (ID, [{"op": "d", "position": SourcePosition(3, 725, 0, 1)}]),
    "mysql-tutorial-tombstone-value.json": (None, [ControlRecord("tombstone", key_error=(
        "key: the message has no Kafka key, and its table has no primary_key configured"))]),
    "mysql-fixture-serde-with-schema.json": (ID, [{"op": "c", "position": SourcePosition(3, 154, 0, 1)}]),
    "mysql-fixture-serde-update.json": (
        ID,
        [{"op": "u", "key": {"id": 1004}, "position": SourcePosition(3, 154, 0, 1)}],
    ),
    "mysql-read-snapshot-real-3.0.1.json": (
        ID,
        [
            {
                "op": "r",
                "snapshot": "true",
                "source_ts_ms": 1731327511000,
                "position": SourcePosition(3, 797, 0, 0),
            }
        ],
    ),
    "mysql-update-real-3.0.1.json": (
        ID,
        [{"op": "u", "key": {"id": 1001}, "snapshot": "false", "position": SourcePosition(3, 1041, 0, 1)}],
    ),
    "generic-incremental-snapshot-read.json": (
        ("pk",),
        [{"op": "r", "key": {"pk": "1"}, "snapshot": "incremental", "position": KAFKA}],
    ),
}


def documents(path: Path) -> list[bytes]:
    """The JSON documents of a sample, with the AsciiDoc shorthand undone."""
    text = path.read_text()
    text = text.replace("{debezium-version}", "3.0.0.Final").replace("{context}", "mysql")
    text = re.sub(r"\{\s*(?:\.\.\.|<omitted>)?\s*\}", "null", text)  # "schema": { ... } and friends
    text = re.sub(r"^\s*\.\.\.\s*\n", "", text, flags=re.MULTILINE)  # elided lines inside an object
    text = re.sub(r",(\s*[}\]])", r"\1", text)  # trailing commas
    text = re.sub(r'"[ \t]*\n(\s*)"', '",\n\\1"', text)  # a missing comma between two lines
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        _, end = decoder.raw_decode(text, at)
        out.append(text[at:end].encode())
        at = end
    return out


def value_files() -> list[Path]:
    return (
        sorted(p for p in SAMPLES.glob("*.json") if not p.name.endswith("-key.json"))
        if SAMPLES.is_dir()
        else []
    )


@pytest.mark.parametrize("path", value_files(), ids=lambda p: p.name)
def test_sample_value_decodes(path: Path) -> None:
    key_columns, expected = EXPECTED.get(path.name, (ID, None))
    decoder = MessageDecoder(value_format="json", registry=None, key_columns=key_columns)
    results = [decoder.decode(None, doc, COORDS) for doc in documents(path)]
    if expected is None:  # a sample added later: it must still decode
        assert all(isinstance(r, ChangeEvent | ControlRecord) for r in results)
        return
    assert len(results) == len(expected)
    for result, want in zip(results, expected, strict=True):
        if isinstance(want, ControlRecord):
            assert result == want
            continue
        assert isinstance(result, ChangeEvent)
        for field, value in want.items():
            assert getattr(result, field) == value, field


def test_sample_tombstone_carries_its_key() -> None:
    [key] = documents(SAMPLES / "mysql-tutorial-tombstone-key.json")
    [value] = documents(SAMPLES / "mysql-tutorial-tombstone-value.json")
    decoder = MessageDecoder(value_format="json", registry=None)
    assert decoder.decode(key, value, COORDS) == ControlRecord(
        "tombstone", key={"id": 1004}, key_columns=("id",))


def test_sample_with_schema_has_typed_columns() -> None:
    [doc] = documents(SAMPLES / "postgres-create.json")
    event = MessageDecoder(value_format="json", registry=None, key_columns=ID).decode(None, doc, COORDS)
    assert isinstance(event, ChangeEvent)
    assert event.columns == (
        ColumnSpec("id", "integer", False),
        ColumnSpec("first_name", "string", False),
        ColumnSpec("last_name", "string", False),
        ColumnSpec("email", "string", False),
    )
    assert event.after == {
        "id": 1,
        "first_name": "Anne",
        "last_name": "Kretchmar",
        "email": "annek@noanswer.org",
    }
    assert event.schema_ref is not None and event.schema_ref.startswith("json:")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mysql-key.json", {"id": 1001}),
        ("mysql-tutorial-read-snapshot-key.json", {"id": 1004}),
        ("mysql-tutorial-tombstone-key.json", {"id": 1004}),
        ("mysql-schema-change-key.json", {"databaseName": "inventory"}),
    ],
)
def test_sample_keys(name: str, expected: dict[str, Any]) -> None:
    [doc] = documents(SAMPLES / name)
    assert JsonCodec().read_key(doc) == expected


def test_sample_key_as_kafka_key() -> None:
    [key] = documents(SAMPLES / "mysql-tutorial-read-snapshot-key.json")
    [value] = documents(SAMPLES / "mysql-tutorial-read-snapshot-value.json")
    event = MessageDecoder(value_format="json", registry=None).decode(key, value, COORDS)
    assert isinstance(event, ChangeEvent)
    assert (event.key, event.key_columns) == ({"id": 1004}, ("id",))


def test_postgres_doc_key_is_not_jsonconverter_output() -> None:
    # The PostgreSQL page shows the key schema in Connect's internal layout ("name"/"index"/"schema"),
    # which JsonConverter never writes: it must be refused with a clear reason, not crash.
    [doc] = documents(SAMPLES / "postgres-key.json")
    with pytest.raises(DecodeError, match=r"^key: json: key schema has a field without a 'field' name"):
        JsonCodec().read_key(doc)


def test_third_party_avro_envelope_schema(tmp_path: Path) -> None:
    schema = json.loads((SAMPLES / "third-party-risingwave-mysql-envelope.avsc").read_text())
    registry = EmbeddedSchemaRegistry(tmp_path)
    schema_id = registry.register("inventory.customers-value", schema)
    row = {"id": 31, "first_name": "Kai", "last_name": "Lund", "email": "kai@example.net"}
    record = {
        "before": None,
        "after": row,
        "op": "c",
        "ts_ms": 1_700_000_000_500,
        "transaction": None,
        "source": {
            "version": "1.9.7.Final",
            "connector": "mysql",
            "name": "dbserver1",
            "ts_ms": 1_700_000_000_000,
            "snapshot": "false",
            "db": "inventory",
            "sequence": None,
            "table": "customers",
            "server_id": 1,
            "gtid": None,
            "file": "mysql-bin.000005",
            "pos": 77,
            "row": 1,
            "thread": 8,
            "query": None,
        },
    }
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    event = MessageDecoder(value_format="avro", registry=registry, key_columns=ID).decode(
        None, frame(schema_id, buffer.getvalue()), COORDS
    )
    assert isinstance(event, ChangeEvent)
    assert (event.op, event.key, event.after) == ("c", {"id": 31}, row)
    assert event.position == SourcePosition(5, 77, 1, 1)
    assert event.columns[0] == ColumnSpec("id", "integer", False)
    assert event.schema_ref == f"avro:{schema_id}"
