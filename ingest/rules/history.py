"""SCD type 2: every version of a row kept, derived again for the keys a batch touches.

A ``history_mode: scd2`` table holds one row per version of a key (:data:`~ingest.lake.delta.HISTORY_COLUMNS`):
valid from ``_cdc_valid_from`` until ``_cdc_valid_to``, the source commit times of the changes that
opened and ended it. Exactly one version of a live key is current (``_cdc_is_current``); every other
row -- a past version, or the last version of a deleted or truncated key -- has ``_cdc_deleted``
set, so every reader of live rows (``NOT _cdc_deleted``) sees the current rows.

For every key the batch touches, its whole story is laid out in source order: the versions the
table stores, the deletes and truncates that ended them, the key's remembered delete, the table's
latest truncate, and every change of the batch (not reduced); copies of one position count once
(a stored copy first, then the lowest Kafka coordinates). The key's versions are derived again
from that story, and one MERGE keyed by ``(key, _cdc_position)`` inserts, updates or drops the
rows that differ. A late change thus lands in its place and its neighbours' validity follows; a
duplicate or a replay derives the same versions and changes nothing. Keys the batch does not touch
only meet its truncate: the same MERGE ends their current version.

The derivation:

* a delete or a truncate ends the key's current version (``_cdc_end_op`` ``d`` / ``t``) and starts
  a new life of the key;
* in a life, a change opens a new version when a tracked column (``track_history_columns``,
  default all) differs from the life's previous change; otherwise it updates the current version
  in place (the latest change's values and ``_cdc_position``, the first change's ``_cdc_valid_from``);
* an unchanged-TOAST placeholder (with ``ignore_null_updates``, a null) takes the value of the
  life's previous change; without one the column stays listed in ``_cdc_unknown_columns``.

What a stored version keeps is its first time and its latest change. So a late change that lands
between two changes already folded into one version sees that version as one change at its latest
position; and of the truncates older than the table's latest, only those that ended a version of
the key are known. Positions compare in their encoded text order (as in the batch order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import FRAMEWORK_COLUMNS, HISTORY_COLUMNS, arrow_type, laid_out
from ingest.errors import TableError
from ingest.model import ColumnSpec
from ingest.rules.ordering import later_than_stored
from ingest.rules.sql import connect, ident, key_list, literal, query

#: MERGE source column: the row identifies a stored version to drop.
DROP = "__cdc_drop"
_TS = pa.timestamp("us", tz="UTC")
_CLOSES = "('d', 't')"


@dataclass(slots=True)
class HistoryPlan:
    """One batch's history MERGE and its audit counts.

    Attributes:
        source: the versions to insert or update (every table column) and, flagged :data:`DROP`,
            the stored versions to drop (key columns and ``_cdc_position``).
        truncate, truncate_ts: the batch's first truncate after the table's, which ends the current
            version of every key the batch does not touch.
        watermark: the table's latest truncate after the batch.
        truncate_log: every truncate the table has seen after the batch: ``(position, source time)``.
        updates: source rows that update a stored version.
        toast_unknown: versions of ``source`` (not dropped) that still list unknown columns.
    """

    source: pa.Table
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    superseded: int = 0
    truncates: int = 0
    truncate: str | None = None
    truncate_ts: datetime | None = None
    watermark: str | None = None
    truncate_log: list[tuple[str, datetime | None]] = field(default_factory=list)
    updates: int = 0
    toast_unknown: int = 0


def count_history(record: Any, plan: HistoryPlan, *, withdrawn: int, held: int) -> None:
    """A scd2 batch's audit terms (:class:`~ingest.records.audit.AuditRecord`): ``plan``'s, and of the
    ``withdrawn`` changes of the keys the quality gate held, those it did not quarantine itself
    (``held``) count as superseded."""
    record.inserted, record.updated, record.deleted = plan.inserted, plan.updated, plan.deleted
    record.truncates, record.stale = plan.truncates, plan.stale
    record.superseded = plan.superseded + withdrawn - held
    record.toast_unknown = plan.toast_unknown


#: How to rebuild a table: the steps of docs/operations.md#rebuilding-a-table, in one line.
REBUILD_STEPS = ("stop its runs, remove its directory and its entries in _cdc_tombstones and _cdc_moves, then run "
                 "again: it is re-read from the topic's first record; see docs/operations.md#rebuilding-a-table")


def check_history_mode(table: str, mode: str, state: Any) -> None:
    """A table keeps the history mode it was created with.

    Raises:
        TableError: the table was written in the other mode.
    """

    if state.table is None or state.history == (mode == "scd2"):
        return
    was, wanted = ("scd2", "scd1") if state.history else ("scd1", "scd2")
    raise TableError(table, f"was written with history_mode {was}, the config now says {wanted}; a table keeps "
                            f"its mode. Set history_mode: {was} again, or rebuild the table in {wanted} "
                            f"({REBUILD_STEPS})")


def history_schema(columns: list[ColumnSpec]) -> pa.Schema:
    """A scd2 table's schema: user columns, framework columns, history columns."""
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns]
                     + [pa.field(n, t) for n, t in FRAMEWORK_COLUMNS + HISTORY_COLUMNS])


