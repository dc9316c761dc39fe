"""The cut calculus on its own: which boundary the tables' versions are exact for, and why not."""

from __future__ import annotations

import pytest

from ingest.cuts.calculus import TableHistory, Transaction, Unprovable, Version, choose
from ingest.model import SourceMark

A, B = "public.a", "public.b"


def txn(i: int, **counts: int) -> Transaction:
    return Transaction(f"t{i}", 0, i, None, {f"public.{k}": n for k, n in counts.items()})


def mark(i: int, order: int, snapshot: str = "closed") -> SourceMark:
    return SourceMark(f"t{i}", order, f"s{i:04d}{order:02d}", snapshot)  # type: ignore[arg-type]


def table(collection: str, *versions: tuple[int, SourceMark], at_cut: Version | None = None) -> TableHistory:
    return TableHistory(collection, at_cut, [Version(v, m) for v, m in versions])


T = [txn(1, a=1, b=2), txn(2, a=1), txn(3, a=1, b=1)]


def test_a_cut_needs_every_change_of_its_transaction_in_every_table():
    # b holds one of t1's two changes: no version of it is exact for any boundary yet
    choice = choose(T[:1], {"a": table(A, (0, mark(1, 1))), "b": table(B, (0, mark(1, 1)))})
    assert choice.transaction is None
    assert choice.waiting == {"b": "holds 1 of the 2 changes of transaction t1"}
    choice = choose(T[:1], {"a": table(A, (0, mark(1, 1))), "b": table(B, (0, mark(1, 1)), (1, mark(1, 2)))})
    assert choice.transaction == T[0] and choice.versions == {"a": 0, "b": 1}


def test_a_table_no_later_transaction_touched_is_exact_for_them_too():
    # t2 touches only a: b's version after t1 is exact for the boundary after t2
    choice = choose(T[:2], {"a": table(A, (0, mark(1, 1)), (1, mark(2, 1))), "b": table(B, (0, mark(1, 2)))})
    assert choice.transaction == T[1] and choice.versions == {"a": 1, "b": 0}


def test_an_earlier_version_serves_when_the_latest_holds_part_of_a_transaction():
    # a applied t3, b not yet: the latest common boundary is t2's, with a's version before t3
    tables = {"a": table(A, (0, mark(1, 1)), (1, mark(2, 1)), (2, mark(3, 1))), "b": table(B, (0, mark(1, 2)))}
    choice = choose(T, tables)
    assert choice.transaction == T[1] and choice.versions == {"a": 1, "b": 0}


def test_transactions_of_tables_outside_the_group_do_not_block():
    outside = [txn(1, a=1), Transaction("t2", 0, 2, None, {"public.other": 5})]
    choice = choose(outside, {"a": table(A, (0, mark(1, 1)))})
    assert choice.transaction == outside[1]


def test_a_table_without_commits_is_exact_until_a_transaction_touches_it():
    choice = choose(T[1:2], {"a": table(A, (0, mark(2, 1))), "b": table(B)})
    assert choice.transaction == T[1] and choice.versions == {"a": 0, "b": None}
    choice = choose(T, {"a": table(A, (0, mark(1, 1)), (1, mark(2, 1)), (2, mark(3, 1))), "b": table(B)})
    assert choice.transaction is None  # t1 touched b, whose changes have not come


def test_no_cut_while_a_snapshot_is_read_or_before_the_end_record():
    reading = SourceMark(snapshot="open")
    choice = choose(T[1:2], {"a": table(A, (0, mark(2, 1))), "b": table(B, (0, reading))})
    assert choice.transaction is None and choice.waiting == {"b": "its initial snapshot is still being read"}
    choice = choose(T[:1], {"a": table(A, (0, mark(1, 1)), (1, mark(2, 1))), "b": table(B, (0, mark(1, 2)))})
    assert choice.transaction == T[0] and choice.versions == {"a": 0, "b": 0}
    assert choice.waiting == {"a": "transaction t2 has no END record yet"}


def test_the_last_cuts_version_is_exact_until_the_table_is_touched_again():
    at_cut = Version(4, mark(0, 1))  # t0: before these transactions, named by the last cut
    choice = choose(T[1:2], {"a": table(A, (5, mark(2, 1))), "b": table(B, at_cut=at_cut)})
    assert choice.transaction == T[1] and choice.versions == {"a": 5, "b": 4}


def test_changes_without_a_transaction_block_cannot_be_placed():
    with pytest.raises(Unprovable, match="3 of its streamed changes carry no transaction block"):
        choose(T[:1], {"a": table(A, (0, SourceMark(untracked=3)))})


def test_a_cut_names_what_its_tables_quarantined_since_the_last():
    at_cut = Version(3, mark(0, 1))
    a = TableHistory(A, at_cut, [Version(4, mark(1, 1), quarantined=2), Version(5, mark(2, 1), quarantined=1)])
    choice = choose(T[:1], {"a": a, "b": table(B, (7, mark(1, 2)))})
    assert choice.versions == {"a": 4, "b": 7}
    assert choice.quarantined == {"a": 2, "b": 0}  # version 5 is after the cut: its count waits for the next
