"""Consistent reads across tables on the real stack: ``python -m harness.stack_proofs.cuts``.

A PostgreSQL schema ``bank`` whose transactions span tables -- transfers that update two balances
and insert a ledger row for each, orders inserted with their items, orders deleted with their items
by a cascading foreign key -- runs through a Debezium connector of its own with
``provide.transaction.metadata``, while ``ingest run --continuous`` ingests it and a reader checks
the cross-table invariants in a loop, twice per read: at the latest cut (``--consistent``) and at
the tables' latest versions. Meanwhile the run is SIGKILLed and restarted, the broker restarted and
Kafka Connect restarted (a run that ends on its own meanwhile is started again, as a service manager
would). At the end the lake is compared with PostgreSQL, and the cut lag of every
transaction (its commit until the first cut that holds it) is measured.

Prints a table and writes ``result.json`` in the workdir; exits non-zero if a consistent read broke
an invariant, if the latest-version reads never did (the check could not fail), or if the lake
differs from PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import requests
import yaml

from harness.stack_proofs.faults import IngestWatch
from harness.torture.process import IngestProcess, run_once
from ingest.config import IngestConfig, load_config
from ingest.cuts import store
from ingest.cuts.transactions import TransactionTopic
from ingest.errors import IngestError, first_line
from ingest.ops.verify_source import verify_source_db
from ingest.read.consistent import run_consistent
from ingest.read.query import run_sql
from ingest.verify.capture import wait_for_capture

#: Seconds after a fault began during which its transactions are not steady-state samples.
SETTLE = 45.0
ACCOUNTS = 20
OPENING = 1000
TABLES = ("accounts", "ledger", "orders", "order_items")
#: One read of the invariants: each column counts what breaks (0 everywhere: whole transactions).
INVARIANTS = f"""
SELECT (SELECT coalesce(CAST(sum(balance) AS BIGINT), 0) FROM accounts) - {ACCOUNTS * OPENING} AS money_made,
       (SELECT count(*) FROM accounts a WHERE a.balance <> {OPENING} + coalesce(
            (SELECT sum(amount) FROM ledger l WHERE l.account = a.id), 0)) AS accounts_off_ledger,
       (SELECT count(*) FROM orders o WHERE o.total <> coalesce(
            (SELECT sum(amount) FROM order_items i WHERE i.order_id = o.id), 0)) AS orders_off_items,
       (SELECT count(*) FROM order_items i WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = i.order_id))
           AS orphan_items