def plan_history(changes: pa.Table, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                 tracked: list[str] | None, watermark: str | None, truncate_log: list[tuple[str, datetime | None]],
                 stored_of: Callable[[pa.Table], pa.Table | None]) -> HistoryPlan:
    """Derive the touched keys' versions and the MERGE that writes them (see module docstring).

    Args:
        changes: the batch's row changes and truncates (not reduced), quarantined keys removed.
        tracked: the columns whose change opens a version (``None``: every non-key column).
        watermark: the table's latest truncate; truncate_log: every truncate it has seen.
        stored_of: the stored versions of some keys (given as a table of their key columns), every
            column the table has; ``None``: the table stores none (not created yet, or created by a
            truncate without key columns).
    """
    is_t = pc.equal(changes["_cdc_op"], "t")
    marks = changes.filter(is_t).sort_by([("_cdc_position", "ascending")])
    rows = changes.filter(pc.invert(is_t))
    applying = [m for m in marks.select(["_cdc_position", "_cdc_source_ts", "_cdc_partition", "_cdc_offset"]
                                        ).to_pylist()
                if watermark is None or later_than_stored(m["_cdc_position"], watermark)]
    plan = HistoryPlan(source=history_schema(columns).append(pa.field(DROP, pa.bool_())).empty_table(),
                       truncates=len(applying), stale=marks.num_rows - len(applying), watermark=watermark,
                       truncate_log=[*truncate_log, *((m["_cdc_position"], m["_cdc_source_ts"]) for m in applying)])
    if applying:
        plan.truncate, plan.truncate_ts = applying[0]["_cdc_position"], applying[0]["_cdc_source_ts"]
        plan.watermark = applying[-1]["_cdc_position"]
    if rows.num_rows == 0:
        return plan
    keys = rows.select(list(key_columns)).group_by(list(key_columns), use_threads=False).aggregate([])
    stored = stored_of(keys)
    if stored is None:
        stored = no_versions(key_columns, keys.schema)
    old = len(truncate_log)
    truncs = pa.table({
        "t_pos": pa.array([p for p, _ in truncate_log] + [m["_cdc_position"] for m in applying], pa.string()),
        "t_ts": pa.array([t for _, t in truncate_log] + [m["_cdc_source_ts"] for m in applying], _TS),
        "t_part": pa.array([None] * old + [m["_cdc_partition"] for m in applying], pa.int32()),
        "t_off": pa.array([None] * old + [m["_cdc_offset"] for m in applying], pa.int64()),
        "t_prio": pa.array([3] * old + [2] * len(applying), pa.int32()),
    })
    user = [c.name for c in columns]
    fills = _fill_candidates(rows, stored, user, key_columns)
    watched = [c for c in (tracked if tracked is not None else user) if c in user and c not in key_columns]
    con = connect(b=rows, s=stored, k=keys, tr=truncs)
    try:
        ranked = query(con, _story_sql(key_columns, user, rows.column_names, stored.column_names))
        con.register("ranked", ranked)
        versions = query(con, _versions_sql(key_columns, user, fills, watched))
        con.register("versions", versions)
        new = query(con, _new_rows_sql(key_columns, user))
        con.register("new", new)
        diff = query(con, _diff_sql(key_columns, user, stored.column_names))
        con.register("diff", diff)
        drops = query(con, f"""SELECT {key_list(key_columns, 's')}, s._cdc_position FROM s
                               WHERE NOT EXISTS (SELECT 1 FROM new n WHERE {_same_version(key_columns, 'n', 's')})""")
    finally:
        con.close()
    _count(plan, ranked, versions)
    changed = diff.filter(pc.not_equal(diff["h_action"], "same"))
    plan.updates = int(pc.sum(pc.equal(changed["h_action"], "update")).as_py() or 0)
    plan.source = versions_source(changed, drops, columns)
    kept = plan.source.filter(pc.invert(plan.source[DROP]))
    plan.toast_unknown = int(pc.sum(pc.is_valid(kept["_cdc_unknown_columns"])).as_py() or 0)
    return plan


