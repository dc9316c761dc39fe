"""A seeded, deterministic SQL workload over the ``shop`` schema, in many transactions.

Phases (row counts scale with ``scale``):

1. catalog: products and customers, ten rows per transaction;
2. orders: one order with 1-4 items per transaction, plus status updates, customer updates that
   leave the TOASTed ``notes`` unchanged, and price updates;
3. ``ALTER TABLE ... ADD COLUMN`` (``customers.phone``, ``products.discontinued``);
4. mixed: the new columns filled in, cancellations, deletes (cascading to items), customer
   deletes (cascading to orders and items), quantity updates, new large notes, products added and
   deleted again;
5. widening ``ALTER COLUMN ... TYPE``: ``order_items.quantity`` integer -> bigint and
   ``orders.total`` numeric(12,2) -> numeric(14,2), then orders whose values need the wider types;
6. primary-key updates of customers (``ON UPDATE CASCADE`` rewrites their orders' ``customer_id``);
7. ``TRUNCATE order_items``, then new items for half of the orders;
8. closing updates, so the last WAL record is a captured change.

The same seed and scale give the same statements in the same order, so the source ends in the
same state every time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from harness.postgres import values as v
from harness.postgres.schema import DEFAULT_SCHEMA, TABLES, check_schema_name, qualified

Say = Callable[[str], None]
#: Primary-key updates move a customer id up by this much.
PK_SHIFT = 100_000
#: Order ids start above 2**32 so the bigint key is really needed.
FIRST_ORDER_ID = 5_000_000_000


@dataclass(frozen=True)
class WorkloadSpec:
    """What to run: ``seed`` fixes every value and choice, ``scale`` multiplies the row counts."""

    seed: int = 42
    scale: float = 1.0
    schema: str = DEFAULT_SCHEMA

    def n(self, base: int) -> int:
        """``base`` scaled, at least 1."""
        return max(1, round(base * self.scale))


@dataclass
class TableChanges:
    """Row changes PostgreSQL counted for one table (``pg_stat_user_tables``, cascades included)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    rows: int = 0


@dataclass
class WorkloadReport:
    """What the workload did."""

    transactions: int = 0
    statements: int = 0
    truncates: int = 0
    ddl: list[str] = field(default_factory=list)
    tables: dict[str, TableChanges] = field(default_factory=dict)
    seconds: float = 0.0
    end_lsn: str = ""

    @property
    def changes(self) -> int:
        """Row changes across all tables (inserts + updates + deletes; a TRUNCATE counts once)."""
        return sum(t.inserted + t.updated + t.deleted for t in self.tables.values()) + self.truncates


def run_workload(dsn: str, spec: WorkloadSpec = WorkloadSpec(), say: Say | None = None) -> WorkloadReport:
    """Run the workload on an existing, freshly reset schema (:func:`harness.postgres.schema.reset`).

    Args:
        dsn: libpq connection string of a role that may write the schema and run DDL.
        spec: seed, scale and schema.
        say: receives one progress line per phase and every 100 transactions.

    Returns:
        Transactions, statements, DDL run, per-table changes and final row counts, the WAL position
        after the last commit.
    """
    check_schema_name(spec.schema)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        work = _Workload(conn, spec, say or (lambda _line: None))
        work.run()
        report = work.report
        report.tables = table_changes(conn, spec.schema)
        report.end_lsn = str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])  # type: ignore[index]
    report.seconds = time.monotonic() - started
    return report


