"""The batch's MERGE as SQL text, written once for both writers (docs/architecture.md#atomicity).

A :class:`MergeStatement` is the join condition and the ordered ``WHEN`` clauses of one MERGE --
inserts, updates, deletes, TOAST fill, the position guard and the truncate -- with every predicate
and value as SQL. delta-rs (DataFusion SQL) and delta-spark (Spark SQL) run the same statement
through their own builders (:func:`ingest.commit.delta_rs.run_merge`,
:func:`ingest.commit.spark_merge.run_merge`), as :func:`ingest.commit.writer.merge_statement` writes
it for a batch; only a :class:`Dialect` tells them apart: how an identifier is quoted, how a string
and a timestamp are written. So the two writers cannot drift apart in what a batch does to a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import FRAMEWORK_COLUMNS
from ingest.lake.delta import key_range
from ingest.model import ColumnSpec
from ingest.rules.history import DROP, history_schema
from ingest.rules.ordering import later_than_stored_sql, replaces_stored_sql
from ingest.rules.plan import TOAST_FLAG

ClauseKind = Literal["matched_delete", "matched_update", "not_matched_insert", "not_matched_by_source_delete",
                     "not_matched_by_source_update"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one writer's SQL writes what the statement needs."""

    ident: Callable[[str], str]
    string: Callable[[str], str]
    #: a ``TIMESTAMP WITH TIME ZONE`` literal (UTC), or its typed NULL for ``None``
    timestamp: Callable[[datetime | None], str]
    #: a batch with at most this many distinct first-key values lists them in the join condition
    #: (``t.k IN (...)``, see :func:`_on`); 0: never
    key_list_limit: int = 0
    #: an integer literal of an Arrow integer type, typed as the writer's SQL reads it (a typed literal
    #: needs no cast per value in a long list of them)
    integer: Callable[[int, pa.DataType], str] = lambda value, _type: str(value)


@dataclass(frozen=True, slots=True)
class Clause:
    """One ``WHEN`` clause: what it does, when (``None``: always), and the columns it sets."""

    kind: ClauseKind
    condition: str | None = None
    sets: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class MergeStatement:
    """A MERGE of source ``s`` into target ``t``: ``on``, then the clauses in the order they apply."""

    on: str
    clauses: tuple[Clause, ...]


@dataclass(frozen=True, slots=True)
class FrameSource:
    """A MERGE source on Spark's executors, as :func:`current_merge` needs to know it: its column
    names, and its first key column's least and greatest value (``bounds``, a table of those two
    rows). Its keys are never listed in the condition: the driver does not hold them."""

    column_names: list[str]
    bounds: pa.Table


def current_merge(source: pa.Table | FrameSource, d: Dialect, *, key_columns: tuple[str, ...],
                  columns: list[ColumnSpec], delete_mode: Literal["hard", "soft"], truncate: str | None
                  ) -> MergeStatement:
    """The MERGE of a planned batch (:attr:`MergePlan.source <ingest.rules.plan.MergePlan.source>`)
    into a table holding the current rows; ``columns`` are the table's user columns, ``truncate``
    the batch's truncate position if it applies.

    A source row replaces the stored one only when it is newer by position (``replaces``); a TOAST
    column whose flag is set keeps the stored value. Hard mode deletes the row, soft mode marks it
    and keeps the stored values. A truncate removes (or marks) every row older than its position
    that the batch does not bring back.
    """
    framework = [name for name, _ in FRAMEWORK_COLUMNS]
    toast = {name[len(TOAST_FLAG):] for name in source.column_names if name.startswith(TOAST_FLAG)}

    def value(col: str) -> str:
        if col in toast:
            return f"CASE WHEN s.{d.ident(TOAST_FLAG + col)} THEN t.{d.ident(col)} ELSE s.{d.ident(col)} END"
        return f"s.{d.ident(col)}"

    user = [c.name for c in columns]
    all_updates = {d.ident(c): value(c) for c in user + framework}
    # A soft delete's image may hold only the key: keep the stored values, and with them what is known of them.
    framework_updates = {d.ident(c): f"s.{d.ident(c)}" for c in framework if c != "_cdc_unknown_columns"}
    inserts = {d.ident(c): f"s.{d.ident(c)}" for c in user + framework}
    newer = replaces_stored_sql("s", "t")
    on = _on(key_columns, source, d, bounded=not truncate)
    removed = later_than_stored_sql(d.string(truncate), "t._cdc_position") if truncate else ""
    if delete_mode == "hard":
        clauses = [Clause("matched_delete", f"s._cdc_deleted AND {newer}"),
                   Clause("matched_update", f"NOT s._cdc_deleted AND {newer}", all_updates),
                   Clause("not_matched_insert", "NOT s._cdc_deleted", inserts)]
        if truncate:
            clauses.append(Clause("not_matched_by_source_delete", removed))
    else:
        # A truncated row keeps the values its last change gave it.
        clauses = [Clause("matched_update", f"s._cdc_op = 'd' AND {newer}", framework_updates),
                   Clause("matched_update", newer, all_updates),
                   Clause("not_matched_insert", None, inserts)]
        if truncate:
            marks = {"_cdc_deleted": "true", "_cdc_op": "'t'", "_cdc_position": d.string(truncate)}
            clauses.append(Clause("not_matched_by_source_update", f"{removed} AND NOT t._cdc_deleted", marks))
    return MergeStatement(on or "false", tuple(clauses))


