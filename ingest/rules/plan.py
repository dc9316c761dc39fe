"""The merge plan: what a reduced batch will do to its table, decided before the MERGE.

See docs/architecture.md#ordering, #deletes, #truncate and #toast-and-debezium-types.

The batch's winners are joined with what the table stores for their keys (and, in hard-delete mode,
with the remembered deletes) and each is classified -- insert, update, delete or stale -- by the
same rule the MERGE's predicates apply (:mod:`ingest.rules.ordering`), so the audit counts what the
commit does. The plan also undoes TOAST fills from images older than the stored row, decides which
columns stay unknown (``_cdc_unknown_columns``), and builds the MERGE's source table. SQL over Arrow
(:mod:`ingest.rules.sql`): no row becomes a Python object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import FRAMEWORK_COLUMNS, arrow_type
from ingest.model import ColumnSpec
from ingest.rules.ordering import later_than_stored_sql, replaces_sql
from ingest.rules.reduce import Reduction
from ingest.rules.sql import connect, ident, literal, query

Action = Literal["insert", "update", "delete", "stale", "truncated", "dropped"]
#: Prefix of the MERGE source's per-column "keep the stored value" flags (unchanged TOAST).
TOAST_FLAG = "__cdc_toast__"
#: Framework column naming the columns whose value is unknown (an unresolved TOAST placeholder).
UNKNOWN_COLUMNS = "_cdc_unknown_columns"
#: What the plan reads of the stored row of a key, beside its key columns: position, Kafka
#: coordinates, soft-delete flag, unknown columns (:func:`ingest.apply.stored.stored_rows`).
STORED_SCHEMA = [("s_pos", pa.string()), ("s_part", pa.int32()), ("s_off", pa.int64()), ("s_deleted", pa.bool_()),
                 ("s_unknown", pa.list_(pa.string()))]


@dataclass(slots=True)
class PlanCounts:
    """What a current-row plan does, counted.

    Attributes:
        inserted, updated, deleted, stale: the audit's apply counts.
        toast_unknown: rows written with a column whose value is unknown.
        matched_deletes: hard deletes that remove a stored row (the MERGE's other deletions are the
            truncate's).
        matched_updates: soft mode: source rows that update a stored row (the MERGE's other updates
            are the truncate's, which flags the rows it covers as deleted).
    """

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    toast_unknown: int = 0
    matched_deletes: int = 0
    matched_updates: int = 0


@dataclass(slots=True)
class MergePlan:
    """One batch's plan for one table.

    Attributes:
        rows: every winner (and kept truncated row) with its ``_cdc_action`` and final columns.
        source: the MERGE source: user columns, framework columns, TOAST flags.
        counts: what it does.
        deletes: the deletes to remember (hard mode): key columns, ``_cdc_position``,
            ``_cdc_source_ts``.
    """

    rows: pa.Table
    source: pa.Table
    counts: PlanCounts = field(default_factory=PlanCounts)
    deletes: pa.Table = field(default_factory=lambda: pa.table({}))


def plan_merge(reduction: Reduction, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
               stored: pa.Table, tombstones: pa.Table | None, old_truncate: str | None, new_truncate: str | None,
               hard: bool) -> MergePlan:
    """Classify the batch's winners against the stored rows (see module docstring)."""
    winners = reduction.winners.append_column(
        "_cdc_truncated", pa.array([False] * reduction.winners.num_rows, pa.bool_()))
    if reduction.truncated is not None and reduction.truncated.num_rows:
        truncated = reduction.truncated.append_column(
            "_cdc_truncated", pa.array([True] * reduction.truncated.num_rows, pa.bool_()))
        winners = pa.concat_tables([winners, truncated.select(winners.column_names)], promote_options="permissive")
    tombs = tombstones if tombstones is not None else pa.schema(
        [stored.schema.field(k) for k in key_columns] + [("_cdc_position", pa.string())]).empty_table()
    con = connect(w=winners, stored=stored, tombs=tombs)
    try:
        rows = query(con, _plan_sql(key_columns, reduction.toast_columns, old_truncate, new_truncate))
    finally:
        con.close()
    actions = rows["_cdc_action"]
    counts = {v["values"]: v["counts"] for v in pc.value_counts(actions).to_pylist()} if rows.num_rows else {}
    live = live_rows(rows, hard=hard)
    deletes = rows.filter(pc.equal(actions, "delete")).select([*key_columns, "_cdc_position", "_cdc_source_ts"])
    done = PlanCounts(
        inserted=counts.get("insert", 0), updated=counts.get("update", 0), deleted=counts.get("delete", 0),
        stale=counts.get("stale", 0),
        toast_unknown=int(pc.sum(pc.is_valid(live[UNKNOWN_COLUMNS])).as_py() or 0) if live.num_rows else 0)
    if hard:
        matched = pc.and_(pc.equal(actions, "delete"), rows["_cdc_stored"]) if rows.num_rows else pa.array([])
        done.matched_deletes = int(pc.sum(matched).as_py() or 0)
    else:
        done.matched_updates = int(pc.sum(live["_cdc_stored"]).as_py() or 0) if live.num_rows else 0
    return MergePlan(rows=rows, source=merge_source(live, columns, reduction.toast_columns, new_truncate),
                     counts=done, deletes=deletes)


def live_rows(rows: pa.Table, *, hard: bool) -> pa.Table:
    """The plan's rows the MERGE writes (its source's rows, before :func:`merge_source` shapes them)."""
    live = rows.filter(pc.is_in(rows["_cdc_action"], pa.array(["insert", "update", "delete", "truncated"])))
    if hard:  # a hard delete of a key the table does not hold changes nothing in it
        live = live.filter(pc.invert(pc.and_(pc.equal(live["_cdc_op"], "d"), pc.invert(live["_cdc_stored"]))))
    return live


def _plan_sql(key_columns: tuple[str, ...], toast: list[str], old_truncate: str | None,
              new_truncate: str | None) -> str:
    pos, new = "w._cdc_position", (literal(new_truncate) if new_truncate else None)
    me = (pos, "w._cdc_partition", "w._cdc_offset")
    them = ("s.s_pos", "s.s_part", "s.s_off")
    on_s = " AND ".join(f"w.{ident(k)} = s.{ident(k)}" for k in key_columns)
    on_t = " AND ".join(f"w.{ident(k)} = t.{ident(k)}" for k in key_columns)
    present = "s.s_pos IS NOT NULL" + (f" AND NOT {later_than_stored_sql(new, 's.s_pos')}" if new else "")
    old = literal(old_truncate) if old_truncate else None
    before_old = f"NOT {later_than_stored_sql(pos, old)}" if old else "FALSE"
    replaces = replaces_sql(me, them)
    # A delete meeting its own tombstone while its row is still there is a replay after a crash between
    # the tombstone write and the MERGE: it must apply again. Otherwise a tombstone buries older changes.
    not_after_tomb = later_than_stored_sql(pos, "t._cdc_position")
    buried = (f"(t._cdc_position IS NOT NULL AND CASE WHEN t._cdc_position = {pos} "
              f"THEN NOT (w._cdc_op = 'd' AND ({present})) ELSE NOT {not_after_tomb} END)")
    reverts = [f"(w._cdc_fill_{n} IS NOT NULL AND s.s_pos IS NOT NULL AND NOT "
               f"{later_than_stored_sql(f'w._cdc_fill_{n}', 's.s_pos')})" for n in range(len(toast))]
    replace = [f"CASE WHEN {r} THEN NULL ELSE w.{ident(name)} END AS {ident(name)}"
               for r, name in zip(reverts, toast, strict=True)]
    back = ", ".join(f"CASE WHEN {r} THEN {literal(name)} END" for r, name in zip(reverts, toast, strict=True))
    # A winner reborn in the batch (its key deleted before it) keeps nothing the table stores.
    reborn = "coalesce(_cdc_reborn, FALSE)" if toast else "FALSE"
    flags = "".join(f"\n               coalesce(list_contains(_cdc_toast, {literal(name)}), FALSE) AND NOT {reborn} "
                    f"AS _cdc_flag_{n}," for n, name in enumerate(toast))
    toast_list = (f"list_filter(list_concat(coalesce(w._cdc_toast, []), [{back}]), lambda x: x IS NOT NULL)"
                  if toast else "coalesce(w._cdc_toast, [])")
    replace.append(f"CASE WHEN len({toast_list}) > 0 THEN {toast_list} END AS _cdc_toast")
    return f"""
        WITH j AS (
            SELECT w.* REPLACE ({', '.join(replace)}),
                   s.s_pos, s.s_deleted, s.s_unknown, ({present}) AS _cdc_present,
                   CASE
                     WHEN w._cdc_truncated THEN
                       CASE WHEN NOT ({before_old}) AND (s.s_pos IS NULL OR {replaces}) THEN 'truncated'
                            ELSE 'dropped' END
                     WHEN ({before_old}) OR (({present}) AND NOT {replaces}) OR {buried} THEN 'stale'
                     WHEN w._cdc_op = 'd' THEN 'delete'
                     WHEN NOT ({present}) OR s.s_deleted THEN 'insert'
                     ELSE 'update'
                   END AS _cdc_action
            FROM w LEFT JOIN stored s ON {on_s} LEFT JOIN tombs t ON {on_t})
        SELECT * EXCLUDE (s_pos, s_deleted, s_unknown, _cdc_present),
               s_pos IS NOT NULL AS _cdc_stored,{flags}
               CASE WHEN _cdc_op = 'd' OR _cdc_toast IS NULL THEN NULL
                    WHEN s_pos IS NULL OR s_deleted OR {reborn} THEN _cdc_toast
                    WHEN len(list_filter(_cdc_toast, lambda x: list_contains(coalesce(s_unknown, []), x))) > 0
                    THEN list_filter(_cdc_toast, lambda x: list_contains(coalesce(s_unknown, []), x))
               END AS {UNKNOWN_COLUMNS}
        FROM j"""


def merge_source(live: pa.Table, columns: list[ColumnSpec], toast: list[str], truncate: str | None, *,
            flagged: list[str] | None = None, now: datetime | None = None) -> pa.Table:
    """The MERGE source: user columns, framework columns and TOAST flags, one row per change.

    A truncated row (soft-delete mode) is written as the truncate left it: flagged deleted,
    ``_cdc_op`` ``t`` at the truncate's position.

    ``flagged``: the TOAST columns that get a "keep the stored value" flag, default those with a flag
    set in ``live``; ``now``: the rows' ``_cdc_ingested_at`` (default: the current time). A share of a
    larger batch (:mod:`ingest.apply.placement.executors.merge_plan`) passes the whole batch's, so every share's source
    has the same columns and time.
    """
    n = live.num_rows
    truncated = pc.and_(live["_cdc_truncated"], pc.not_equal(live["_cdc_op"], "d")) if n else pa.array([], pa.bool_())
    data: dict[str, pa.Array | pa.ChunkedArray] = {}
    for col in columns:
        if col.name in toast:
            flags = live[f"_cdc_flag_{toast.index(col.name)}"] if n else pa.array([], pa.bool_())
            if (col.name in flagged) if flagged is not None else (n and pc.any(flags).as_py()):
                data[TOAST_FLAG + col.name] = flags
        # A column the batch never saw (the table has it) is null, as in any image that lacks it.
        data[col.name] = (live[col.name].cast(arrow_type(col.type)) if col.name in live.column_names
                          else pa.nulls(n, arrow_type(col.type)))
    position = pc.if_else(truncated, pa.scalar(truncate, pa.string()), live["_cdc_position"]) if n and truncate \
        else live["_cdc_position"]
    framework = {
        "_cdc_op": pc.if_else(truncated, "t", live["_cdc_op"]) if n else live["_cdc_op"],
        "_cdc_position": position,
        "_cdc_source_ts": live["_cdc_source_ts"],
        "_cdc_topic": live["_cdc_topic"],
        "_cdc_partition": live["_cdc_partition"],
        "_cdc_offset": live["_cdc_offset"],
        "_cdc_ingested_at": pa.array([now or datetime.now(UTC)] * n, pa.timestamp("us", tz="UTC")),
        "_cdc_deleted": pc.or_(pc.equal(live["_cdc_op"], "d"), truncated) if n else pa.array([], pa.bool_()),
        UNKNOWN_COLUMNS: live[UNKNOWN_COLUMNS],
    }
    for name, typ in FRAMEWORK_COLUMNS:
        data[name] = framework[name].cast(typ)
    return pa.table(data)

