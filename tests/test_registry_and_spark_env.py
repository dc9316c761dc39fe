import pytest

from ingest.decode.registry import EmbeddedSchemaRegistry, frame, unframe
from ingest.errors import DecodeError, EnvironmentProblem, SchemaRegistryError
from ingest.spark.java import check_java

SCHEMA = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "int"}]}


def test_registration_is_idempotent_per_subject_and_ids_grow(tmp_path):
    reg = EmbeddedSchemaRegistry(tmp_path)
    first = reg.register("t-key", SCHEMA)
    assert reg.register("t-key", SCHEMA) == first
    other = reg.register("t-key", {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "x", "type": "string"}]})
    assert other == first + 1
    assert reg.get_schema(first) == SCHEMA and reg.subjects() == {"t-key": [first, other]}


def test_unknown_id_and_invalid_schema(tmp_path):
    reg = EmbeddedSchemaRegistry(tmp_path)
    with pytest.raises(SchemaRegistryError, match="schema id 7"):
        reg.get_schema(7)
    with pytest.raises(SchemaRegistryError, match="not a valid Avro schema"):
        reg.register("s", {"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]})


def test_confluent_framing_round_trip_and_errors():
    schema_id, payload = unframe(frame(513, b"\x02abc"))
    assert schema_id == 513 and bytes(payload) == b"\x02abc"
    assert frame(1, b"")[:5] == b"\x00\x00\x00\x00\x01"
    with pytest.raises(DecodeError, match="magic byte is 0x01"):
        unframe(b"\x01\x00\x00\x00\x01")
    with pytest.raises(DecodeError, match="shorter than the 5-byte header"):
        unframe(b"\x00\x00")


def test_missing_java_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(EnvironmentProblem, match="Java 17 is required"):
        check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvironmentProblem, match="apt-get install openjdk-17"):
        check_java()


def test_prefetched_schemas_need_no_registry_and_a_miss_asks_the_fallback(tmp_path):
    import json

    from ingest.decode.registry import PrefetchedSchemaRegistry

    embedded = EmbeddedSchemaRegistry(tmp_path)
    other = embedded.register("elsewhere-value", {"type": "record", "name": "B", "fields": []})
    calls = []

    def fallback():
        calls.append(1)
        return embedded

    schema = {"type": "record", "name": "A", "fields": [{"name": "id", "type": "int"}]}
    registry = PrefetchedSchemaRegistry([(7, json.dumps(schema))], fallback)
    assert registry.get_schema(7) == schema and registry.get_schema(7) == schema
    assert calls == []  # a prefetched id never creates the worker's own client
    assert registry.get_schema(other)["name"] == "B" and calls == [1]
    with pytest.raises(SchemaRegistryError, match="not in the registry"):
        PrefetchedSchemaRegistry([], None).get_schema(99)
