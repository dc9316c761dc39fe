"""A seeded, deterministic SQL workload over a ``shop`` database on MariaDB, in many transactions.

Tables: ``customers`` (unsigned INT key, utf8mb4 names with 4-byte characters, ENUM, SET, BOOLEAN,
TINYINT(1), DATE, YEAR, JSON, BLOB, TIMESTAMP(6)), ``orders`` (unsigned BIGINT keys above 2^63,
DECIMAL, ENUM, BIT(12), DATETIME(6), TIME(6), DOUBLE) and ``order_items`` (a two-column key). Every
statement runs in a session whose time zone is ``+05:30``, so TIMESTAMP values are converted.

Phases (row counts scale with ``scale``):

1. customers, ten per transaction;
2. orders with 1-3 items each, status and customer updates;
3. DDL: ``ADD COLUMN customers.phone`` (no default: see docs/types-mysql.md) and widening ``MODIFY``s
   (``orders.note`` VARCHAR(40) -> VARCHAR(200), ``orders.total`` DECIMAL(12,2) -> DECIMAL(14,2));
4. mixed: phones filled in, cancellations, order deletes (items first: no foreign keys, whose
   cascades MariaDB does not write to the binlog), totals that need the wider type;
5. primary-key updates: customers move up by :data:`PK_SHIFT` (their orders follow), some orders move;
6. ``TRUNCATE order_items``, then new items for half of the orders;
7. closing updates.

The same seed and scale give the same statements in the same order, so the database ends in the same
state every time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

import pymysql

Say = Callable[[str], None]
DEFAULT_DATABASE: Final = "shop"
TABLES: Final = ("customers", "orders", "order_items")
#: Each table's primary key.
KEYS: Final = {"customers": ("id",), "orders": ("id",), "order_items": ("order_id", "line")}
#: Primary-key updates move a customer id up by this much.
PK_SHIFT: Final = 100_000
#: Order ids start above 2**63: only an unsigned BIGINT holds them.
FIRST_ORDER_ID: Final = 2**63 + 1_000
#: The load generator's order ids are this plus its sequence's values.
LOAD_ORDER_IDS: Final = FIRST_ORDER_ID + 10**12
SESSION_TIME_ZONE: Final = "+05:30"
NAMES: Final = ("Ada Lovelace", "Zoë Ångström", "李雷", "O'Brien; DROP TABLE x", "emoji 😀 𝄞", "  padded  ",
                "Ñandú Pérez", "Σωκράτης", 'quote"inside', "back\\slash")
SCHEMA: Final = (
    """CREATE TABLE customers (
      id INT UNSIGNED PRIMARY KEY, name VARCHAR(80) NOT NULL, tier ENUM('basic','gold','platinum') NOT NULL,
      tags SET('new','vip','b2b','eu'), active BOOLEAN NOT NULL, newsletter TINYINT(1), born DATE,
      joined YEAR, profile JSON, avatar BLOB, updated_at TIMESTAMP(6) NULL) CHARACTER SET utf8mb4""",
    """CREATE TABLE orders (
      id BIGINT UNSIGNED PRIMARY KEY, customer_id INT UNSIGNED NOT NULL, total DECIMAL(12,2) NOT NULL,
      status ENUM('new','paid','shipped','cancelled') NOT NULL, flags BIT(12), placed_at DATETIME(6) NOT NULL,
      ship_window TIME(6), weight DOUBLE, note VARCHAR(40)) CHARACTER SET utf8mb4""",
    """CREATE TABLE order_items (
      order_id BIGINT UNSIGNED NOT NULL, line SMALLINT UNSIGNED NOT NULL, sku CHAR(8) NOT NULL,
      quantity INT NOT NULL, price DECIMAL(10,2) NOT NULL, PRIMARY KEY (order_id, line)) CHARACTER SET utf8mb4""",
)


@dataclass(frozen=True)
class MariaWorkloadSpec:
    """What to run: ``seed`` fixes every value and choice, ``scale`` multiplies the row counts."""

    seed: int = 42
    scale: float = 1.0
    database: str = DEFAULT_DATABASE

    def n(self, base: int) -> int:
        """``base`` scaled, at least 1."""
        return max(1, round(base * self.scale))


@dataclass
class MariaWorkloadReport:
    """What the workload did, and how many rows each table holds at its end."""

    transactions: int = 0
    statements: int = 0
    ddl: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def reset(conn: pymysql.connections.Connection, database: str = DEFAULT_DATABASE) -> None:
    """Drop and create ``database`` with the workload's tables and the load generator's id table
    (no change events: DDL only)."""
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
        cur.execute(f"USE `{database}`")
        for statement in SCHEMA:
            cur.execute(statement)
        # The load generator's order ids (harness.mariadb.load: above LOAD_ORDER_IDS, far beyond the
        # workload's). A table, not a SEQUENCE, so that the workload also suits the 3.x MySQL connectors,
        # which cannot parse CREATE SEQUENCE and stop (docs/types-mysql.md).
        cur.execute("CREATE TABLE load_ids (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY)")


def run_workload(conn: pymysql.connections.Connection, spec: MariaWorkloadSpec = MariaWorkloadSpec(),
                 say: Say | None = None) -> MariaWorkloadReport:
    """Run the workload on a freshly :func:`reset` database through ``conn`` (autocommit off per
    transaction; the session's time zone is set here)."""
    started = time.monotonic()
    work = _Workload(conn, spec, say or (lambda _line: None))
    work.run()
    with conn.cursor() as cur:
        for table in TABLES:
            cur.execute(f"SELECT COUNT(*) FROM `{spec.database}`.`{table}`")
            work.report.rows[table] = int(cur.fetchone()[0])  # type: ignore[index]
    work.report.seconds = time.monotonic() - started
    return work.report


class _Workload:
    """The workload's state: live keys."""

    def __init__(self, conn: pymysql.connections.Connection, spec: MariaWorkloadSpec, say: Say) -> None:
        self.conn, self.spec, self.say = conn, spec, say
        self.rng = random.Random(spec.seed)
        self.report = MariaWorkloadReport()
        self.customers: list[int] = []
        self.orders: dict[int, int] = {}  # order id -> item lines
        self.next_customer = 1
        self.next_order = FIRST_ORDER_ID

    def execute(self, statement: str, params: Any = None) -> None:
        with self.conn.cursor() as cur:
            cur.execute(statement, params)
        self.report.statements += 1

    def transactions(self, label: str, count: int, body: Callable[[int], object]) -> None:
        for i in range(count):
            self.conn.begin()
            body(i)
            self.conn.commit()
            self.report.transactions += 1
            if (i + 1) % 100 == 0 or i + 1 == count:
                self.say(f"  {label}: {i + 1}/{count} transactions")

    def ddl(self, statement: str) -> None:
        self.execute(statement)
        self.report.transactions += 1
        self.report.ddl.append(statement)
        self.say(f"  DDL: {statement}")

    # -- rows ---------------------------------------------------------------------------------------

    def new_customer(self) -> None:
        rng, cid = self.rng, self.next_customer
        self.next_customer += 1
        self.execute(
            "INSERT INTO customers (id, name, tier, tags, active, newsletter, born, joined, profile, avatar, "
            "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (cid, rng.choice(NAMES), rng.choice(("basic", "gold", "platinum")),
             ",".join(sorted(rng.sample(("new", "vip", "b2b", "eu"), rng.randint(0, 3)))), rng.random() < 0.8,
             rng.choice((0, 1, None)), date(1930, 1, 1) + timedelta(days=rng.randint(0, 30_000)),
             rng.randint(1990, 2026), rng.choice(('{"lang": "de", "score": 1.5}', '{"ü": [1, null]}', "[]", None)),
             bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))), self.moment()))
        self.customers.append(cid)

    def moment(self) -> datetime:
        """A TIMESTAMP(6) in the session's zone, inside TIMESTAMP's range."""
        seconds, micros = self.rng.randint(0, 10**9), self.rng.randint(0, 999_999)
        return datetime(2001, 1, 1) + timedelta(seconds=seconds, microseconds=micros)

    def new_order(self) -> None:
        rng, oid = self.rng, self.next_order
        self.next_order += rng.randint(1, 50)
        lines = rng.randint(1, 3)
        self.execute(
            "INSERT INTO orders (id, customer_id, total, status, flags, placed_at, ship_window, weight, note) "
            "VALUES (%s, %s, %s, 'new', %s, %s, %s, %s, %s)",
            (oid, rng.choice(self.customers), Decimal(rng.randint(0, 10**9)).scaleb(-2), rng.randrange(4096),
             self.moment(), timedelta(hours=rng.randint(-30, 30), microseconds=rng.randint(0, 999_999)),
             rng.choice((0.0, -1.25, 3.5e10, None)), rng.choice(("", "fragile ⚠", None))))
        for line in range(1, lines + 1):
            self.new_item(oid, line)
        self.orders[oid] = lines

    def new_item(self, oid: int, line: int) -> None:
        rng = self.rng
        self.execute("INSERT INTO order_items VALUES (%s, %s, %s, %s, %s)",
                     (oid, line, f"SKU{rng.randint(0, 99999):05d}", rng.randint(1, 9),
                      Decimal(rng.randint(1, 99_999)).scaleb(-2)))

    def delete_order(self, oid: int) -> None:
        self.execute("DELETE FROM order_items WHERE order_id = %s", (oid,))
        self.execute("DELETE FROM orders WHERE id = %s", (oid,))
        del self.orders[oid]

    # -- phases -------------------------------------------------------------------------------------

    def run(self) -> None:
        spec, rng = self.spec, self.rng
        self.execute(f"USE `{spec.database}`")
        self.execute(f"SET time_zone = '{SESSION_TIME_ZONE}'")
        self.say("phase 1: customers")

        def ten_customers(_i: int) -> None:
            for _ in range(10):
                self.new_customer()

        self.transactions("customers", spec.n(10), ten_customers)
        self.say("phase 2: orders")

        def order(_i: int) -> None:
            self.new_order()
            if rng.random() < 0.4:
                self.execute("UPDATE orders SET status = %s WHERE id = %s",
                             (rng.choice(("paid", "shipped")), rng.choice(list(self.orders))))
            if rng.random() < 0.3:
                self.execute("UPDATE customers SET tags = %s, updated_at = %s WHERE id = %s",
                             ("vip,eu", self.moment(), rng.choice(self.customers)))

        self.transactions("orders", spec.n(150), order)
        self.say("phase 3: DDL")
        self.ddl("ALTER TABLE customers ADD COLUMN phone VARCHAR(20)")
        self.ddl("ALTER TABLE orders MODIFY note VARCHAR(200)")
        self.ddl("ALTER TABLE orders MODIFY total DECIMAL(14,2) NOT NULL")
        self.say("phase 4: mixed")

        def mixed(_i: int) -> None:
            roll = rng.random()
            if roll < 0.3:
                self.execute("UPDATE customers SET phone = %s WHERE id = %s",
                             (f"+49 {rng.randint(10**6, 10**7)}", rng.choice(self.customers)))
            elif roll < 0.5 and len(self.orders) > 5:
                self.delete_order(rng.choice(list(self.orders)))
            elif roll < 0.7:
                self.execute("UPDATE orders SET status = 'cancelled', note = %s WHERE id = %s",
                             ("x" * rng.randint(41, 200), rng.choice(list(self.orders))))
            else:
                self.new_order()
                self.execute("UPDATE orders SET total = %s WHERE id = %s",
                             (Decimal("999999999999.99"), rng.choice(list(self.orders))))

        self.transactions("mixed", spec.n(100), mixed)
        self.say("phase 5: primary-key updates")

        def move_customer(_i: int) -> None:
            old = rng.choice([c for c in self.customers if c < PK_SHIFT] or self.customers)
            new = old + PK_SHIFT
            if new in self.customers:
                return
            self.execute("UPDATE customers SET id = %s WHERE id = %s", (new, old))
            self.execute("UPDATE orders SET customer_id = %s WHERE customer_id = %s", (new, old))
            self.customers[self.customers.index(old)] = new

        self.transactions("customer moves", spec.n(10), move_customer)

        def move_order(_i: int) -> None:
            old = rng.choice(list(self.orders))
            new = self.next_order
            self.next_order += 1
            self.execute("UPDATE orders SET id = %s, note = 'moved' WHERE id = %s", (new, old))
            self.execute("UPDATE order_items SET order_id = %s WHERE order_id = %s", (new, old))
            self.orders[new] = self.orders.pop(old)

        self.transactions("order moves", spec.n(10), move_order)
        self.say("phase 6: TRUNCATE order_items")
        self.ddl("TRUNCATE TABLE order_items")
        kept = sorted(self.orders)[::2]
        self.transactions("new items", len(kept), lambda i: self.new_item(kept[i], 1))
        self.say("phase 7: closing updates")
        self.transactions("closing", 1, lambda _i: self.execute(
            "UPDATE orders SET status = 'shipped' WHERE id IN %s", (tuple(kept[:5]),)))
