"""Pieces of the proofs that need no database: config, workdir safety, values, verify's normalizers."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from harness.postgres import values as pg_values
from harness.stack_proofs.demo import remove_workdir, schema_of

from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError, IngestError
from ingest.verify.compare import verify_table
from ingest.verify.source_db import source_table_of
from ingest.verify.source_values import parse_json


def test_source_table_defaults_to_the_topic_name() -> None:
    assert source_table_of(TableSpec(name="orders", topic="pgavro.shop.orders")) == ("shop", "orders")
    spec = TableSpec(name="orders", topic="cdc.orders", source_table="sales.orders_v2")
    assert source_table_of(spec) == ("sales", "orders_v2")
    with pytest.raises(ConfigError, match="source_table"):
        source_table_of(TableSpec(name="orders", topic="cdc.orders"))


def test_source_table_must_be_schema_dot_table() -> None:
    with pytest.raises(ValueError, match="schema"):
        TableSpec(name="t", topic="a.b.c", source_table="no_schema")
    with pytest.raises(ValueError, match="schema"):
        TableSpec(name="t", topic="a.b.c", source_table="x.y.z")


def test_demo_needs_one_source_schema() -> None:
    one = IngestConfig(tables=(TableSpec(name="a", topic="p.shop.a"), TableSpec(name="b", topic="p.shop.b")))
    assert schema_of([one]) == "shop"
    two = IngestConfig(tables=(TableSpec(name="a", topic="p.shop.a"), TableSpec(name="b", topic="p.other.b")))
    with pytest.raises(IngestError, match="one source schema"):
        schema_of([two])


def test_remove_workdir_removes_only_engine_workdirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "stack-work" / "avro"
    (work / "tables" / "t").mkdir(parents=True)
    (work / "checkpoints").mkdir()
    assert remove_workdir(work) and not work.exists()
    assert not remove_workdir(work)
    (work / "tables").mkdir(parents=True)
    (work / "my-notes.txt").write_text("keep me")
    with pytest.raises(IngestError, match=r"my-notes\.txt"):
        remove_workdir(work)
    assert (work / "my-notes.txt").exists()
    with pytest.raises(IngestError, match="current directory"):
        remove_workdir(tmp_path)


def test_values_are_deterministic_and_awkward() -> None:
    first = pg_values.customer_row(random.Random(1), 7)
    assert first == pg_values.customer_row(random.Random(1), 7)
    assert first != pg_values.customer_row(random.Random(2), 7)
    big = pg_values.large_text(random.Random(3))
    assert len(big) >= pg_values.LARGE_TEXT_CHARS[0]
    assert pg_values.json_text({"a": pg_values.Decimal("2.50")}) == '{"a": 2.50}'


def test_verify_normalizers_compare_json_parsed(tmp_path: Path) -> None:
    expected = pa.table({"id": pa.array([1, 2], pa.int32()),
                         "doc": pa.array(['{"a": 1, "b": [2.50]}', '{"a": 1}'])})
    actual = pa.table({"id": pa.array([1, 2], pa.int32()), "doc": pa.array(['{"b":[2.5],"a":1}', '{"a": 2}'])})
    write_deltalake(str(tmp_path / "t"), actual)
    result = verify_table("t", tmp_path / "t", expected, ("id",), normalizers={"doc": parse_json})
    assert (result.missing, result.unexpected, result.different) == (0, 0, 1)
    assert "(id=2)" in result.examples[0]
    plain = verify_table("t", tmp_path / "t", expected, ("id",))
    assert plain.different == 2  # as text, key order and number formatting differ too
