"""The shop's row changes (SourceChanges): orders only ever reference live customers and products."""

from __future__ import annotations

import random
from collections import Counter

from harness.simulator.changes import SourceChanges
from harness.simulator.model import SourceDatabase, default_tables
from harness.simulator.rows import RowFactory
from harness.simulator.spec import WorkloadSpec

T0_US = 1_717_400_000_000_000


def _shop() -> SourceChanges:
    db = SourceDatabase(default_tables())
    return SourceChanges(WorkloadSpec(), db, random.Random(3), RowFactory(random.Random(4)),
                         {t: Counter[str]() for t in db.tables})


def test_a_referenced_customer_or_product_is_not_deleted_until_its_orders_are() -> None:
    shop = _shop()
    customer = shop.insert("customers", T0_US)
    product = shop.insert("products", T0_US)
    order = shop.insert("orders", T0_US)
    assert order.row is not None and (order.row["customer_id"],) == customer.key
    assert shop.delete("customers") is None and shop.delete("products") is None
    assert len(shop.db["customers"]) == len(shop.db["products"]) == 1

    deleted = shop.delete("orders")
    assert deleted is not None and deleted.key == order.key and deleted.op == "d"
    assert shop.delete("customers") is not None and shop.delete("products") is not None
    assert len(shop.db["customers"]) == len(shop.db["products"]) == 0
    assert customer.op == product.op == "c"


def test_an_update_of_an_empty_table_inserts_and_a_truncate_releases_every_reference() -> None:
    shop = _shop()
    first = shop.update("customers", T0_US)
    assert first.op == "c" and len(shop.db["customers"]) == 1
    shop.insert("products", T0_US)
    shop.insert("orders", T0_US)
    truncate = shop.truncate_orders()
    assert truncate.op == "t" and truncate.key is None and len(shop.db["orders"]) == 0
    assert shop.delete("customers") is not None  # no order refers to it any more


def test_ids_are_consecutive_per_table() -> None:
    shop = _shop()
    assert [shop.new_id("customers") for _ in range(3)] == [1, 2, 3]
    assert shop.new_id("orders") == 1
