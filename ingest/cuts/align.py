"""Ending every table of a group at one transaction boundary in each micro-batch.

Each table's share of a micro-batch ends where its topic's read ended: bounded by
``max_records_per_table``, or at the topic's end while the connector is still writing a
transaction's changes. Left alone, the tables would rarely end at the same source transaction,
and a cut needs a version of every table that does (:mod:`ingest.cuts.calculus`). So before the
tables apply a micro-batch, :func:`boundary` finds the newest boundary every table's records reach,
and :func:`trim` leaves each table's records after it -- the *tail*, a part of one transaction at
most per table in the steady state -- out of this batch. Nothing is held in memory: the tail's
offsets are not recorded in the Delta log, so the next micro-batch reads them again (the stream
checkpoint has moved past them; the engine reads the gap from the source).

A tail longer than a micro-batch's bound (``max_records_per_batch``) is not left out: a transaction
larger than a batch is applied in parts, and delays the cut until its last part is in; a table that
runs ahead of a lagging one of its group by more than that goes on without waiting. Nor is a tail
left out at the end of what an ``available_now`` run reads.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingest.cuts.calculus import Transaction, transaction_keys
from ingest.model import SourceMark


@dataclass(frozen=True, slots=True)
class Reach:
    """What one table can apply this batch, as far as transactions go.

    Attributes:
        collection: its data collection in the transaction topic.
        stored: its mark before this batch (what its Delta log holds).
        newest: the mark of its newest transactional change among this batch's records that the
            table does not hold yet (``None``: no such change).
    """

    collection: str
    stored: SourceMark
    newest: SourceMark | None


def boundary(transactions: Sequence[Transaction], tables: Mapping[str, Reach]) -> int:
    """The newest boundary (0: the last cut; ``i``: the end of ``transactions[i - 1]``) up to which every
    table has every change, with what it holds and this batch's records."""
    index = transaction_keys(transactions)
    n = len(transactions)
    reach = n
    for table in tables.values():
        touches = [i for i, t in enumerate(transactions, start=1) if t.counts.get(table.collection, 0) > 0]

        def next_touch(after: int, touches: list[int] = touches) -> int:
            at = bisect_right(touches, after)
            return touches[at] if at < len(touches) else n + 1

        mark = table.newest or table.stored
        at = index.get(mark.txn) if mark.txn is not None else None
        if at is None:
            # no transactional change, one from before the last cut, or (newest) one whose END is not
            # read yet -- which comes after every END read: the table has all of theirs
            reach = min(reach, n if table.newest is not None else next_touch(0) - 1)
        elif mark.txn_order == transactions[at - 1].counts.get(table.collection, 0):
            reach = min(reach, next_touch(at) - 1)
        else:
            reach = min(reach, at - 1)
    return reach


def newest_mark(rows: pa.Table, stored: SourceMark) -> SourceMark | None:
    """The mark of the newest transactional change in ``rows`` (framework columns of parts) that is newer
    than ``stored``."""
    fresh = _fresh(rows, stored)
    if fresh is None or not pc.any(fresh).as_py():
        return None
    mine = rows.filter(fresh)
    last = pc.index(mine["_cdc_position"], pc.max(mine["_cdc_position"])).as_py()
    return SourceMark(mine["_cdc_txn"][last].as_py(), mine["_cdc_txn_order"][last].as_py(),
                      mine["_cdc_position"][last].as_py(), "closed")


def tail_starts(rows: pa.Table, stored: SourceMark, transactions: Sequence[Transaction], reach: int
                ) -> dict[int, int]:
    """Per partition, the first offset of ``rows`` that belongs after boundary ``reach``: a change, newer
    than ``stored``, of a later transaction or of one whose END is not read yet."""
    fresh = _fresh(rows, stored)
    if fresh is None:
        return {}
    keys = transaction_keys(transactions)
    later = pa.array([k for k, i in keys.items() if i > reach], pa.string())
    known = pa.array(list(keys), pa.string())
    beyond = pc.and_(fresh, pc.or_(pc.is_in(rows["_cdc_txn"], later), pc.invert(pc.is_in(rows["_cdc_txn"], known))))
    found = rows.filter(beyond)
    if not found.num_rows:
        return {}
    grouped = pa.table({"p": found["_cdc_partition"], "o": found["_cdc_offset"]}).group_by(
        "p", use_threads=False).aggregate([("o", "min")])
    return dict(zip(grouped["p"].to_pylist(), grouped["o_min"].to_pylist(), strict=True))


def trim(parts: Sequence[pa.RecordBatch], starts: Mapping[int, int]) -> tuple[list[pa.RecordBatch], int]:
    """``parts`` without their rows at or after each partition's start offset; and how many were left out."""
    if not starts:
        return list(parts), 0
    partitions = pa.array(list(starts), pa.int32())
    limits = pa.array(list(starts.values()), pa.int64())
    kept, dropped = [], 0
    for part in parts:
        at = pc.index_in(part["_cdc_partition"], value_set=partitions)
        keep = pc.fill_null(pc.less(part["_cdc_offset"], pc.take(limits, at)), True)
        left = part.filter(keep)
        dropped += part.num_rows - left.num_rows
        if left.num_rows:
            kept.append(left)
    return kept, dropped


def _fresh(rows: pa.Table, stored: SourceMark) -> pa.ChunkedArray | None:
    """Which rows are transactional changes newer than ``stored`` (``None``: ``rows`` has no change column)."""
    if "_cdc_txn" not in rows.column_names or not rows.num_rows:
        return None
    tracked = pc.is_valid(rows["_cdc_txn"])
    if stored.txn_position is None:
        return tracked
    return pc.and_(tracked, pc.fill_null(pc.greater(rows["_cdc_position"], stored.txn_position), False))
