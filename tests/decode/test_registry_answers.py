"""What the engine makes of a Confluent-compatible registry's "not found".

The registry's own 404 (with its error code, 40403 for a schema id) says the record names a schema
that is not there: the record's fault, so it goes to quarantine. A 404 without that code comes from a
URL that leads to no registry API -- Apicurio's root instead of its ``/apis/ccompat/v7``, a proxy's
wrong path -- and is the deployment's fault: it must stop the run, not send every record to
quarantine as "unknown schema id" (it did, and the run exited 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.decode.registry import ConfluentSchemaRegistry
from ingest.errors import RegistryUnavailableError, SchemaRegistryError
from tests.fake_registry import FakeRegistry

USER_INFO = "ingest:the-password"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[FakeRegistry]:
    fake = FakeRegistry(tmp_path, user="ingest", password="the-password")
    schema_id = fake.local.register("app.public.notes-value", {"type": "record", "name": "N", "fields": []})
    fake.publish()
    assert schema_id in fake.schemas
    yield fake
    fake.close()


def _client(url: str) -> ConfluentSchemaRegistry:
    return ConfluentSchemaRegistry({"url": url, "basic.auth.user.info": USER_INFO})


def test_a_schema_id_the_registry_does_not_have_is_the_records_fault(registry: FakeRegistry) -> None:
    client = _client(registry.url)
    assert client.get_schema(min(registry.schemas))["name"] == "N"
    with pytest.raises(SchemaRegistryError, match="schema id 999 is not in the registry") as raised:
        client.get_schema(999)
    assert not isinstance(raised.value, RegistryUnavailableError)
    assert client.newest_schema("app.public.gone-value") is None  # a subject not registered is an answer
    assert client.subject_schemas(["app.public.gone-value"]) == {}


def test_a_url_without_the_registry_api_stops_instead_of_blaming_the_records(registry: FakeRegistry) -> None:
    client = _client(f"{registry.url}/elsewhere")
    for ask in (lambda: client.get_schema(min(registry.schemas)),
                lambda: client.newest_schema("app.public.notes-value"),
                lambda: client.subject_schemas(["app.public.notes-value"])):
        with pytest.raises(RegistryUnavailableError) as raised:
            ask()
        message = str(raised.value)
        assert message.startswith(f"schema registry {registry.url}/elsewhere has no Confluent-compatible API: "
                                   "HTTP 404 for "), message
        assert "/apis/ccompat/v7" in message and "the-password" not in message
        assert raised.value.refused  # waiting does not mend it: a run's start stops on it
