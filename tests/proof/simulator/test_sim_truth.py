"""The truth on disk: Parquet per table plus truth.json, with the target tables' Arrow types."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from harness.simulator import Truth
from harness.simulator.model import LOYALTY_TIER, TableDef, TableState, default_tables

EXPECTED_TYPES = {
    "customers": {
        "id": pa.int32(),
        "segment": pa.string(),
        "birth_date": pa.date32(),
        "balance": pa.decimal128(12, 2),
        "created_at": pa.timestamp("us"),
        "updated_at": pa.timestamp("us", tz="UTC"),
        "profile": pa.string(),
        "loyalty_tier": pa.string(),
    },
    "products": {"price": pa.decimal128(10, 2), "weight_kg": pa.decimal128(38, 18), "in_stock": pa.bool_()},
    "orders": {
        "id": pa.int64(),
        "quantity": pa.int16(),
        "amount": pa.decimal128(12, 2),
        "ship_date": pa.date32(),
    },
}


def test_saved_truth_loads_back_identically(sim_avro: SimpleNamespace) -> None:
    loaded = Truth.load(sim_avro.root / "truth")
    assert loaded.key_columns == {"customers": ("id",), "products": ("id",), "orders": ("id",)}
    assert loaded.topics == {t: f"demo.public.{t}" for t in ("customers", "products", "orders")}
    assert loaded.counts == sim_avro.truth.counts
    for name, table in sim_avro.truth.tables.items():
        assert loaded.tables[name].equals(table), name
    assert loaded.meta["spec"]["events"] == sim_avro.spec.events
    doc = json.loads((sim_avro.root / "truth" / "truth.json").read_text())
    assert set(doc["counts"]["customers"]) >= {
        "reads",
        "creates",
        "updates",
        "deletes",
        "truncates",
        "duplicates",
        "malformed",
        "toast_placeholders",
    }
    assert loaded.table_for_topic("demo.public.orders") == "orders"


@pytest.mark.parametrize("table", sorted(EXPECTED_TYPES))
def test_truth_has_target_arrow_types(sim_avro: SimpleNamespace, table: str) -> None:
    schema = Truth.load(sim_avro.root / "truth").tables[table].schema
    for column, expected in EXPECTED_TYPES[table].items():
        assert schema.field(column).type == expected, column


def test_truth_rows_are_in_key_order_and_unique(sim_avro: SimpleNamespace) -> None:
    for table in sim_avro.truth.tables.values():
        ids = table.column("id").to_pylist()
        assert ids == sorted(set(ids))


def test_load_of_a_missing_truth_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Truth.load(tmp_path / "nothing-here")


def test_table_state_keeps_random_choice_consistent() -> None:
    import random

    state = TableState(default_tables()["products"])
    for i in range(1, 6):
        state.insert({"id": i})
    state.delete((2,))
    state.delete((5,))
    rng = random.Random(0)
    assert {state.random_key(rng) for _ in range(200)} == {(1,), (3,), (4,)}
    with pytest.raises(KeyError):
        state.insert({"id": 3})
    assert state.truncate() == 3 and state.random_key(rng) is None


def test_added_column_must_be_nullable_and_fills_null() -> None:
    customers = default_tables()["customers"]
    with pytest.raises(ValueError, match="nullable"):
        customers.with_column(LOYALTY_TIER.__class__("x", "string", nullable=False))
    assert customers.with_column(LOYALTY_TIER).version == customers.version + 1
    state = TableState(TableDef("t", (customers.column("id"),), ("id",)))
    state.insert({"id": 1})
    state.add_column(LOYALTY_TIER)
    assert state.to_arrow().to_pylist() == [{"id": 1, "loyalty_tier": None}]


def test_key_only_before_image_uses_debezium_fallbacks() -> None:
    products = default_tables()["products"]
    row = {
        "id": 4,
        "sku": "S",
        "name": "N",
        "category": "toys",
        "price": None,
        "weight_kg": None,
        "in_stock": True,
        "created_at": None,
    }
    image = products.key_only_image(row)
    assert image["id"] == 4 and image["sku"] == "" and image["in_stock"] is False
    assert image["weight_kg"] is None and str(image["price"]) == "0.00"
