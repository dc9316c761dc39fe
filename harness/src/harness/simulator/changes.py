"""The source database's row changes, applied at once in commit order: the simulator's model of the shop's writes.

Each method changes :class:`~harness.simulator.model.SourceDatabase` the way the shop's
application would, and returns the :class:`~harness.simulator.wal.Change` that PostgreSQL
would log for it (before image as the table's replica identity gives it, TOAST placeholders for
unchanged large values, now and then a value the demo's expectations reject). Orders only ever
reference live customers and products, so a customer or product still referenced is not deleted.
"""

from __future__ import annotations

import random
from collections import Counter

from harness.simulator.model import Key, Row, SourceDatabase
from harness.simulator.rows import QUALITY_VIOLATIONS, TOAST_THRESHOLD, RowFactory, violate
from harness.simulator.spec import WorkloadSpec
from harness.simulator.wal import Change
from harness.simulator.wire import UNAVAILABLE_VALUE


class SourceChanges:
    """Makes the shop's row changes on ``db`` and counts what they need counted (``counts``)."""

    def __init__(self, spec: WorkloadSpec, db: SourceDatabase, rng: random.Random, rows: RowFactory,
                 counts: dict[str, Counter[str]]) -> None:
        self.spec = spec
        self.db = db
        self.rng = rng  # the workload's own generator: one seeded sequence for the whole run
        self.rows = rows
        self.counts = counts
        #: how many orders reference each customer and product
        self.refs: dict[str, Counter[Key]] = {"customers": Counter(), "products": Counter()}
        self.next_id = dict.fromkeys(db.tables, 1)
        #: customers has gained ``loyalty_tier`` (new customers and updates fill it)
        self.altered = False
        # Error diffusion, like malformed messages: fraction * changes violations, evenly spread.
        self.violation_due = 0.0

    def new_id(self, table: str) -> int:
        self.next_id[table] += 1
        return self.next_id[table] - 1

    def add_order(self, ordered_us: int, *, settled: bool) -> Row:
        state = self.db["orders"]
        customer = self.db["customers"].random_key(self.rng)
        product = self.db["products"].random_key(self.rng)
        assert customer is not None and product is not None
        row = self.rows.order(self.new_id("orders"), customer[0], self.db["products"].rows[product],
                              ordered_us, settled=settled)
        state.insert(row)
        self.refs["customers"][customer] += 1
        self.refs["products"][product] += 1
        return row

    def insert(self, table: str, now_us: int) -> Change:
        if table == "orders" and len(self.db["customers"]) and len(self.db["products"]):
            row = self.add_order(now_us, settled=False)
        elif table == "products":
            row = self.rows.product(self.new_id("products"), now_us)
            self.db["products"].insert(row)
        elif table.startswith("ledger_"):
            row = self.rows.ledger(self.new_id(table), now_us)
            self.db[table].insert(row)
        else:
            table = "customers"
            row = self.rows.customer(self.new_id("customers"), now_us, now_us, loyalty=self.altered)
            self.db["customers"].insert(row)
        self._violate(table, row)  # in place: the row the source table now holds
        return Change(table, "c", self.db[table].key_of(row), None, row, row)

    def update(self, table: str, now_us: int, key: Key | None = None) -> Change:
        state = self.db[table]
        key = key or state.random_key(self.rng)
        if key is None:
            return self.insert(table, now_us)
        old = state.rows[key]
        if table == "customers":
            new = self.rows.update_customer(old, now_us, loyalty=self.altered)
        elif table == "products":
            new = self.rows.update_product(old)
        elif table.startswith("ledger_"):
            new = self.rows.update_ledger(old, now_us)
        else:
            new = self.rows.update_order(old, now_us)
        state.replace(key, self._violate(table, new))
        sent = new
        notes = old.get("notes")
        if (table == "customers" and notes is not None and new["notes"] == notes
                and len(notes) >= TOAST_THRESHOLD and self.rng.random() < self.spec.toast_fraction):
            sent = {**new, "notes": UNAVAILABLE_VALUE}
            self.counts[table]["toast_placeholders"] += 1
        # REPLICA IDENTITY DEFAULT logs no old row for an update that keeps the key.
        before = old if state.definition.replica_identity == "full" else None
        return Change(table, "u", key, before, sent, new)

    def _violate(self, table: str, row: Row) -> Row:
        """Now and then write a value the table's suite rejects (in place; the source holds it)."""
        if not self.spec.quality_violation_fraction or table not in QUALITY_VIOLATIONS:
            return row  # the extra tables have no suite
        self.violation_due += self.spec.quality_violation_fraction
        if self.violation_due < 1.0:
            return row
        self.violation_due -= 1.0
        counts = self.counts[table]
        kinds = QUALITY_VIOLATIONS[table]
        kind = kinds[counts["quality_violations"] % len(kinds)]
        violate(row, kind)
        counts["quality_violations"] += 1
        counts[f"violation_{kind}"] += 1
        return row

    def delete(self, table: str) -> Change | None:
        state = self.db[table]
        for _ in range(8):
            key = state.random_key(self.rng)
            if key is None:
                return None
            if table not in self.refs or not self.refs[table][key]:
                break
        else:
            return None  # every candidate is still referenced by an order
        old = state.delete(key)
        if table == "orders":
            self.refs["customers"][(old["customer_id"],)] -= 1
            self.refs["products"][(old["product_id"],)] -= 1
        definition = state.definition
        before = old if definition.replica_identity == "full" else definition.key_only_image(old)
        return Change(table, "d", key, before, None, old)

    def truncate_orders(self) -> Change:
        self.db["orders"].truncate()
        for refs in self.refs.values():
            refs.clear()
        return Change("orders", "t", None, None, None, None)
