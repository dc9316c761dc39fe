"""A bank whose source transactions span tables, as Debezium with transaction metadata writes it.

``accounts`` (id, balance) opens with a snapshot; each transfer is one source transaction that
updates two balances and inserts a ledger row for each (``ledger``: id, account, amount), with the
``transaction`` block in every change and BEGIN / END records on ``bank.transaction``. Whatever
the transfers, two invariants hold at every transaction boundary, and only there: the balances add
up to the opening total, and each balance is its opening balance plus its ledger.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ingest.config import IngestConfig, load_config
from ingest.source.topiclog import ProducerRecord, TopicLog

PREFIX = "bank"
ACCOUNTS, LEDGER, TRANSACTIONS = f"{PREFIX}.public.accounts", f"{PREFIX}.public.ledger", f"{PREFIX}.transaction"
OPENING = 100
TS = 1_700_000_000_000


def config(workdir: Path, *, writer: str = "delta-rs", plan_on: str = "driver", per_table: int | None = 7,
           group: bool = True) -> IngestConfig:
    """The bank's pipeline: two tables, JSON on the embedded log, a transaction group unless not ``group``."""
    raw: dict[str, Any] = {
        "workdir": str(workdir),
        "source": {"value_format": "json", "max_records_per_batch": 1000},
        "target": {"writer": writer, "plan_on": plan_on},
        "tables": [{"name": "accounts", "topic": ACCOUNTS}, {"name": "ledger", "topic": LEDGER}],
    }
    if per_table is not None:
        raw["source"]["max_records_per_table"] = per_table
    if group:
        raw["source"]["transactions"] = {"topic": TRANSACTIONS}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


@dataclass
class Bank:
    """The source database and what its connector writes (see module docstring)."""

    accounts: int = 5
    seed: int = 7
    lsn: int = 1000
    committed: int | None = None
    txns: list[str] = field(default_factory=list)
    ledger_ids: int = 0
    balances: dict[int, int] = field(default_factory=dict)
    records: dict[str, list[ProducerRecord]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.balances = dict.fromkeys(range(1, self.accounts + 1), OPENING)
        for topic in (ACCOUNTS, LEDGER, TRANSACTIONS):
            self.records[topic] = []

    def snapshot(self) -> None:
        """The initial snapshot: every account read at one point, the last one marked ``last``."""
        for i, account in enumerate(sorted(self.balances), start=1):
            mark = "first" if i == 1 else "last" if i == len(self.balances) else "true"
            self._change(ACCOUNTS, "r", {"id": account, "balance": self.balances[account]}, None, snapshot=mark)

    def transfer(self) -> str:
        """One transaction: money from one account to another, and a ledger row for each."""
        a, b = self.rng.sample(sorted(self.balances), 2)
        amount = self.rng.randint(1, 30)
        changes: list[tuple[str, dict[str, Any]]] = []
        for account, delta in ((a, -amount), (b, amount)):
            self.balances[account] += delta
            changes.append((ACCOUNTS, {"id": account, "balance": self.balances[account]}))
        for account, delta in ((a, -amount), (b, amount)):
            self.ledger_ids += 1
            changes.append((LEDGER, {"id": self.ledger_ids, "account": account, "amount": delta}))
        return self._transaction(changes)

    def touch(self) -> str:
        """A transaction of one table: an account row written again as it is."""
        account = self.rng.choice(sorted(self.balances))
        return self._transaction([(ACCOUNTS, {"id": account, "balance": self.balances[account]})])

    def _transaction(self, changes: list[tuple[str, dict[str, Any]]]) -> str:
        """One source transaction; ids as PostgreSQL's connector writes them: ``<txId>:<LSN>``, with each
        change's own LSN, and the commit's in the END record."""
        self.lsn += 10
        xid = len(self.txns) + 600
        self._send(TRANSACTIONS, None, {"status": "BEGIN", "id": f"{xid}:{self.lsn}", "event_count": None,
                                        "data_collections": None, "ts_ms": self._ts()})
        per_table: dict[str, int] = {}
        for total, (topic, row) in enumerate(changes, start=1):
            per_table[topic] = per_table.get(topic, 0) + 1
            self.lsn += 1
            op = "c" if topic == LEDGER else "u"
            self._change(topic, op, row, {"id": f"{xid}:{self.lsn}", "total_order": total,
                                          "data_collection_order": per_table[topic]})
        self.lsn += 1
        txn = f"{xid}:{self.lsn}"
        self._send(TRANSACTIONS, None, {
            "status": "END", "id": txn, "event_count": len(changes), "ts_ms": self._ts(),
            "data_collections": [{"data_collection": t.removeprefix(PREFIX + "."), "event_count": n}
                                 for t, n in per_table.items()]})
        self.committed = self.lsn
        self.txns.append(txn)
        return txn

    def produce(self, log: TopicLog) -> None:
        """Append what the connector has written since the last call (each topic in its own order)."""
        for topic, records in self.records.items():
            if not log.exists(topic):
                log.create_topic(topic, 1)
            if records:
                log.append(topic, records)
            self.records[topic] = []

    def _change(self, topic: str, op: str, row: dict[str, Any], transaction: dict[str, Any] | None, *,
                snapshot: str = "false") -> None:
        source = {"connector": "postgresql", "name": PREFIX, "db": "bank", "schema": "public",
                  "table": topic.rsplit(".", 1)[1], "snapshot": snapshot, "ts_ms": self._ts(), "lsn": self.lsn,
                  "sequence": json.dumps([None if self.committed is None else str(self.committed), str(self.lsn)])}
        value = {"op": op, "before": None, "after": row, "source": source, "ts_ms": self._ts(),
                 "transaction": transaction}
        self._send(topic, json.dumps({"id": row["id"]}).encode(), value)

    def _send(self, topic: str, key: bytes | None, value: dict[str, Any]) -> None:
        self.records[topic].append(ProducerRecord(0, key, json.dumps(value).encode(), self._ts()))

    def _ts(self) -> int:
        return TS + self.lsn


def violations(accounts: list[dict[str, Any]], ledger: list[dict[str, Any]], opening_accounts: int) -> list[str]:
    """What breaks the bank's invariants in one read of both tables (empty: none)."""
    out = []
    total = sum(r["balance"] for r in accounts)
    if total != OPENING * opening_accounts:
        out.append(f"total balance {total}, not {OPENING * opening_accounts}")
    booked: dict[int, int] = {}
    for r in ledger:
        booked[r["account"]] = booked.get(r["account"], 0) + r["amount"]
    for r in accounts:
        if r["balance"] != OPENING + booked.get(r["id"], 0):
            expected = OPENING + booked.get(r["id"], 0)
            out.append(f"account {r['id']}: balance {r['balance']}, opening + ledger {expected}")
    return out
