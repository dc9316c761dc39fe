"""Reduce a micro-batch to at most one change per key, by source position.

See docs/architecture.md#ordering, #truncate, #idempotent-replay and #toast-and-debezium-types.

SQL over the batch's Arrow ``changes`` (:mod:`ingest.rules.sql`); when nothing is to be filled (no
TOAST placeholder in the batch, hard-delete mode), Arrow's hash aggregation picks the same winners.
The batch order is :func:`ingest.rules.ordering.batch_order`: by position, and among copies of one
position the lowest Kafka coordinates last, so the last change of a key in that order -- its
*winner* -- is the latest one and, of several copies, the first delivered. Everything the winner
replaces is *superseded in batch*. The latest truncate supersedes every change before it; earlier
truncates are superseded by it.

A key's history is cut into *lives* by its deletes (an image before a delete describes another life
of the row). Two fills keep the outcome independent of how the stream was cut into batches:

* an unchanged-TOAST placeholder in a winner is filled from the newest earlier image of the same
  life that holds the column, remembering that image's position (``_cdc_fill_<n>``): the merge plan
  keeps the stored value instead when the stored row is newer than that image (a redelivered old
  duplicate must not win). Without an earlier image the MERGE keeps the stored value;
* in soft-delete mode a winning delete takes the values its before image lacks (PostgreSQL sends
  only the key by default) from the newest earlier image of its life: what the table would hold
  had the earlier change come in an earlier batch.

In soft-delete mode the last change of each key that only has changes before the truncate is kept
as a *truncated* row (``_cdc_truncated``): the table then holds it flagged deleted, as if the change
had been applied in one batch and the truncate in the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import normalize
from ingest.model import ColumnSpec
from ingest.rules.sql import connect, ident, key_list, literal, query


@dataclass(frozen=True, slots=True)
class TruncateMark:
    """The batch's latest truncate."""

    position: str
    partition: int
    offset: int


@dataclass(slots=True)
class Reduction:
    """The outcome of reducing one table's batch.

    Attributes:
        winners: the latest change per key: the batch's columns, TOAST fills applied, and for each
            column of :attr:`toast_columns` a ``_cdc_fill_<n>`` column (the filling image's position).
        toast_columns: columns that held an unchanged-TOAST placeholder somewhere in the batch.
        truncate: the latest truncate of the batch, if any.
        truncates: truncate events seen (the latest applies, earlier ones are superseded).
        superseded: changes replaced by a later change of the same key or by a truncate.
        truncated: soft-delete mode: the last change of each key the truncate superseded entirely.
    """

    winners: pa.Table
    toast_columns: list[str] = field(default_factory=list)
    truncate: TruncateMark | None = None
    truncates: int = 0
    superseded: int = 0
    truncated: pa.Table | None = None

    def winners_count(self) -> int:
        return self.winners.num_rows


def reduce_changes(changes: pa.Table, key_columns: tuple[str, ...], columns: list[ColumnSpec], *,
                   soft: bool = False, fills: list[str] | None = None) -> Reduction:
    """Keep the latest change per key (see module docstring).

    ``fills``: the columns to fill from earlier images, default those holding an unchanged-TOAST
    placeholder in ``changes``. A share of a larger batch (:mod:`ingest.apply.placement.executors.reduction`) passes the
    whole batch's, so every share's winners have the same columns.
    """
    columns = [c for c in columns if c.name in changes.column_names]
    ordered = changes.append_column("_cdc_ord", pc.cast(_batch_order(changes), pa.int64()))
    # The truncates, the TOAST columns and the count are Arrow compute: a DuckDB query costs several
    # milliseconds however small its input, and a batch over 200 tables runs 200 reductions.
    is_truncate = pc.equal(ordered["_cdc_op"], "t")
    marks = ordered.filter(is_truncate)
    truncate, cutoff = None, None
    if marks.num_rows:
        last = marks.slice(pc.index(marks["_cdc_ord"], pc.max(marks["_cdc_ord"])).as_py(), 1).to_pylist()[0]
        truncate = TruncateMark(last["_cdc_position"], last["_cdc_partition"], last["_cdc_offset"])
        cutoff = last["_cdc_ord"]
    fills = _toast_columns(ordered, [c.name for c in columns]) if fills is None else [
        c.name for c in columns if c.name in fills]
    changed = ordered.num_rows - marks.num_rows
    if not fills and not soft:
        winners = _latest_per_key(ordered, key_columns, cutoff)
        if winners is not None:
            return Reduction(winners=winners, truncate=truncate, truncates=marks.num_rows,
                             superseded=(marks.num_rows - 1 if marks.num_rows else 0) + changed - winners.num_rows)
    con = connect(ordered=ordered)
    try:
        after = f"_cdc_ord > {cutoff}" if cutoff is not None else "TRUE"
        winners = query(con, _winners_sql(key_columns, columns, fills, after, fill_deletes=soft))
        truncated = None
        if soft and cutoff is not None:
            before = query(con, _winners_sql(key_columns, columns, fills, f"_cdc_ord < {cutoff}", fill_deletes=True))
            truncated = _without_keys(con, before, winners, key_columns)
    finally:
        con.close()
    superseded = (marks.num_rows - 1 if marks.num_rows else 0) + changed - winners.num_rows
    return Reduction(winners=winners, toast_columns=fills, truncate=truncate, truncates=marks.num_rows,
                     superseded=superseded, truncated=truncated)