def history_merge(source: pa.Table | FrameSource, d: Dialect, *, key_columns: tuple[str, ...],
                  columns: list[ColumnSpec], truncate: str | None, truncate_ts: datetime | None) -> MergeStatement:
    """The scd2 MERGE (:mod:`ingest.rules.history`) of ``source`` (the planned versions, or the
    shape of such a source on Spark's executors): versions matched by key and position.

    A planned version replaces its stored twin or is inserted, one marked ``DROP`` removes it; a
    truncate (at ``truncate_ts``) ends every current version older than its position.
    """
    sets = {d.ident(f.name): f"s.{d.ident(f.name)}" for f in history_schema(columns)}
    on = _on(key_columns, source, d, bounded=not truncate)
    clauses = [Clause("matched_delete", f"s.{DROP}"),
               Clause("matched_update", f"NOT s.{DROP}", sets),
               Clause("not_matched_insert", f"NOT s.{DROP}", sets)]
    if truncate:
        ended = {"_cdc_is_current": "false", "_cdc_deleted": "true", "_cdc_valid_to": d.timestamp(truncate_ts),
                 "_cdc_end_position": d.string(truncate), "_cdc_end_op": "'t'"}
        older = later_than_stored_sql(d.string(truncate), "t._cdc_position")
        clauses.append(Clause("not_matched_by_source_update", f"t._cdc_is_current AND {older}", ended))
    same_version = "t._cdc_position = s._cdc_position"
    return MergeStatement(f"{on} AND {same_version}" if on else same_version, tuple(clauses))


def _on(key_columns: tuple[str, ...], source: pa.Table | FrameSource, d: Dialect, *, bounded: bool) -> str:
    """Key equality, led by the literal bounds of the batch's first key column when ``bounded``,
    and, where the dialect asks for it, by the list of its values.

    The bounds let the engine skip every file whose min/max statistics fall outside them: with the
    table laid out by key, a batch of recent keys reads and rewrites only the newest files. A
    truncate must see every row, so it is never bounded.

    The list (:attr:`Dialect.key_list_limit`) is for keys spread over the whole table, where the
    bounds skip nothing. Both are implied by the key equality, so neither changes what the MERGE
    does. delta-spark pushes the list below the join that writes a deletion-vector MERGE's changed
    rows: only the batch's rows of the touched files are shuffled to the join, instead of all of
    them (every file's rows, for random keys).
    """
    on = " AND ".join(f"t.{d.ident(k)} = s.{d.ident(k)}" for k in key_columns)
    if on and bounded:
        keys = source.bounds if isinstance(source, FrameSource) else source
        bounds = key_range(keys, key_columns[0], "t", ident=d.ident, string=d.string)
        listed = key_list(source, key_columns[0], d) if isinstance(source, pa.Table) else None
        on = " AND ".join(p for p in (bounds, listed, on) if p)
    return on


#: The longest key list, in characters. Delta records a MERGE's condition in its commit (the table's
#: history shows it), so long string keys list nothing rather than bloat every commit of the log.
KEY_LIST_CHARS = 300_000


def key_list(keys: pa.Table, column: str, d: Dialect) -> str | None:
    """``t.column`` among the distinct values of ``keys[column]``, as a SQL ``IN`` list.

    A join on the key implies it (see :func:`_on`). ``None`` when the dialect lists no keys, there
    are none or more than its limit, they are neither integers nor strings, or their list would be
    longer than :data:`KEY_LIST_CHARS`. Nulls are left out: they match no key.
    """
    if d.key_list_limit <= 0 or keys.num_rows == 0 or column not in keys.column_names:
        return None
    values = pc.unique(keys[column].drop_null())
    if len(values) == 0 or len(values) > d.key_list_limit:
        return None
    kind = values.type
    if pa.types.is_integer(kind):
        literals = [d.integer(v, kind) for v in values.to_pylist()]
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        literals = [d.string(v) for v in values.to_pylist()]
    else:
        return None
    listed = ", ".join(literals)
    return f"t.{d.ident(column)} IN ({listed})" if len(listed) <= KEY_LIST_CHARS else None