"""
SCHEMA = f"""
DROP SCHEMA IF EXISTS bank CASCADE;
CREATE SCHEMA bank;
CREATE TABLE bank.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE bank.ledger (id bigserial PRIMARY KEY, account int NOT NULL, amount bigint NOT NULL);
CREATE TABLE bank.orders (id bigserial PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE bank.order_items (id bigserial PRIMARY KEY,
    order_id bigint NOT NULL REFERENCES bank.orders ON DELETE CASCADE, amount bigint NOT NULL);
INSERT INTO bank.accounts SELECT g, {OPENING} FROM generate_series(1, {ACCOUNTS}) g;
"""


@dataclass
class Reads:
    made: int = 0
    broken: int = 0
    no_cut_yet: int = 0
    errors: list[str] = field(default_factory=list)
    example: str = ""


@dataclass
class Result:
    writer: str
    seconds: float
    rate: float
    transactions: int = 0
    consistent: Reads = field(default_factory=Reads)
    latest: Reads = field(default_factory=Reads)
    faults: list[str] = field(default_factory=list)
    #: times the continuous run ended on its own during a fault and was started again
    restarts_on_their_own: int = 0
    cuts: int = 0
    lag_p50: float | None = None
    lag_p95: float | None = None
    lag_p99: float | None = None
    lag_samples: int = 0
    #: the same, for the transactions committed after the first cut and not within the settle time of a fault
    steady_p50: float | None = None
    steady_p95: float | None = None
    steady_p99: float | None = None
    steady_samples: int = 0
    final_cut_is_last_transaction: bool = False
    tables_equal_source: bool = False
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.consistent.broken == 0 and self.latest.broken > 0 and self.tables_equal_source
                and self.final_cut_is_last_transaction and self.consistent.made > 0)


class Load(threading.Thread):
    """Transactions at a steady rate until stopped."""

    def __init__(self, dsn: str, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.rng = dsn, rate, random.Random(seed)
        self.stopping = threading.Event()
        self.committed = 0
        self.failed: list[str] = []

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        start = time.monotonic()
        while not self.stopping.is_set():
            due = start + self.committed / self.rate
            time.sleep(max(0.0, due - time.monotonic()))
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn)
                with conn.transaction():
                    self._one(conn)
                self.committed += 1
            except psycopg.Error as exc:  # PostgreSQL is not restarted here; say it and go on
                self.failed.append(first_line(exc))
                conn = None
                time.sleep(0.5)

    def _one(self, conn: psycopg.Connection) -> None:
        pick = self.rng.random()
        if pick < 0.6:
            a, b = self.rng.sample(range(1, ACCOUNTS + 1), 2)
            amount = self.rng.randint(1, 50)
            conn.execute("UPDATE bank.accounts SET balance = balance - %s WHERE id = %s", (amount, a))
            conn.execute("UPDATE bank.accounts SET balance = balance + %s WHERE id = %s", (amount, b))
            conn.execute("INSERT INTO bank.ledger (account, amount) VALUES (%s, %s), (%s, %s)", (a, -amount, b, amount))
        elif pick < 0.9:
            items = [self.rng.randint(1, 99) for _ in range(self.rng.randint(1, 3))]
            row = conn.execute("INSERT INTO bank.orders (total) VALUES (%s) RETURNING id", (sum(items),)).fetchone()
            assert row is not None
            for amount in items:
                conn.execute("INSERT INTO bank.order_items (order_id, amount) VALUES (%s, %s)", (row[0], amount))
        else:
            conn.execute("DELETE FROM bank.orders WHERE id = (SELECT min(id) FROM bank.orders)")


def read_once(config: IngestConfig, result: Result) -> None:
    """One read of the invariants at the latest cut, and one at the tables' latest versions."""
    for reads, consistent in ((result.consistent, True), (result.latest, False)):
        try:
            rows = (run_consistent(config, INVARIANTS)[0] if consistent else run_sql(config, INVARIANTS)).to_pylist()
        except IngestError as exc:
            text = str(exc)
            if "no cut published yet" in text or "no commit yet" in text or "Catalog Error" in text:
                reads.no_cut_yet += 1
            elif len(reads.errors) < 5:
                reads.errors.append(first_line(exc)[:200])
            continue
        reads.made += 1
        broken = {k: v for k, v in rows[0].items() if v}
        if broken:
            reads.broken += 1
            reads.example = reads.example or json.dumps(broken)


def cut_lags(config: IngestConfig) -> list[tuple[datetime, float]]:
    """Per source transaction of the group: its commit time, and seconds from it until the first cut
    holding it."""
    cuts = store.every(config.tables_root / config.target.cuts_table)
    ends, _ = TransactionTopic(config).read(0)
    lags = []
    at = 0
    for txn in ends:
        while at < len(cuts) and cuts[at].txn_offset < txn.offset:
            at += 1
        published = cuts[at].published_at if at < len(cuts) else None
        if published is None or txn.commit_ts is None:
            continue
        lags.append((txn.commit_ts, (published - txn.commit_ts).total_seconds()))
    return lags


def percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 2)


