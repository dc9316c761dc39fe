"""The simulated write-ahead log: LSNs, transaction ids and commit order.

Transactions are placed in *commit* order, which is the order PostgreSQL's logical decoding (and
so Debezium) emits them. Every change of a transaction gets an LSN that grows within the
transaction; each transaction remembers the commit LSN of the one before it, which Debezium
reports as the first element of ``source.sequence``. :meth:`Wal.place_interleaved` lays out two
transactions the way concurrent sessions do: the later-committing one started first, so its
changes begin lower in the WAL than any change of the earlier-committing one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from harness.simulator.model import Key, Row


@dataclass(slots=True)
class Change:
    """One row change inside a transaction.

    Args:
        table: table name.
        op: ``c``, ``u``, ``d`` or ``t``.
        key: primary key (``None`` for a truncate).
        before: the old image as sent (full, key-only or ``None`` by replica identity).
        after: the new image as sent (may hold the TOAST placeholder).
        row: the true row image, to model malformed look-alikes on.
        lsn: WAL position of the change, set when the transaction is placed.
    """

    table: str
    op: str
    key: Key | None
    before: Row | None
    after: Row | None
    row: Row | None
    lsn: int = 0


@dataclass(slots=True)
class Transaction:
    """A committed transaction: its changes, xid, commit LSN and the commit LSN before it."""

    commit_us: int
    changes: list[Change] = field(default_factory=list)
    txid: int = 0
    commit_lsn: int = 0
    last_commit: int | None = None


class Wal:
    """Hands out WAL positions and xids.

    Args:
        rng: randomness for record sizes.
        start_lsn: the current WAL position (the snapshot's consistent point).
        next_txid: the xid of the snapshot transaction; streamed transactions follow it.
    """

    def __init__(self, rng: random.Random, start_lsn: int, next_txid: int) -> None:
        self._rng = rng
        self.lsn = start_lsn
        self.txid = next_txid
        #: Commit LSN of the last placed transaction; the stream resumes after the snapshot point.
        self.last_commit: int = start_lsn

    def _step(self) -> int:
        self.lsn += self._rng.randint(6, 60) * 8  # WAL records are 8-byte aligned
        return self.lsn

    def place(self, txn: Transaction) -> None:
        """Give a transaction its xid and positions; it commits after everything placed before."""
        self.txid += 1
        txn.txid = self.txid
        for change in txn.changes:
            change.lsn = self._step()
        txn.commit_lsn = self._step()
        txn.last_commit, self.last_commit = self.last_commit, txn.commit_lsn

    def place_interleaved(self, first: Transaction, second: Transaction) -> None:
        """``second`` commits after ``first`` but began earlier: its changes start lower in the WAL."""
        self.txid += 2
        second.txid, first.txid = self.txid - 1, self.txid  # it took its xid first, too
        labels = [1] * len(first.changes) + [2] * (len(second.changes) - 1)
        self._rng.shuffle(labels)
        firsts, seconds = iter(first.changes), iter(second.changes)
        for label in [2, *labels]:
            next(firsts if label == 1 else seconds).lsn = self._step()
        first.commit_lsn = self._step()
        second.commit_lsn = self._step()
        first.last_commit = self.last_commit
        second.last_commit = first.commit_lsn
        self.last_commit = second.commit_lsn
