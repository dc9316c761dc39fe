"""A steady-rate load on the MariaDB ``shop`` database (:mod:`harness.mariadb.workload`), for the stack torture.

Each transaction inserts an order with 1-3 items; about every third one also moves an earlier
order's status on, about every tenth deletes an earlier order's items and then the order. Order ids
come from the database's ``load_ids`` table's AUTO_INCREMENT (above ``LOAD_ORDER_IDS``), so several
generators and restarts never collide.
Rate, threads and reconnects across MariaDB restarts: :class:`harness.steady.SteadyLoad`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

import pymysql

from harness.mariadb.workload import LOAD_ORDER_IDS, SESSION_TIME_ZONE
from harness.steady import SteadyLoad

Say = Callable[[str], None]


class MariaLoadGenerator(SteadyLoad):
    """Writes ``rate`` row changes per second for ``duration`` seconds into MariaDB's ``shop`` database.

    Args:
        connect: a new autocommit utf8mb4 connection to the database, as a user who may write it (the
            stack's ``component("mariadb").connect(database)``), after
            :func:`harness.mariadb.workload.reset` and its workload.
        rate, duration, seed, say: as :class:`harness.steady.SteadyLoad`'s.
    """

    disconnected = (pymysql.OperationalError, pymysql.InterfaceError)
    thread_name = "mariadb-load"

    def __init__(self, connect: Callable[[], pymysql.connections.Connection], *, rate: float,
                 duration: float | None, seed: int = 1, say: Say | None = None) -> None:
        super().__init__(rate=rate, duration=duration, seed=seed, say=say)
        self._connect = connect

    def connect(self) -> pymysql.connections.Connection:
        conn = self._connect()
        with conn.cursor() as cur:
            cur.execute(f"SET time_zone = '{SESSION_TIME_ZONE}'")
        return conn

    def prepare(self, conn: pymysql.connections.Connection) -> list[int]:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM customers ORDER BY id")
            customers = [int(r[0]) for r in cur.fetchall()]
        if not customers:
            raise RuntimeError("the database has no customers to write orders for (run its workload first)")
        return customers

    def transaction(self, conn: pymysql.connections.Connection, customers: list[int]) -> int:
        rng, changes, written, deleted = self.rng, 0, [], []
        committing = False
        try:
            conn.begin()
            with conn.cursor() as cur:
                cur.execute("INSERT INTO load_ids VALUES ()")
                oid = LOAD_ORDER_IDS + int(cur.lastrowid)
                changes += cur.execute(
                    "INSERT INTO orders (id, customer_id, total, status, flags, placed_at, ship_window, weight, note) "
                    "VALUES (%s, %s, %s, 'new', %s, %s, %s, %s, 'load')",
                    (oid, rng.choice(customers), Decimal(rng.randint(0, 10**9)).scaleb(-2), rng.randrange(4096),
                     datetime(2020, 1, 1) + timedelta(seconds=rng.randint(0, 10**8)),
                     timedelta(minutes=rng.randint(-600, 600)), rng.random() * 100))
                for line in range(1, rng.randint(1, 3) + 1):
                    changes += cur.execute("INSERT INTO order_items VALUES (%s, %s, %s, %s, %s)",
                                           (oid, line, f"LOAD{line:04d}", rng.randint(1, 9), Decimal("9.99")))
                written.append(oid)
                if self._mine and rng.random() < 0.33:
                    changes += cur.execute("UPDATE orders SET status = %s WHERE id = %s",
                                           (rng.choice(("paid", "shipped")), rng.choice(self._mine)))
                if len(self._mine) > 5 and rng.random() < 0.1:
                    gone = self._mine[rng.randrange(len(self._mine))]
                    changes += cur.execute("DELETE FROM order_items WHERE order_id = %s", (gone,))
                    changes += cur.execute("DELETE FROM orders WHERE id = %s", (gone,))
                    deleted.append(gone)
            committing = True
            conn.commit()
        except self.disconnected:
            self.went_away(committing)
            raise
        except pymysql.Error as exc:  # e.g. a customer moved meanwhile: that transaction is lost
            conn.rollback()
            return self.failed(str(exc))
        return self.committed(changes, written, deleted)
