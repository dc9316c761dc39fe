"""Take the winners the quality gate holds out of the reduction, with every earlier change of their keys.

The earlier changes were only superseded by the held winner; holding them with it keeps the key's
whole story in quarantine (a replay applies it as the batch would have, TOAST fills included) and
each message in exactly one audit term: they move from superseded to quarantined. Changes older
than the batch's truncate stay superseded by the truncate, which still applies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ingest.model import key_text
from ingest.rules.reduce import Reduction
from ingest.rules.sql import connect, ident, literal, query


class Hold(Protocol):
    """Why the gate holds one winner (:class:`ingest.quality.verdict.Hold`)."""

    expectations: list[str]

    @property
    def reason(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """What :func:`withdraw` takes out: the changes bound for quarantine, one reason and the
    expectations (a JSON list) each, and the key each belongs to (JSON)."""

    rows: pa.Table
    reasons: Sequence[str]
    expectations: Sequence[str]
    row_keys: Sequence[str]


def withdraw(reduction: Reduction, changes: pa.Table, held: Mapping[int, Hold]) -> Withdrawal:
    """Take the winners ``held`` names (by index) and their keys' earlier changes out of ``reduction``."""
    winners = reduction.winners
    key_columns = json.loads(winners["_cdc_key_columns"][0].as_py())
    indices = sorted(held)
    chosen = winners.take(pa.array(indices, pa.int64()))
    info = pa.table({
        **{k: chosen[k] for k in key_columns},
        "w_partition": chosen["_cdc_partition"], "w_offset": chosen["_cdc_offset"], "w_topic": chosen["_cdc_topic"],
        "w_reason": pa.array([held[i].reason for i in indices], pa.string()),
        "w_expectations": pa.array([json.dumps(list(dict.fromkeys(held[i].expectations))) for i in indices],
                                   pa.string()),
    })
    rows = changes.filter(pc.not_equal(changes["_cdc_op"], "t"))
    con = connect(rows=rows, info=info)
    try:
        match = " AND ".join(f"r.{ident(k)} = i.{ident(k)}" for k in key_columns)
        cut = ""
        if reduction.truncate is not None:
            t = reduction.truncate
            # In the batch order (position, then lower coordinates last) a change before the truncate stays superseded.
            cut = (f"AND (r._cdc_position > {literal(t.position)} OR (r._cdc_position = {literal(t.position)} "
                   f"AND (r._cdc_partition < {t.partition} OR (r._cdc_partition = {t.partition} "
                   f"AND r._cdc_offset < {t.offset}))))")
        out = query(con, f"""
            SELECT r.*, CASE WHEN r._cdc_partition = i.w_partition AND r._cdc_offset = i.w_offset THEN i.w_reason
                        ELSE 'held with the later change of its key at ' || i.w_topic || '[' || i.w_partition || ']@'
                             || i.w_offset || ': ' || i.w_reason END AS w_reason, i.w_expectations
            FROM rows r JOIN info i ON {match} WHERE TRUE {cut} ORDER BY r._cdc_partition, r._cdc_offset""")
    finally:
        con.close()
    row_keys = [key_text(row) for row in out.select(key_columns).to_pylist()]
    keep = pc.invert(pc.is_in(pa.array(range(winners.num_rows), pa.int64()), pa.array(indices, pa.int64())))
    reduction.winners = winners.filter(keep)
    reduction.superseded -= out.num_rows - len(indices)
    return Withdrawal(out, out["w_reason"].to_pylist(), out["w_expectations"].to_pylist(), row_keys)