def nulls_as_unchanged(changes: pa.Table, key_columns: tuple[str, ...], columns: list[ColumnSpec]) -> pa.Table:
    """``ignore_null_updates``: every null non-key column of an update (or of a primary-key update's
    new row) is listed in ``_cdc_toast``.

    The column then goes the way of an unchanged-TOAST placeholder: filled from the key's earlier
    image in the batch or from the stored row, and listed in ``_cdc_unknown_columns`` when neither
    exists (an update that carries only its changed columns does not say the others are null).
    """
    names = [c.name for c in columns if c.name not in key_columns and c.name in changes.column_names]
    if not names or not changes.num_rows:
        return changes
    # The new row of a primary-key update (it names its old key) is an update of the old row.
    update = "(_cdc_op = 'u' OR (_cdc_op = 'c' AND _cdc_old_key IS NOT NULL))" \
        if "_cdc_old_key" in changes.column_names else "_cdc_op = 'u'"
    nulls = ", ".join(f"CASE WHEN {update} AND {ident(n)} IS NULL THEN {literal(n)} END" for n in names)
    con = connect(c=changes)
    try:
        out = query(con, f"""
            SELECT * REPLACE (CASE WHEN len(_cdc_toast) > 0 THEN _cdc_toast END AS _cdc_toast)
            FROM (SELECT * REPLACE (list_distinct(list_filter(list_concat(coalesce(_cdc_toast, []), [{nulls}]),
                                                               lambda x: x IS NOT NULL)) AS _cdc_toast) FROM c)""")
    finally:
        con.close()
    return out.cast(changes.schema)


def _batch_order(changes: pa.Table) -> pa.Array:
    """Rank of every change in the batch order (1 = first): the inverse of the sorting permutation."""
    order = pc.sort_indices(changes, sort_keys=[("_cdc_position", "ascending"), ("_cdc_partition", "descending"),
                                                ("_cdc_offset", "descending")])
    return pc.add(pc.sort_indices(order), 1)


def _latest_per_key(ordered: pa.Table, key_columns: tuple[str, ...], cutoff: int | None) -> pa.Table | None:
    """The winners when nothing is filled: each key's last change after the truncate, in batch order.

    Arrow's hash aggregation, about four times cheaper than the window query the fills need
    (``None``: a key type Arrow cannot group by; the query then does it).
    """
    keep = pc.not_equal(ordered["_cdc_op"], "t")
    if cutoff is not None:
        keep = pc.and_(keep, pc.greater(ordered["_cdc_ord"], cutoff))
    rows = ordered.filter(keep)
    try:
        last = rows.group_by(list(key_columns), use_threads=False).aggregate([("_cdc_ord", "max")])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    winners = rows.filter(pc.is_in(rows["_cdc_ord"], value_set=last["_cdc_ord_max"]))
    winners = winners.take(pc.sort_indices(winners["_cdc_ord"]))
    i = winners.schema.get_field_index("_cdc_toast")
    if i >= 0:  # an empty list says nothing is unknown, as a null does
        toast = winners.column(i)
        empty = pc.equal(pc.list_value_length(toast), 0)
        winners = winners.set_column(i, winners.field(i), pc.if_else(empty, pa.scalar(None, toast.type), toast))
    return normalize(winners)  # the types the query returns (plain string and binary)


def _toast_columns(changes: pa.Table, user: list[str]) -> list[str]:
    """The user columns that hold an unchanged-TOAST placeholder somewhere in the batch, in table order."""
    if "_cdc_toast" not in changes.column_names or not changes.num_rows:
        return []
    present = set(pc.unique(pc.list_flatten(changes["_cdc_toast"])).to_pylist())
    return [c for c in user if c in present]


