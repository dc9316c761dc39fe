"""A steady-rate load generator on the ``shop`` schema, for benchmarks and fault injection.

It writes row changes at a target rate (changes per second) for a duration, in a background thread
(:meth:`LoadGenerator.start`, :meth:`LoadGenerator.stop`, :meth:`LoadGenerator.join`) or in the
caller's (:meth:`LoadGenerator.run`). Each transaction inserts an order with 1-3 items; about every
third one also moves an earlier order's status on, about every tenth deletes an earlier order's
items and then the order (both counted). Order ids come from the schema's ``load_ids`` sequence, so
several generators and restarts never collide.

When PostgreSQL goes away (a restart by :meth:`harness.stack.Stack.restart`), the generator
reconnects with a growing pause (0.2 s up to 2 s) until the duration is over. A transaction whose
COMMIT was sent but not answered may or may not have committed: it is counted as ``uncertain``,
never as committed. ``committed_changes`` counts rows written by the generator's own statements in
committed transactions.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import psycopg
from psycopg import sql

from harness.postgres import values as v
from harness.postgres.schema import DEFAULT_SCHEMA, check_schema_name, qualified

Say = Callable[[str], None]


@dataclass
class LoadReport:
    """What the generator did."""

    committed_changes: int = 0
    committed_transactions: int = 0
    failed_transactions: int = 0
    uncertain_transactions: int = 0
    reconnects: int = 0
    seconds: float = 0.0
    target_rate: float = 0.0
    last_error: str | None = None

    @property
    def rate(self) -> float:
        """Committed changes per second over the run."""
        return self.committed_changes / self.seconds if self.seconds else 0.0


class LoadGenerator:
    """Writes ``rate`` row changes per second for ``duration`` seconds.

    Args:
        dsn: libpq connection string.
        rate: target row changes per second.
        duration: seconds to run (``None``: until :meth:`stop`).
        seed: seeds every value and choice.
        schema: the schema (created by :func:`harness.postgres.schema.reset`, with some customers and
            products in it, e.g. after :func:`harness.postgres.workload.run_workload`).
        say: receives a progress line every ``report_every`` seconds.
        report_every: seconds between progress lines.
        application_name: the sessions' ``application_name`` (find them in ``pg_stat_activity``).
    """

    def __init__(self, dsn: str, *, rate: float, duration: float | None, seed: int = 1,
                 schema: str = DEFAULT_SCHEMA, say: Say | None = None, report_every: float = 10.0,
                 application_name: str = "ingest-pg-load") -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.dsn, self.rate, self.duration = dsn, rate, duration
        self.schema = check_schema_name(schema)
        self.rng = random.Random(seed)
        self.say = say or (lambda _line: None)
        self.report_every = report_every
        self.application_name = application_name
        self.report = LoadReport(target_rate=rate)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mine: list[int] = []  # order ids this generator wrote and has not deleted
        #: Orders per transaction: one up to 250 changes/s, more above (a round trip per statement).
        self.orders_per_transaction = max(1, round(rate / 250))

    # -- control ------------------------------------------------------------------------------------

    def start(self) -> LoadGenerator:
        """Run in a background (daemon) thread."""
        self._thread = threading.Thread(target=self.run, name="pg-load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the generator to stop after its current transaction."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> LoadReport:
        """Wait for the background thread and return the report."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.report

    def run(self) -> LoadReport:
        """Generate load until the duration is over or :meth:`stop` is called."""
        started = time.monotonic()
        deadline = None if self.duration is None else started + self.duration
        pause = 0.2
        last_said = started
        tokens, refilled = 0.0, started
        while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5,
                                     application_name=self.application_name) as conn:
                    customers, products = self._catalog(conn)
                    pause = 0.2
                    refilled = time.monotonic()
                    while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                        now = time.monotonic()
                        # Token bucket holding at most one second of changes: steady, and no burst
                        # to make up for an outage.
                        tokens = min(tokens + (now - refilled) * self.rate, max(self.rate, 10.0))
                        refilled = now
                        if tokens <= 0:
                            time.sleep(min(-tokens / self.rate, 0.2) or 0.001)
                            continue
                        tokens -= self._transaction(conn, customers, products)
                        elapsed = time.monotonic() - started
                        if time.monotonic() - last_said >= self.report_every:
                            last_said = time.monotonic()
                            self.say(f"  load: {self.report.committed_changes} changes committed "
                                     f"({self.report.committed_changes / max(elapsed, 1e-9):.0f}/s, "
                                     f"target {self.rate:.0f}/s, {self.report.reconnects} reconnects)")
            except psycopg.OperationalError as exc:
                self.report.last_error = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                self.report.reconnects += 1
                self._stop.wait(pause)
                pause = min(pause * 2, 2.0)
        self.report.seconds = time.monotonic() - started
        return self.report

    # -- one transaction ----------------------------------------------------------------------------

    def _catalog(self, conn: psycopg.Connection) -> tuple[list[int], dict[int, Decimal]]:
        customers = [r[0] for r in conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(self._t("customers")))]
        products = {r[0]: r[1] for r in conn.execute(
            sql.SQL("SELECT id, price FROM {} ORDER BY id").format(self._t("products")))}
        if not customers or not products:
            raise RuntimeError(f"schema {self.schema} has no customers or products to write orders for")
        return customers, products

    def _t(self, table: str) -> sql.Composed:
        return qualified(self.schema, table)

    def _transaction(self, conn: psycopg.Connection, customers: list[int], products: dict[int, Decimal]) -> int:
        """One transaction; returns the changes it committed (0 if it failed)."""
        changes = 0
        written: list[int] = []
        deleted: list[int] = []
        committing = False
        try:
            with conn.transaction():
                for _ in range(self.orders_per_transaction):
                    changes += self._order(conn, customers, products, written, deleted)
                committing = True
        except psycopg.OperationalError:
            if committing:
                self.report.uncertain_transactions += 1
            else:
                self.report.failed_transactions += 1
            raise
        except psycopg.Error as exc:  # e.g. a customer deleted meanwhile: that transaction is lost
            self.report.failed_transactions += 1
            self.report.last_error = str(exc).strip().splitlines()[0]
            return 0
        self._mine.extend(written)
        for gone in deleted:
            self._mine.remove(gone)
        self.report.committed_transactions += 1
        self.report.committed_changes += changes
        return changes

    def _order(self, conn: psycopg.Connection, customers: list[int], products: dict[int, Decimal],
               written: list[int], deleted: list[int]) -> int:
        """One order with its items, maybe a status update and a delete; returns the rows changed."""
        rng, changes = self.rng, 0
        oid = conn.execute(sql.SQL("SELECT nextval({})").format(
            sql.Literal(f'"{self.schema}".load_ids'))).fetchone()[0]  # type: ignore[index]
        order = v.order_row(rng, oid, rng.choice(customers))
        items = []
        for line in range(1, rng.randint(1, 3) + 1):
            pid = rng.choice(sorted(products))
            items.append(v.item_row(rng, oid, line, pid, products[pid]))
        order["total"] = sum((i["quantity"] * i["unit_price"] for i in items), Decimal("0.00"))
        changes += self._insert(conn, "orders", order)
        for item in items:
            changes += self._insert(conn, "order_items", item)
        written.append(oid)
        candidates = [o for o in self._mine if o not in deleted]
        if candidates and rng.random() < 0.33:
            changes += conn.execute(sql.SQL("UPDATE {} SET status = %s WHERE id = %s").format(
                self._t("orders")), (rng.choice(v.STATUSES[1:]), rng.choice(candidates))).rowcount
        if len(candidates) > 5 and rng.random() < 0.1:
            gone = candidates[rng.randrange(len(candidates))]
            changes += conn.execute(sql.SQL("DELETE FROM {} WHERE order_id = %s").format(
                self._t("order_items")), (gone,)).rowcount
            changes += conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self._t("orders")), (gone,)).rowcount
            deleted.append(gone)
        return changes

    def _insert(self, conn: psycopg.Connection, table: str, row: dict) -> int:
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            self._t(table), sql.SQL(", ").join(map(sql.Identifier, row)),
            sql.SQL(", ").join(sql.Placeholder() * len(row)))
        return conn.execute(query, list(row.values())).rowcount
