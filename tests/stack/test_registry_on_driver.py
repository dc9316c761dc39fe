"""The executors decode Avro without the registry's credentials: the driver fetches the schemas.

On a cluster the executors often have neither a route to the registry nor its credentials, and a
credential exported after the Spark session started never reaches the local Python workers. The
test makes that explicit: the credential is put under a name only the driver's environment has,
set after Spark started, and the run must still decode every change: with Spark's Kafka source
(the driver hands the executors the schemas with every batch), with the engine's own reader (the
driver hands them over when the stream starts), and with that reader when the driver could not
list the schemas then (its workers find the registry refusing them, and the driver decodes those
batches itself). A run that applies its backlog on the driver (``source.driver_seconds``) reads the
broker and the registry from the driver only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.decode.registry import ConfluentSchemaRegistry
from ingest.errors import RegistryUnavailableError
from ingest.lake.delta import open_table, read_all
from ingest.stream.runner import Runner
from ingest.verify.capture import delete_topics, wait_for_capture
from tests.stack.helpers import PREFIX, stack_config

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "regprobe"
DRIVER_ONLY = "INGEST_TEST_DRIVER_ONLY_REGISTRY_AUTH"


@pytest.mark.parametrize(("reader", "listing_fails", "driver_seconds"),
                         [("spark", False, 0), ("python", False, 0), ("python", True, 0), ("python", False, 120)],
                         ids=["spark", "python", "python-driver-fallback", "python-run-on-the-driver"])
def test_avro_decodes_with_credentials_only_the_driver_has(
        pg_dsn: str, stack: Any, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, reader: str, listing_fails: bool, driver_seconds: float) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        delete_topics(stack.bootstrap_servers(), [f"{PREFIX['avro']}.{SCHEMA}.item"])
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"CREATE TABLE {SCHEMA}.item (id integer PRIMARY KEY, name text, price numeric(8,2))")
        conn.execute(f"INSERT INTO {SCHEMA}.item SELECT g, 'n' || g, g * 1.25 FROM generate_series(1, 50) g")
        conn.execute(f"UPDATE {SCHEMA}.item SET price = price + 1 WHERE id <= 10")
        conn.execute(f"DELETE FROM {SCHEMA}.item WHERE id > 45")
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok

    config = stack_config("avro", tmp_path, schema=SCHEMA, tables=["item"])
    registry = config.source.registry.model_copy(update={"credentials_env": DRIVER_ONLY})
    assert config.source.kafka is not None
    kafka = config.source.kafka.model_copy(update={"reader": reader})
    config = config.model_copy(update={"source": config.source.model_copy(update={
        "registry": registry, "kafka": kafka, "driver_seconds": driver_seconds})})
    # Only the driver sees it: the Spark session (and its workers' environment) already exists.
    monkeypatch.setenv(DRIVER_ONLY, os.environ["SCHEMA_REGISTRY_USER_INFO"])
    if listing_fails:  # the driver cannot list the subjects (fetching a schema by id still works)
        def refuse(self: Any, subjects: Any) -> dict[int, str]:
            raise RegistryUnavailableError("listing refused by the test")

        monkeypatch.setattr(ConfluentSchemaRegistry, "subject_schemas", refuse)

    with caplog.at_level(logging.WARNING, logger="ingest.stream.callback"):
        report = Runner(config, spark=spark).run()

    assert not report.failed, {n: t.error for n, t in report.tables.items()}
    assert report.on_driver == bool(driver_seconds)  # read from the broker and decoded without Spark
    table = open_table(config.table_path("item"))
    assert table is not None
    rows = read_all(table).to_pylist()
    with psycopg.connect(pg_dsn) as conn:
        truth = conn.execute(f"SELECT id, name, price FROM {SCHEMA}.item ORDER BY id").fetchall()
    assert sorted((r["id"], r["name"], r["price"]) for r in rows) == truth
    fell_back = "the workers could not read the schema registry" in caplog.text
    assert fell_back == listing_fails
