"""Which cut the tables' versions allow: a pure function of the transaction topic and each table's marks.

A table's commit carries its :class:`~ingest.model.SourceMark`: the latest transactional change it
has received (its transaction and its place among that transaction's changes of the table). A
table's topic holds its changes in the source's commit order (Debezium writes them so; a copy sent
again after a connector restart repeats an earlier change and moves no mark), so every change of
the table up to its mark is in the version too. The transaction topic's END record of each
transaction counts its changes per table. Together they say, for each version, the range of
transaction boundaries it is exact for:

* its mark's transaction T is complete in it (the mark's place equals T's count for the table),
  and no later transaction has touched the table yet: the version holds exactly the transactions
  up to any boundary from T to just before the table's next transaction;
* otherwise it holds part of T, and is exact for no boundary.

A cut is the latest boundary that a version of every table is exact for. Nothing here guesses:
a mark whose transaction has no END yet, a snapshot still being read, or changes without a
transaction block make a version exact for nothing, and say why (:attr:`Choice.waiting`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ingest.model import SourceMark


@dataclass(frozen=True, slots=True)
class Transaction:
    """One END record of the transaction topic: a committed source transaction."""

    id: str
    partition: int
    offset: int
    commit_ts: datetime | None
    #: changes per data collection (``<schema>.<table>``), as the END record counts them
    counts: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Version:
    """One commit of a table: its Delta version, its mark, and what it quarantined."""

    version: int
    mark: SourceMark
    quarantined: int = 0


@dataclass(frozen=True, slots=True)
class TableHistory:
    """A table of the group as the calculus sees it.

    Attributes:
        collection: its data collection in the transaction topic (``<schema>.<table>``).
        at_cut: its version in the last cut (``None``: no cut yet, or the table had no commit then).
        since: its commits after that version, oldest first.
    """

    collection: str
    at_cut: Version | None
    since: Sequence[Version]

    @property
    def versions(self) -> list[Version]:
        return [self.at_cut, *self.since] if self.at_cut is not None else list(self.since)


@dataclass(frozen=True, slots=True)
class Choice:
    """The newest cut the tables allow, or why there is none newer than the last.

    Attributes:
        transaction: the boundary (``None``: no newer cut).
        versions: per table, the version that holds exactly the transactions up to it (``None``:
            the table has no commit yet, and no transaction up to it touched it).
        marks: per table, the chosen version's mark (the next cut's ``at_cut``).
        quarantined: per table, what its versions since the last cut quarantined.
        waiting: per table that holds the group back, why.
    """

    transaction: Transaction | None
    versions: dict[str, int | None] = field(default_factory=dict)
    marks: dict[str, SourceMark] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)


def transaction_keys(transactions: Sequence[Transaction]) -> dict[str, int]:
    """Each transaction's place (1, 2, ...) by the ids its changes may carry: its END record's id, and
    for PostgreSQL's ``<txId>:<LSN>`` the ``txId`` (its changes carry their own LSN after it)."""
    out: dict[str, int] = {}
    for i, t in enumerate(transactions, start=1):
        out[t.id] = i
        head, colon, tail = t.id.partition(":")
        if colon and head.isdigit() and tail.isdigit():
            out[head] = i
    return out


class Unprovable(Exception):
    """A table's changes cannot be placed among the source's transactions (no transaction block)."""


def choose(transactions: Sequence[Transaction], tables: Mapping[str, TableHistory]) -> Choice:
    """The newest cut among ``transactions`` (END records after the last cut, in topic order).

    Boundary 0 stands for the last cut (or the source's start); boundary ``i`` for the end of
    ``transactions[i - 1]``.

    Raises:
        Unprovable: a table received streamed changes without a transaction block.
    """
    index = transaction_keys(transactions)
    n = len(transactions)
    ranges: dict[str, list[tuple[int, int, Version | None]]] = {}
    waiting: dict[str, str] = {}
    for name, table in tables.items():
        touches = [i for i, t in enumerate(transactions, start=1) if t.counts.get(table.collection, 0) > 0]

        def next_touch(after: int, touches: list[int] = touches) -> int:
            at = bisect_right(touches, after)
            return touches[at] if at < len(touches) else n + 1

        spans: list[tuple[int, int, Version | None]] = []
        history = table.versions
        if not history:
            spans.append((0, next_touch(0) - 1, None))
        for version in history:
            span, why = _exact_for(version.mark, table, index, transactions, next_touch)
            if span is not None:
                spans.append((*span, version))
            elif version is history[-1]:
                waiting[name] = why
        ranges[name] = [s for s in spans if s[0] <= s[1]]
    best = _latest_common(ranges, n)
    if best is None:
        return Choice(None, waiting=waiting)
    versions: dict[str, int | None] = {}
    marks: dict[str, SourceMark] = {}
    quarantined: dict[str, int] = {}
    for name, spans in ranges.items():
        chosen = max((s[2] for s in spans if s[0] <= best <= s[1]),
                     key=lambda v: -1 if v is None else v.version)
        versions[name] = None if chosen is None else chosen.version
        marks[name] = SourceMark() if chosen is None else chosen.mark
        quarantined[name] = sum(v.quarantined for v in tables[name].since
                                if chosen is not None and v.version <= chosen.version)
    return Choice(transactions[best - 1], versions, marks, quarantined, waiting)


def _exact_for(mark: SourceMark, table: TableHistory, index: Mapping[str, int],
               transactions: Sequence[Transaction], next_touch: Callable[[int], int]
               ) -> tuple[tuple[int, int] | None, str]:
    """The boundaries a version with ``mark`` is exact for, or why it is exact for none."""
    if mark.untracked:
        raise Unprovable(f"{mark.untracked} of its streamed changes carry no transaction block: enable the "
                         "connector's provide.transaction.metadata, and do not flatten the envelope")
    if mark.snapshot == "open":
        return None, "its initial snapshot is still being read"
    if mark.txn is None or (table.at_cut is not None and mark.txn == table.at_cut.mark.txn):
        return (0, next_touch(0) - 1), ""
    at = index.get(mark.txn)
    if at is None:
        return None, f"transaction {mark.txn} has no END record yet"
    expected = transactions[at - 1].counts.get(table.collection, 0)
    if mark.txn_order != expected:
        return None, f"holds {mark.txn_order} of the {expected} changes of transaction {mark.txn}"
    return (at, next_touch(at) - 1), ""


def _latest_common(ranges: Mapping[str, list[tuple[int, int, Version | None]]], n: int) -> int | None:
    """The greatest boundary in 1..n that every table has a span over, if any (it ends some span,
    or is ``n``)."""
    candidates = sorted({min(hi, n) for spans in ranges.values() for _, hi, _ in spans} | {n}, reverse=True)
    for k in candidates:
        if k >= 1 and all(any(lo <= k <= hi for lo, hi, _ in spans) for spans in ranges.values()):
            return k
    return None