def no_versions(key_columns: tuple[str, ...], keys: pa.Schema) -> pa.Table:
    """The stored versions of a table that stores none: no rows, the key columns in ``keys``' types."""
    schema = pa.schema([keys.field(k) for k in key_columns]
                       + [pa.field(n, t) for n, t in FRAMEWORK_COLUMNS + HISTORY_COLUMNS])
    return schema.empty_table()


def _fill_candidates(rows: pa.Table, stored: pa.Table, user: list[str], key_columns: tuple[str, ...]) -> list[str]:
    """Columns some change or stored version does not know (placeholders, unknown columns)."""
    seen: set[str] = set()
    for table, col in ((rows, "_cdc_toast"), (stored, "_cdc_unknown_columns")):
        if col in table.column_names and table.num_rows:
            seen.update(v for v in pc.unique(pc.list_flatten(table[col])).to_pylist() if v is not None)
    return [c for c in user if c in seen and c not in key_columns]


def _story_sql(key_columns: tuple[str, ...], user: list[str], batch_names: list[str], stored_names: list[str]) -> str:
    """Every event of the touched keys, each with its rank among the copies of its position."""
    keys = key_list(key_columns)
    b_cols = ", ".join(ident(c) for c in user if c in batch_names)
    s_cols = ", ".join(ident(c) for c in user if c in stored_names)
    k_cols = key_list(key_columns, "k")
    order = "e_prio, e_part NULLS LAST, e_off NULLS LAST"
    return f"""
        WITH ev AS (
            SELECT {s_cols}, _cdc_op AS e_op, _cdc_position AS e_pos,
                   CASE WHEN _cdc_op = 'd' THEN _cdc_source_ts ELSE _cdc_valid_from END AS e_start,
                   _cdc_source_ts AS e_ts, _cdc_topic AS e_topic, _cdc_partition AS e_part, _cdc_offset AS e_off,
                   _cdc_unknown_columns AS e_unknown, 0 AS e_prio, 's' AS e_src FROM s
            UNION ALL BY NAME
            SELECT {keys}, _cdc_end_op AS e_op, _cdc_end_position AS e_pos, _cdc_valid_to AS e_start,
                   _cdc_valid_to AS e_ts, 1 AS e_prio, 'e' AS e_src FROM s WHERE _cdc_end_op IN {_CLOSES}
            UNION ALL BY NAME
            SELECT {b_cols}, _cdc_op AS e_op, _cdc_position AS e_pos, _cdc_source_ts AS e_start,
                   _cdc_source_ts AS e_ts, _cdc_topic AS e_topic, _cdc_partition AS e_part, _cdc_offset AS e_off,
                   _cdc_toast AS e_unknown, 2 AS e_prio, 'b' AS e_src FROM b
            UNION ALL BY NAME
            SELECT {k_cols}, 't' AS e_op, tr.t_pos AS e_pos, tr.t_ts AS e_start, tr.t_ts AS e_ts,
                   tr.t_part AS e_part, tr.t_off AS e_off, tr.t_prio AS e_prio, 't' AS e_src FROM k CROSS JOIN tr)
        SELECT *, row_number() OVER w AS e_copy, first_value(e_prio) OVER w AS e_winner
        FROM ev WINDOW w AS (PARTITION BY {keys}, e_pos ORDER BY {order})"""