def _winners_sql(key_columns: tuple[str, ...], columns: list[ColumnSpec], toast: list[str], where: str, *,
                 fill_deletes: bool) -> str:
    """The last change per key among the rows matching ``where``, with the fills of the module docstring."""
    keys = key_list(key_columns)
    life = (f"coalesce(sum(CASE WHEN _cdc_op = 'd' THEN 1 ELSE 0 END) OVER (PARTITION BY {keys} ORDER BY _cdc_ord "
            "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)")
    window = f"(PARTITION BY {keys}, _cdc_life ORDER BY _cdc_ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
    extra, replace = [], []
    for n, name in enumerate(toast):
        col, known = ident(name), f"NOT list_contains(coalesce(_cdc_toast, []), {literal(name)})"
        extra.append(f"max_by({col}, _cdc_ord) FILTER (WHERE _cdc_op <> 'd' AND {known}) OVER {window} AS _cdc_fv_{n}")
        extra.append(f"max_by(_cdc_position, _cdc_ord) FILTER (WHERE _cdc_op <> 'd' AND {known}) OVER {window} "
                     f"AS _cdc_fill_{n}")
    if fill_deletes:
        for n, c in enumerate(columns):
            if c.name in key_columns:
                continue
            col = ident(c.name)
            known = f"NOT list_contains(coalesce(_cdc_toast, []), {literal(c.name)})"
            extra.append(f"max_by({col}, _cdc_ord) FILTER (WHERE _cdc_op <> 'd' AND {known}) OVER {window} "
                         f"AS _cdc_dv_{n}")
    index = {c.name: n for n, c in enumerate(columns)}
    for n, name in enumerate(toast):
        col, placeholder = ident(name), f"list_contains(coalesce(_cdc_toast, []), {literal(name)})"
        # a soft delete keeps a TOAST column's value too
        deleted = f"WHEN _cdc_op = 'd' THEN coalesce({col}, _cdc_dv_{index[name]}) " if fill_deletes else ""
        replace.append(f"CASE {deleted}WHEN _cdc_op <> 'd' AND {placeholder} AND _cdc_fill_{n} IS NOT NULL "
                       f"THEN _cdc_fv_{n} ELSE {col} END AS {col}")
    if fill_deletes:
        for n, c in enumerate(columns):
            if c.name in key_columns or c.name in toast:
                continue
            col = ident(c.name)
            replace.append(f"CASE WHEN _cdc_op = 'd' THEN coalesce({col}, _cdc_dv_{n}) ELSE {col} END AS {col}")
    filled = " OR ".join(f"(x = {literal(name)} AND _cdc_fill_{n} IS NOT NULL AND _cdc_op <> 'd')"
                         for n, name in enumerate(toast))
    toast_left = f"list_filter(_cdc_toast, lambda x: NOT ({filled}))" if toast else "_cdc_toast"
    replace.append(f"CASE WHEN len({toast_left}) > 0 THEN {toast_left} END AS _cdc_toast")
    fills = [f"CASE WHEN _cdc_op <> 'd' AND list_contains(coalesce(_cdc_toast, []), {literal(name)}) "
             f"THEN _cdc_fill_{n} END AS _cdc_fill_{n}" for n, name in enumerate(toast)]
    if toast:  # a placeholder after a delete of the key cannot keep what the table stores (another life)
        fills.append("_cdc_life > 0 AS _cdc_reborn")
    internal = [f"_cdc_fv_{n}" for n in range(len(toast))] + [f"_cdc_fill_{n}" for n in range(len(toast))]
    internal += [f"_cdc_dv_{n}" for n, c in enumerate(columns) if fill_deletes and c.name not in key_columns]
    return f"""
        WITH rows AS (SELECT *, {life} AS _cdc_life FROM ordered WHERE _cdc_op <> 't' AND {where}),
        history AS (SELECT *, max(_cdc_ord) OVER (PARTITION BY {keys}) AS _cdc_last
                    {''.join(', ' + e for e in extra)} FROM rows)
        SELECT * EXCLUDE (_cdc_life, _cdc_last{''.join(', ' + i for i in internal)})
               REPLACE ({', '.join(replace)}) {''.join(', ' + f for f in fills)}
        FROM history WHERE _cdc_ord = _cdc_last ORDER BY _cdc_ord"""


def _without_keys(con: Any, rows: pa.Table, winners: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    con.register("older", rows)
    con.register("newer", winners.select(list(key_columns)))
    keys = " AND ".join(f"o.{ident(k)} = n.{ident(k)}" for k in key_columns)
    return query(con, f"SELECT o.* FROM older o WHERE NOT EXISTS (SELECT 1 FROM newer n WHERE {keys})")