def run(workdir: Path, *, writer: str, seconds: float, rate: float, seed: int, say: Any = print) -> Result:
    from harness.stack import CDC_COMPONENTS, Stack

    stack = Stack.from_env(progress=lambda line: None)
    stack.up(CDC_COMPONENTS)
    os.environ.update(stack.engine_env())
    dsn = stack.pg_dsn()
    connect = stack._connect()
    name = f"cuts{int(time.time()) % 1_000_000}"
    # A connector of its own per run: a fresh slot, topics and snapshot; earlier runs' are removed.
    for old in requests.get(f"{connect.url}/connectors", timeout=10).json():
        if old.startswith("cuts"):
            requests.delete(f"{connect.url}/connectors/{old}", timeout=30)
    time.sleep(2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'cuts%' "
                                    "AND NOT active").fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(SCHEMA)
    settings = stack.connector_template("pgjson")
    settings.update({"topic.prefix": name, "slot.name": f"{name}_slot", "provide.transaction.metadata": "true",
                     "table.include.list": ",".join(f"bank.{t}" for t in TABLES)})
    stack.register_connector(name, settings)
    connect.wait_running([name], 120)
    engine = workdir / "engine"
    engine.mkdir(parents=True, exist_ok=True)
    (engine / "config.yaml").write_text(yaml.safe_dump({
        "workdir": str(engine),
        "source": {"kind": "kafka", "value_format": "json", "transactions": {"topic": f"{name}.transaction"},
                   "kafka": {"bootstrap_servers": stack.bootstrap_servers(), "reader": "python"}},
        "target": {"writer": writer},
        "tables": [{"name": t, "topic": f"{name}.bank.{t}"} for t in TABLES]}))
    config = load_config(engine / "config.yaml")
    result = Result(writer, seconds, rate)
    process = IngestProcess(engine / "config.yaml", workdir / "logs", stack.engine_env())
    process.start()
    # Like a service manager: a run that ends on its own (a broker away too long) is started again.
    watch = IngestWatch(process, lambda line: say(line), warmup=30.0).start()
    load = Load(dsn, rate, seed)
    load.start()
    say(f"connector {name}, ingest run --continuous ({writer}) and {rate:.0f} transactions/s for {seconds:.0f} s")
    plan = {0.3: "ingest-kill", 0.5: "kafka", 0.7: "connect"}
    fault_times: list[datetime] = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        for at, kind in list(plan.items()):
            if elapsed >= at * seconds:
                del plan[at]
                t0 = time.monotonic()
                fault_times.append(datetime.now(UTC))
                if kind == "ingest-kill":
                    with watch.lock:
                        process.kill()
                        process.start()
                else:
                    stack.restart(kind)
                    connect.restart_failed(name)
                    connect.wait_running([name], 180)
                result.faults.append(f"{kind} at {elapsed:.0f} s ({time.monotonic() - t0:.1f} s)")
                say(f"  fault: {result.faults[-1]}")
        read_once(config, result)
        time.sleep(0.3)
    load.stopping.set()
    load.join(30)
    result.transactions = load.committed
    say(f"load stopped: {load.committed} transactions ({len(load.failed)} failed); waiting for Debezium")
    wait_for_capture(dsn, timeout=300, on_stall=stack.unstick_capture)
    for _ in range(20):  # the continuous run catches up; the reader goes on reading
        read_once(config, result)
        time.sleep(0.5)
    seen = watch.stop()
    result.restarts_on_their_own = len(seen.unexpected_exits)
    process.stop(timeout=60)
    code, log = run_once(engine / "config.yaml", workdir / "logs", dict(process.env), timeout=900)
    if code != 0:
        result.differences.append(f"the final ingest run exited with {code} ({log})")
    read_once(config, result)
    cuts = store.every(config.tables_root / config.target.cuts_table)
    ends, _ = TransactionTopic(config).read(0)
    result.cuts = len(cuts)
    result.final_cut_is_last_transaction = bool(cuts) and bool(ends) and cuts[-1].txn_offset == ends[-1].offset
    lags = cut_lags(config)
    every = [lag for _, lag in lags]
    result.lag_samples = len(every)
    result.lag_p50, result.lag_p95, result.lag_p99 = (percentile(every, q) for q in (50, 95, 99))
    first = cuts[0].published_at if cuts else None
    steady = [lag for at, lag in lags if first is not None and at > first
              and not any(f <= at <= f + timedelta(seconds=SETTLE) for f in fault_times)]
    result.steady_samples = len(steady)
    result.steady_p50, result.steady_p95, result.steady_p99 = (percentile(steady, q) for q in (50, 95, 99))
    check = verify_source_db(config, dsn, wait=300)
    result.tables_equal_source = check.ok
    result.differences += [f"{c.table}: {c.error or c.verification}"[:300] for c in check.tables if not c.ok]
    (workdir / "result.json").write_text(json.dumps(asdict(result) | {"ok": result.ok}, indent=2, default=str))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writer", default="delta-rs", choices=["delta-rs", "delta-spark"])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--rate", type=float, default=20.0, help="source transactions per second")
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdc-cuts-"))
    result = run(workdir, writer=args.writer, seconds=args.seconds, rate=args.rate, seed=args.seed)
    lines = [
        f"writer {result.writer}: {result.transactions} transactions at {result.rate:.0f}/s over "
        f"{result.seconds:.0f} s; faults: {', '.join(result.faults)}; the run ended on its own and was started "
        f"again {result.restarts_on_their_own} time(s)",
        f"reads at the latest cut:    {result.consistent.made} made, {result.consistent.broken} broken, "
        f"{result.consistent.no_cut_yet} before the first cut",
        f"reads at latest versions:   {result.latest.made} made, {result.latest.broken} broken"
        f"{f' (e.g. {result.latest.example})' if result.latest.example else ''}",
        f"cuts published: {result.cuts}; cut lag (commit -> cut) over {result.lag_samples} transactions: "
        f"p50 {result.lag_p50} s, p95 {result.lag_p95} s, p99 {result.lag_p99} s",
        f"  steady state (after the first cut, {SETTLE:.0f} s clear of faults), {result.steady_samples} transactions: "
        f"p50 {result.steady_p50} s, p95 {result.steady_p95} s, p99 {result.steady_p99} s",
        f"final cut is the last transaction: {result.final_cut_is_last_transaction}; "
        f"tables equal PostgreSQL: {result.tables_equal_source} {'; '.join(result.differences)}",
        f"result: {'OK' if result.ok else 'FAILED'} ({workdir / 'result.json'})",
    ]
    print("\n".join(lines))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