def _versions_sql(key_columns: tuple[str, ...], user: list[str], fills: list[str], watched: list[str]) -> str:
    """Every kept change of the touched keys, with its life, version group and the event after it."""
    keys = key_list(key_columns)
    known = [f"NOT list_contains(coalesce(e_unknown, []), {literal(c)})" for c in fills]
    windows = "".join(f", max_by({ident(c)}, e_ord) FILTER (WHERE {k}) OVER pw AS f_v_{n}"
                      f", max(e_ord) FILTER (WHERE {k}) OVER pw AS f_k_{n}"
                      for n, (c, k) in enumerate(zip(fills, known, strict=True)))
    replace = [f"CASE WHEN NOT ({k}) AND f_k_{n} IS NOT NULL THEN f_v_{n} ELSE {ident(c)} END AS {ident(c)}"
               for n, (c, k) in enumerate(zip(fills, known, strict=True))]
    solved = " OR ".join(f"(x = {literal(c)} AND f_k_{n} IS NOT NULL)" for n, c in enumerate(fills))
    left = f"list_filter(coalesce(e_unknown, []), lambda x: NOT ({solved}))" if fills else "coalesce(e_unknown, [])"
    replace.append(f"CASE WHEN len({left}) > 0 THEN {left} END AS e_unknown")
    internal = ", ".join(f"f_v_{n}, f_k_{n}" for n in range(len(fills)))
    exclude = f"EXCLUDE ({internal}) " if fills else ""
    differs = " OR ".join(f"{ident(c)} IS DISTINCT FROM lag({ident(c)}) OVER lw" for c in watched) or "FALSE"
    return f"""
        WITH seq AS (
            SELECT * EXCLUDE (e_copy, e_winner), row_number() OVER (PARTITION BY {keys} ORDER BY e_pos) AS e_ord
            FROM ranked WHERE e_copy = 1),
        lives AS (
            SELECT *, coalesce(sum(CASE WHEN e_op IN {_CLOSES} THEN 1 ELSE 0 END) OVER (PARTITION BY {keys}
                       ORDER BY e_ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS e_life,
                   lead(e_op) OVER kw AS n_op, lead(e_pos) OVER kw AS n_pos, lead(e_start) OVER kw AS n_start,
                   lag(e_op) OVER kw AS p_op
            FROM seq WINDOW kw AS (PARTITION BY {keys} ORDER BY e_ord)),
        ups AS (SELECT * FROM lives WHERE e_op NOT IN {_CLOSES}),
        filled AS (
            SELECT * {exclude}REPLACE ({', '.join(replace)})
            FROM (SELECT *{windows} FROM ups
                  WINDOW pw AS (PARTITION BY {keys}, e_life ORDER BY e_ord
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING))),
        marked AS (
            SELECT *, CASE WHEN lag(e_ord) OVER lw IS NULL OR {differs} THEN 1 ELSE 0 END AS e_open
            FROM filled WINDOW lw AS (PARTITION BY {keys}, e_life ORDER BY e_ord)),
        grouped AS (SELECT *, sum(e_open) OVER (PARTITION BY {keys} ORDER BY e_ord) AS e_group FROM marked)
        SELECT *, first_value(e_start) OVER gw AS v_from, max(e_ord) OVER (PARTITION BY {keys}, e_group) AS v_last,
               FALSE AS e_marker
        FROM grouped WINDOW gw AS (PARTITION BY {keys}, e_group ORDER BY e_ord)
        UNION ALL BY NAME
        SELECT *, TRUE AS e_marker FROM lives WHERE e_op = 'd' AND (p_op IS NULL OR p_op IN {_CLOSES})"""


