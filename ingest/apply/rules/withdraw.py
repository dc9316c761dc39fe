"""Take the winners the quality gate holds out of the reduction, with every earlier change of their keys.

The earlier changes were only superseded by the held winner; holding them with it keeps the key's
whole story in quarantine (a replay applies it as the batch would have, TOAST fills included) and
each message in exactly one audit term: they move from superseded to quarantined. Changes older
than the batch's truncate stay superseded by the truncate, which still applies.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.apply.rules.reduce import Reduction
from ingest.apply.rules.sql import connect, ident, literal, query

if TYPE_CHECKING:
    from ingest.apply.pipeline import Held
    from ingest.quality.gate import QualityReport


def withdraw(reduction: Reduction, changes: pa.Table, report: QualityReport, held: Held) -> None:
    """Move the held winners and their keys' earlier changes from ``reduction`` into ``held``."""
    winners = reduction.winners
    key_columns = json.loads(winners["_cdc_key_columns"][0].as_py())
    indices = sorted(report.held)
    chosen = winners.take(pa.array(indices, pa.int64()))
    info = pa.table({
        **{k: chosen[k] for k in key_columns},
        "w_partition": chosen["_cdc_partition"], "w_offset": chosen["_cdc_offset"], "w_topic": chosen["_cdc_topic"],
        "w_reason": pa.array([report.held[i].reason for i in indices], pa.string()),
        "w_expectations": pa.array([json.dumps(list(dict.fromkeys(report.held[i].expectations))) for i in indices],
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
    row_keys = [json.dumps(_key(row, key_columns), default=str) for row in out.select(key_columns).to_pylist()]
    held.add_rows(out, "quality", out["w_reason"].to_pylist(), out["w_expectations"].to_pylist(), row_keys)
    keep = pc.invert(pc.is_in(pa.array(range(winners.num_rows), pa.int64()), pa.array(indices, pa.int64())))
    reduction.winners = winners.filter(keep)
    reduction.superseded -= out.num_rows - len(indices)


def _key(row: dict[str, Any], key_columns: list[str]) -> dict[str, Any]:
    return {k: row[k] for k in key_columns}
