"""A steady-rate load generator on the ``shop`` schema, for benchmarks and fault injection.

It writes row changes at a target rate (:class:`harness.steady.SteadyLoad`: a background thread or the
caller's, reconnecting across restarts). Each transaction inserts an order with 1-3 items; about every
third one also moves an earlier order's status on, about every tenth deletes an earlier order's
items and then the order (both counted). Order ids come from the schema's ``load_ids`` sequence, so
several generators and restarts never collide. ``committed_changes`` counts rows written by the
generator's own statements in committed transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import psycopg
from psycopg import sql

from harness.postgres import values as v
from harness.postgres.schema import DEFAULT_SCHEMA, check_schema_name, qualified
from harness.steady import LoadReport, SteadyLoad
from ingest.errors import first_line

__all__ = ["LoadGenerator", "LoadReport"]

Say = Callable[[str], None]


class LoadGenerator(SteadyLoad):
    """Writes ``rate`` row changes per second for ``duration`` seconds into the ``shop`` schema.

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

    disconnected = (psycopg.OperationalError,)
    thread_name = "pg-load"

    def __init__(self, dsn: str, *, rate: float, duration: float | None, seed: int = 1,
                 schema: str = DEFAULT_SCHEMA, say: Say | None = None, report_every: float = 10.0,
                 application_name: str = "ingest-pg-load") -> None:
        super().__init__(rate=rate, duration=duration, seed=seed, say=say, report_every=report_every)
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        self.application_name = application_name
        #: Orders per transaction: one up to 250 changes/s, more above (three round trips per transaction).
        self.orders_per_transaction = max(1, round(rate / 250))

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=5, application_name=self.application_name)

    def prepare(self, conn: psycopg.Connection) -> tuple[list[int], dict[int, Decimal]]:
        return self._catalog(conn)

    def transaction(self, conn: psycopg.Connection, state: tuple[list[int], dict[int, Decimal]]) -> int:
        return self._transaction(conn, *state)

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
        """One transaction; returns the changes it committed (0 if it failed).

        Two round trips and the commit, however many orders it holds: one for the orders' ids, one
        for its statements, sent as a pipeline. A load generator that waits for each statement spends
        the machine's cores on round trips, and measures itself instead of what it loads.
        """
        written: list[int] = []
        deleted: list[int] = []
        committing = False
        try:
            with conn.transaction():
                ids = [r[0] for r in conn.execute(sql.SQL("SELECT nextval({}) FROM generate_series(1, %s)").format(
                    sql.Literal(f'"{self.schema}".load_ids')), (self.orders_per_transaction,))]
                with conn.pipeline():
                    cursors = [cur for oid in ids for cur in self._order(conn, oid, customers, products,
                                                                         written, deleted)]
                changes = sum(cur.rowcount for cur in cursors)
                committing = True
        except psycopg.OperationalError:
            self.went_away(committing)
            raise
        except psycopg.Error as exc:  # e.g. a customer deleted meanwhile: that transaction is lost
            return self.failed(first_line(exc))
        return self.committed(changes, written, deleted)

    def _order(self, conn: psycopg.Connection, oid: int, customers: list[int], products: dict[int, Decimal],
               written: list[int], deleted: list[int]) -> list[psycopg.Cursor]:
        """One order with its items, maybe a status update and a delete: the statements' cursors.

        Their row counts are known once the pipeline has synced.
        """
        rng = self.rng
        order = v.order_row(rng, oid, rng.choice(customers))
        items = []
        for line in range(1, rng.randint(1, 3) + 1):
            pid = rng.choice(sorted(products))
            items.append(v.item_row(rng, oid, line, pid, products[pid]))
        order["total"] = sum((i["quantity"] * i["unit_price"] for i in items), Decimal("0.00"))
        cursors = [self._insert(conn, "orders", order), *(self._insert(conn, "order_items", i) for i in items)]
        written.append(oid)
        candidates = [o for o in self._mine if o not in deleted]
        if candidates and rng.random() < 0.33:
            cursors.append(conn.execute(sql.SQL("UPDATE {} SET status = %s WHERE id = %s").format(
                self._t("orders")), (rng.choice(v.STATUSES[1:]), rng.choice(candidates))))
        if len(candidates) > 5 and rng.random() < 0.1:
            gone = candidates[rng.randrange(len(candidates))]
            cursors.append(conn.execute(sql.SQL("DELETE FROM {} WHERE order_id = %s").format(
                self._t("order_items")), (gone,)))
            cursors.append(conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(self._t("orders")), (gone,)))
            deleted.append(gone)
        return cursors

    def _insert(self, conn: psycopg.Connection, table: str, row: dict) -> psycopg.Cursor:
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            self._t(table), sql.SQL(", ").join(map(sql.Identifier, row)),
            sql.SQL(", ").join(sql.Placeholder() * len(row)))
        return conn.execute(query, list(row.values()))