def _new_rows_sql(key_columns: tuple[str, ...], user: list[str]) -> str:
    """The derived versions: the last change of each version group, with its validity."""
    cols = ", ".join(ident(c) for c in user)
    return f"""
        SELECT {cols}, e_op AS _cdc_op, e_pos AS _cdc_position, e_ts AS _cdc_source_ts, e_topic AS _cdc_topic,
               e_part AS _cdc_partition, e_off AS _cdc_offset, n_pos IS NOT NULL AS _cdc_deleted,
               e_unknown AS _cdc_unknown_columns, v_from AS _cdc_valid_from, n_start AS _cdc_valid_to,
               n_pos IS NULL AS _cdc_is_current, n_pos AS _cdc_end_position, n_op AS _cdc_end_op
        FROM versions WHERE NOT e_marker AND e_ord = v_last
        UNION ALL
        SELECT {cols}, e_op, e_pos, e_ts, e_topic, e_part, e_off, TRUE, e_unknown, e_ts, e_ts, FALSE,
               CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR)
        FROM versions WHERE e_marker"""


_COMPARED = ("_cdc_op", "_cdc_source_ts", "_cdc_topic", "_cdc_partition", "_cdc_offset", "_cdc_deleted",
             "_cdc_unknown_columns", "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_end_position",
             "_cdc_end_op")


def _same_version(key_columns: tuple[str, ...], a: str, b: str) -> str:
    return " AND ".join([*(f"{a}.{ident(k)} = {b}.{ident(k)}" for k in key_columns),
                         f"{a}._cdc_position = {b}._cdc_position"])


def _diff_sql(key_columns: tuple[str, ...], user: list[str], stored_names: list[str]) -> str:
    """Each derived version: ``insert`` (not stored), ``update`` (stored, differs) or ``same``."""
    differs = [f"n.{ident(c)} IS DISTINCT FROM s.{ident(c)}" if c in stored_names else f"n.{ident(c)} IS NOT NULL"
               for c in [*user, *_COMPARED] if c not in key_columns]
    return f"""
        SELECT n.*, CASE WHEN s._cdc_position IS NULL THEN 'insert'
                         WHEN {' OR '.join(differs)} THEN 'update' ELSE 'same' END AS h_action
        FROM new n LEFT JOIN s ON {_same_version(key_columns, 'n', 's')}"""


def _count(plan: HistoryPlan, ranked: pa.Table, versions: pa.Table) -> None:
    """The audit terms of the batch's changes: each in exactly one."""
    batch = ranked.filter(pc.equal(ranked["e_src"], "b"))
    copies = batch.filter(pc.greater(batch["e_copy"], 1))
    stale = int(pc.sum(pc.less(copies["e_winner"], 2)).as_py() or 0)
    plan.stale += stale
    plan.superseded = copies.num_rows - stale
    kept = batch.filter(pc.equal(batch["e_copy"], 1))
    plan.deleted = int(pc.sum(pc.equal(kept["e_op"], "d")).as_py() or 0)
    mine = versions.filter(pc.and_(pc.equal(versions["e_src"], "b"), pc.invert(versions["e_marker"])))
    plan.inserted = int(pc.sum(mine["e_open"]).as_py() or 0)
    plan.updated = mine.num_rows - plan.inserted


def versions_source(changed: pa.Table, drops: pa.Table, columns: list[ColumnSpec]) -> pa.Table:
    """The MERGE source in the table's types: changed versions, then the stored versions to drop."""
    schema = history_schema(columns)
    now = pa.array([datetime.now(UTC)] * changed.num_rows, _TS)
    rows = pa.Table.from_arrays(
        [now if f.name == "_cdc_ingested_at" else changed[f.name].cast(f.type) for f in schema]
        + [pa.array([False] * changed.num_rows, pa.bool_())], schema=schema.append(pa.field(DROP, pa.bool_())))
    gone = laid_out(drops, schema).append_column(DROP, pa.array([True] * drops.num_rows, pa.bool_()))
    return pa.concat_tables([rows, gone])
