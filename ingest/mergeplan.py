"""What a reduced batch will do to its table, decided before the MERGE (DESIGN 3.1-3.3, 3.9).

Reads the stored state of the batch's keys (position, coordinates, soft-delete flag, unknown
columns) and classifies each winning change as insert, update, delete or stale with the same rule
the MERGE's predicates apply (:mod:`ingest.ordering`), so the audit counts what the commit does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from deltalake import DeltaTable

from ingest.deltaio import delta_type_name, quote, read_all, sql_string, table_schema
from ingest.events import UNAVAILABLE
from ingest.ordering import later_than_stored, replaces_stored
from ingest.reduce import Key, PositionedChange, event_key
from ingest.tombstones import key_array

Action = Literal["insert", "update", "delete", "stale"]
#: Framework column naming the columns whose value is unknown (an unresolved TOAST placeholder).
UNKNOWN_COLUMNS = "_cdc_unknown_columns"


@dataclass(frozen=True, slots=True)
class StoredRow:
    """What the table holds for one key."""

    position: str
    coords: tuple[int, int]
    deleted: bool
    unknown: tuple[str, ...] = ()


def stored_rows(table: DeltaTable, key_columns: tuple[str, ...], changes: Sequence[PositionedChange],
                *, table_name: str = "") -> dict[Key, StoredRow]:
    """The stored state of the keys of ``changes`` that the table holds."""
    if not changes or not key_columns:
        return {}
    names = {f.name: f for f in table_schema(table)}
    if any(k not in names for k in key_columns):
        return {}  # a table created by a truncate has no key columns yet, and no rows
    first = key_columns[0]
    values = [c.event.key[first] for c in changes]
    lo, hi = min(values), max(values)
    # A range filter on the first key column lets delta-rs skip files by their min/max stats.
    where = f"{quote(first)} >= {_literal(lo)} AND {quote(first)} <= {_literal(hi)}" if _literal(lo) else None
    extra = [UNKNOWN_COLUMNS] if UNKNOWN_COLUMNS in names else []
    found = read_all(table, columns=[*key_columns, "_cdc_position", "_cdc_partition", "_cdc_offset",
                                     "_cdc_deleted", *extra], where=where)
    if found.num_rows == 0:
        return {}
    wanted = pa.table({k: key_array(table_name, k, [c.event.key[k] for c in changes],
                                    delta_type_name(found.schema.field(k).type)) for k in key_columns})
    # Join on the keys alone (pyarrow cannot carry list columns through a join), then take the rows.
    index = found.select(list(key_columns)).append_column("__row", pa.array(range(found.num_rows), pa.int64()))
    hits = index.join(wanted.group_by(list(key_columns)).aggregate([]), keys=list(key_columns), join_type="inner")
    rows = hits["__row"].to_pylist()

    def column(name: str) -> list[Any]:
        values = found[name].to_pylist()
        return [values[i] for i in rows]

    keys = zip(*(column(k) for k in key_columns), strict=True)
    unknown = column(UNKNOWN_COLUMNS) if extra else [None] * len(rows)
    return {
        key: StoredRow(pos, (part, off), bool(deleted), tuple(unk or ()))
        for key, pos, part, off, deleted, unk in zip(
            keys, column("_cdc_position"), column("_cdc_partition"), column("_cdc_offset"),
            column("_cdc_deleted"), unknown, strict=True)
    }


def _literal(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return sql_string(value)
    return None


def _coords(change: PositionedChange) -> tuple[int, int]:
    return (change.coords.partition, change.coords.offset)


def revert_stale_toast_fills(winners: list[PositionedChange], key_columns: tuple[str, ...],
                             stored: dict[Key, StoredRow]) -> None:
    """Undo in-batch TOAST fills whose source image is not newer than the stored row.

    The stored value is then the right one, and the MERGE keeps it (the column is a placeholder again).
    """
    for change in winners:
        if not change.toast_sources or change.event.after is None:
            continue
        target = stored.get(event_key(change.event, key_columns))
        if target is None:
            continue
        stale = {col for col, src in change.toast_sources.items() if not later_than_stored(src, target.position)}
        if stale:
            for col in stale:
                change.event.after[col] = UNAVAILABLE
                del change.toast_sources[col]
            change.event.unavailable = change.event.unavailable | stale


def classify(winners: list[PositionedChange], key_columns: tuple[str, ...], stored: dict[Key, StoredRow],
             tombs: dict[Key, str], old_truncate: str | None, new_truncate: str | None) -> list[Action]:
    """Insert, update, delete or stale for each winner, as the MERGE will decide it."""
    actions: list[Action] = []
    for change in winners:
        pos = change.event.position.encode()
        key = event_key(change.event, key_columns)
        target = stored.get(key)
        if target is not None and new_truncate is not None and later_than_stored(new_truncate, target.position):
            target = None  # the truncate in this batch removes that row first
        if (old_truncate is not None and not later_than_stored(pos, old_truncate)) or (
                target is not None and not replaces_stored(pos, _coords(change), target.position, target.coords)) or (
                _buried(tombs.get(key), pos, change.event.is_delete, target is not None)):
            actions.append("stale")
        elif change.event.is_delete:
            actions.append("delete")
        elif target is None or target.deleted:
            actions.append("insert")
        else:
            actions.append("update")
    return actions


def _buried(tomb: str | None, pos: str, is_delete: bool, row_in_table: bool) -> bool:
    """True if a remembered delete makes this change stale.

    Tombstones are written before the MERGE commit (a separate commit). A delete that meets its own
    tombstone (same position) while its row is still in the table is a replay after a crash between
    the two: it must apply again, or the row would outlive its delete. Without the row it is a
    duplicate, and stale.
    """
    if tomb is None:
        return False
    if tomb == pos:
        return not (is_delete and row_in_table)
    return not later_than_stored(pos, tomb)


def keeps_truncated(change: PositionedChange, key_columns: tuple[str, ...], stored: dict[Key, StoredRow],
                    old_truncate: str | None) -> bool:
    """Whether a change the batch's truncate superseded is still written, flagged (soft-delete mode).

    Only if it would have been applied in a batch of its own: newer than an earlier truncate and
    than the stored row. Otherwise the stored row (if any) is flagged by the truncate itself.
    """
    pos = change.event.position.encode()
    if old_truncate is not None and not later_than_stored(pos, old_truncate):
        return False
    target = stored.get(event_key(change.event, key_columns))
    return target is None or replaces_stored(pos, _coords(change), target.position, target.coords)


def unknown_columns(live: list[PositionedChange], key_columns: tuple[str, ...],
                    stored: dict[Key, StoredRow]) -> dict[int, list[str] | None]:
    """Per written change (by ``id``): the columns whose value stays unknown after this commit.

    A TOAST placeholder keeps the stored value; when the key has no stored row, or the stored value
    was itself unknown, nothing is known and the column is listed (its value is NULL).
    """
    out: dict[int, list[str] | None] = {}
    for change in live:
        placeholders = change.event.unavailable if change.event.after is not None else frozenset()
        if not placeholders:
            out[id(change)] = None
            continue
        target = stored.get(event_key(change.event, key_columns))
        known_before = target is not None and not target.deleted
        still = sorted(c for c in placeholders if not known_before or c in target.unknown)  # type: ignore[union-attr]
        out[id(change)] = still or None
    return out


def matched_deletes(actions: list[Action], winners: list[PositionedChange], key_columns: tuple[str, ...],
                    stored: dict[Key, StoredRow]) -> int:
    """Hard deletes that remove a stored row (the rest of the MERGE's deleted rows were truncated)."""
    return sum(1 for a, c in zip(actions, winners, strict=True)
               if a == "delete" and event_key(c.event, key_columns) in stored)