def table_changes(conn: psycopg.Connection, schema: str) -> dict[str, TableChanges]:
    """Inserted/updated/deleted rows since the tables were created, and their current row counts."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the flush happens at the end of a statement of this session
    time.sleep(0.05)
    out = {}
    for table in TABLES:
        row = conn.execute(
            "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
            (schema, table.name)).fetchone()
        count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(qualified(schema, table.name))).fetchone()
        ins, upd, dele = row if row else (0, 0, 0)
        out[table.name] = TableChanges(int(ins), int(upd), int(dele), int(count[0]) if count else 0)
    return out


class _Workload:
    """The workload's state: live keys and which schema changes have happened."""

    def __init__(self, conn: psycopg.Connection, spec: WorkloadSpec, say: Say) -> None:
        self.conn, self.spec, self.say = conn, spec, say
        self.rng = random.Random(spec.seed)
        self.report = WorkloadReport()
        self.customers: list[int] = []
        self.small_notes: set[int] = set()  # customers whose notes are not TOASTed
        self.products: dict[int, Decimal] = {}  # orderable product -> price
        self.orders: dict[int, int] = {}  # order id -> number of item lines
        self.status: dict[int, str] = {}
        self.next_customer = 1
        self.next_product = 1
        self.next_order = FIRST_ORDER_ID
        self.widened = False

    # -- SQL helpers --------------------------------------------------------------------------------

    def table(self, name: str) -> sql.Composed:
        return qualified(self.spec.schema, name)

    def execute(self, query: sql.SQL | sql.Composed | str, params: Any = None) -> int:
        cur = self.conn.execute(query if not isinstance(query, str) else query.encode(), params)
        self.report.statements += 1
        return cur.rowcount

    def insert(self, table: str, row: dict[str, Any]) -> None:
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            self.table(table), sql.SQL(", ").join(map(sql.Identifier, row)),
            sql.SQL(", ").join(sql.Placeholder() * len(row)))
        self.execute(query, list(row.values()))

    def update(self, table: str, key: dict[str, Any], values: dict[str, Any]) -> int:
        query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
            self.table(table),
            sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in values),
            sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in key))
        return self.execute(query, [*values.values(), *key.values()])

    def delete(self, table: str, key: dict[str, Any]) -> int:
        query = sql.SQL("DELETE FROM {} WHERE {}").format(
            self.table(table), sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in key))
        return self.execute(query, list(key.values()))

    def ddl(self, statement: str) -> None:
        text = statement.format(s=f'"{self.spec.schema}"')
        with self.conn.transaction():
            self.execute(text)
        self.report.transactions += 1
        self.report.ddl.append(text)
        self.say(f"  DDL: {text}")

    def transactions(self, label: str, count: int, body: Callable[[int], object]) -> None:
        for i in range(count):
            with self.conn.transaction():
                body(i)
            self.report.transactions += 1
            if (i + 1) % 100 == 0 or i + 1 == count:
                self.say(f"  {label}: {i + 1}/{count} transactions")

    # -- building blocks ----------------------------------------------------------------------------

    @staticmethod
    def several(step: Callable[[], object], count: int) -> None:
        """Run ``step`` ``count`` times."""
        for _ in range(count):
            step()

    def new_customer(self) -> None:
        cid = self.next_customer
        self.next_customer += 1
        row = v.customer_row(self.rng, cid)
        self.insert("customers", row)
        self.customers.append(cid)
        if row["notes"] is None or len(row["notes"]) < 2000:
            self.small_notes.add(cid)

    def new_product(self) -> int:
        pid = self.next_product
        self.next_product += 1
        row = v.product_row(self.rng, pid)
        self.insert("products", row)
        self.products[pid] = row["price"]
        return pid

    def new_order(self, *, huge: bool = False) -> None:
        if not self.customers or not self.products:
            return
        oid = self.next_order
        self.next_order += self.rng.randint(1, 3)
        self.insert("orders", v.order_row(self.rng, oid, self.rng.choice(self.customers)))
        self.orders[oid] = 0
        self.status[oid] = "new"
        total = self.add_items(oid, self.rng.randint(1, 4), huge=huge)
        self.update("orders", {"id": oid}, {"total": total})

    def add_items(self, oid: int, lines: int, *, huge: bool = False) -> Decimal:
        total = Decimal("0.00")
        for _ in range(lines):
            self.orders[oid] += 1
            pid = self.rng.choice(sorted(self.products))
            big = huge and self.rng.random() < 0.5
            price = Decimal(self.rng.randint(100, 1000)).scaleb(-2) if big else self.products[pid]
            row = v.item_row(self.rng, oid, self.orders[oid], pid, price, huge=big)
            self.insert("order_items", row)
            total += row["quantity"] * row["unit_price"]
        return total

    def advance_status(self) -> None:
        open_orders = [o for o in sorted(self.orders) if self.status[o] not in ("delivered", "cancelled")]
        if open_orders:
            oid = self.rng.choice(open_orders)
            self.status[oid] = v.STATUSES[v.STATUSES.index(self.status[oid]) + 1]
            self.update("orders", {"id": oid}, {"status": self.status[oid]})

    def touch_customer(self) -> None:
        """An update that leaves ``notes`` unchanged: Debezium sends its unchanged-TOAST placeholder."""
        cid = self.rng.choice(self.customers)
        self.update("customers", {"id": cid}, {"credit_limit": v.money(self.rng, negative=0.05),
                                               "preferences": v.json_doc(self.rng), "tags": v.tag_list(self.rng)})

    def reprice(self) -> None:
        pid = self.rng.choice(sorted(self.products))
        self.products[pid] = v.money(self.rng, 1, 999_999)
        self.update("products", {"id": pid},
                    {"price": self.products[pid], "updated_local": v.local_timestamp(self.rng)})

    def delete_order(self) -> None:
        if self.orders:
            oid = self.rng.choice(sorted(self.orders))
            self.delete("orders", {"id": oid})  # items go with it (ON DELETE CASCADE)
            del self.orders[oid], self.status[oid]

    def delete_customer(self) -> None:
        cid = self.rng.choice(self.customers)
        gone = [r[0] for r in self.conn.execute(
            sql.SQL("SELECT id FROM {} WHERE customer_id = %s").format(self.table("orders")), (cid,))]
        self.delete("customers", {"id": cid})  # orders and their items cascade
        self.customers.remove(cid)
        self.small_notes.discard(cid)
        for oid in gone:
            del self.orders[oid], self.status[oid]

    # -- phases -------------------------------------------------------------------------------------

    def run(self) -> None:
        n, rng = self.spec.n, self.rng
        self.say(f"workload: seed {self.spec.seed}, scale {self.spec.scale}, schema {self.spec.schema}")
        self.transactions("catalog: products", n(8), lambda _i: self.several(self.new_product, 10))
        self.transactions("catalog: customers", n(20), lambda _i: self.several(self.new_customer, 10))

        def order_txn(_i: int) -> None:
            self.new_order()
            if rng.random() < 0.3:
                self.advance_status()
            if rng.random() < 0.2:
                self.touch_customer()
            if rng.random() < 0.1:
                self.reprice()

        self.transactions("orders", n(300), order_txn)
        self.ddl("ALTER TABLE {s}.customers ADD COLUMN phone text")
        self.ddl("ALTER TABLE {s}.products ADD COLUMN discontinued boolean")
        self.transactions("mixed", n(200), self._mixed)
        self.ddl("ALTER TABLE {s}.order_items ALTER COLUMN quantity TYPE bigint")
        self.ddl("ALTER TABLE {s}.orders ALTER COLUMN total TYPE numeric(14,2)")
        self.widened = True
        self.transactions("orders after the widening", n(60), lambda _i: self.new_order(huge=True))
        toasted = [c for c in sorted(self.customers) if c not in self.small_notes]
        movable = sorted(self.small_notes)[: n(3)] + toasted[: n(5)]
        self.transactions("primary-key updates", len(movable), lambda i: self._move_customer(movable[i], i))
        with self.conn.transaction():
            self.execute(sql.SQL("TRUNCATE {}").format(self.table("order_items")))
        self.report.transactions += 1
        self.report.truncates += 1
        self.say("  TRUNCATE order_items")
        for oid in self.orders:
            self.orders[oid] = 0
        refill = sorted(self.orders)[::2]
        self.transactions("items after the truncate", len(refill), lambda i: self._refill(refill[i]))
        self.transactions("closing updates", n(20), self._closing)

    def _mixed(self, _i: int) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            self.update("customers", {"id": rng.choice(self.customers)},
                        {"phone": rng.choice(("+49 30 1234567", "", "+1 (555) 010-999", None))})
        elif roll < 0.35:
            self.update("products", {"id": rng.choice(sorted(self.products))}, {"discontinued": rng.random() < 0.5})
        elif roll < 0.5:
            self.advance_status()
        elif roll < 0.58 and self.orders:
            oid = rng.choice(sorted(self.orders))
            self.status[oid] = "cancelled"
            self.update("orders", {"id": oid}, {"status": "cancelled", "coupon_code": None})
        elif roll < 0.66:
            self.delete_order()
        elif roll < 0.69 and len(self.customers) > 10:
            self.delete_customer()
        elif roll < 0.79 and self.orders:
            oid = rng.choice([o for o in sorted(self.orders) if self.orders[o]] or [0])
            if oid:
                self.update("order_items", {"order_id": oid, "line_no": rng.randint(1, self.orders[oid])},
                            {"quantity": rng.randint(1, 50)})
        elif roll < 0.84:
            cid = rng.choice(self.customers)
            self.update("customers", {"id": cid}, {"notes": v.large_text(rng)})
            self.small_notes.discard(cid)
        elif roll < 0.88:
            pid = self.new_product()
            if rng.random() < 0.5:  # never ordered: may go again
                self.delete("products", {"id": pid})
                del self.products[pid]
        else:
            self.new_order()

    def _closing(self, _i: int) -> None:
        self.advance_status()
        self.touch_customer()

    def _move_customer(self, cid: int, i: int) -> None:
        """A primary-key update; ``ON UPDATE CASCADE`` rewrites the customer's orders.

        Most moved customers have TOASTed ``notes``, which the update leaves unchanged: Debezium
        sends the new key's row with the unchanged-TOAST placeholder, and the engine takes the value
        from the old key's row (docs/architecture.md#primary-key-moves). Every other move also
        changes ``credit_limit``, every third is followed in the same transaction by an update that
        leaves ``notes`` unchanged again, and every fourth moves the customer a second time.
        """
        changes: dict[str, Any] = {"id": cid + PK_SHIFT}
        if i % 2:
            changes["credit_limit"] = v.money(self.rng, negative=0.05)
        self.update("customers", {"id": cid}, changes)
        moved = cid + PK_SHIFT
        if i % 3 == 0:
            self.update("customers", {"id": moved}, {"tags": v.tag_list(self.rng)})
        if i % 4 == 0:
            self.update("customers", {"id": moved}, {"id": moved + PK_SHIFT})
            moved += PK_SHIFT
        self.customers[self.customers.index(cid)] = moved
        self.small_notes.discard(cid)

    def _refill(self, oid: int) -> None:
        total = self.add_items(oid, self.rng.randint(1, 3), huge=self.rng.random() < 0.2)
        self.update("orders", {"id": oid}, {"total": total})
