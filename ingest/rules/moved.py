"""Primary-key moves: a moved row's unchanged values, taken from the row it was before the move.

See docs/architecture.md#primary-key-moves.

Debezium sends an update that changes the primary key as a delete of the old key and a create of
the new key; the create names the old key in its ``__debezium.oldkey`` Kafka header (the decode
step's ``_cdc_old_key``). An unchanged TOASTed column of the moved row holds the placeholder (and,
with ``ignore_null_updates``, an omitted column is null) in that create, and the new key has no
earlier image to fill it from -- but the old key's does: the row the update moved.

The old key's image *just before the move* is known once the move's delete has been seen: every
change of the old key before it is then in the batch or already applied (a key's changes keep
their order on their partition). So for each moved change, the old key's history up to the
change's position -- the batch's changes of it, its stored row or versions, and the row a hard
delete of a move removed (recorded by :mod:`ingest.apply.moves`) -- must end with a delete; the
values of the life that delete ended fill the moved change (the delete must be at the change's
own source position: the two halves of one update share it). When it does not (the old key's
partition is behind the new key's), the change stays as it is and the per-key rules list the
column unknown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: What an old key's history is read as, beside its key and the filled columns.
HISTORY_COLUMNS = ("_cdc_position", "_cdc_offset", "_cdc_op", "_cdc_toast")
#: Each old key's known events, by the key's values.
Histories = dict[tuple[Any, ...], list["Event"]]
#: What tells a batch's changes apart.
COORDINATES = ("_cdc_topic", "_cdc_partition", "_cdc_offset")


def moved_mask(changes: pa.Table) -> pa.Array:
    """Which changes are a move's: a new row naming its old key and holding unchanged values, or a
    delete naming its row's new key."""
    if "_cdc_old_key" not in changes.column_names or not changes.num_rows:
        return pa.array([False] * changes.num_rows, pa.bool_())
    row = pc.invert(pc.is_in(changes["_cdc_op"], pa.array(["d", "t"])))
    unchanged = pc.greater(pc.fill_null(pc.list_value_length(changes["_cdc_toast"]), 0), 0)
    created = pc.and_(pc.and_(row, pc.is_valid(changes["_cdc_old_key"])), unchanged)
    deleted = pc.and_(pc.equal(changes["_cdc_op"], "d"), pc.is_valid(changes["_cdc_new_key"]))
    return pc.fill_null(pc.or_(created, deleted), False)


@dataclass(frozen=True, slots=True)
class Event:
    """One known fact of an old key's history: an image (with the columns it does not know) or a delete."""

    position: str
    order: int  # among events at one position: images before the delete that ends them
    delete: bool
    values: Mapping[str, Any]
    unknown: frozenset[str] = frozenset()


def old_key_of(text: str | None, key_columns: tuple[str, ...]) -> dict[str, Any] | None:
    """The old key a ``__debezium.oldkey`` header names, or ``None`` when it names no key of these columns.

    Kafka Connect's default header converter writes the key as a JSON object (``{"id":1}``); a
    ``JsonConverter`` header converter wraps it as ``{"schema":..., "payload":{...}}``.
    """
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and "payload" in value and "schema" in value:
        value = value["payload"]
    if not isinstance(value, dict) or any(k not in value for k in key_columns):
        return None
    return {k: value[k] for k in key_columns}


def typed_key(key: Mapping[str, Any] | None, key_columns: tuple[str, ...],
              key_types: Mapping[str, pa.DataType]) -> tuple[Any, ...] | None:
    """A key's values as the table's key columns hold them (``None``: they cannot)."""
    if key is None:
        return None
    try:
        return tuple(pa.array([key[k]], key_types[k])[0].as_py() for k in key_columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return None


def fill_moved(moved: pa.Table, history: Mapping[tuple[Any, ...], list[Event]], key_columns: tuple[str, ...],
               key_types: Mapping[str, pa.DataType]) -> tuple[pa.Table, int]:
    """``moved`` with each change's unchanged columns filled from its old key's row before the move.

    Args:
        moved: changes naming an old key and holding unchanged values (``_cdc_toast``).
        history: each old key's known events (:class:`Event`), in any order.

    Returns:
        The changes (the same rows, filled where the old key's row is known), and how many values were filled.
    """
    # In source order: a row moved twice in one batch takes, the second time, what the first filled.
    rows = sorted(moved.to_pylist(), key=lambda r: r["_cdc_position"])
    filled = 0
    for row in rows:
        typed = typed_key(old_key_of(row["_cdc_old_key"], key_columns), key_columns, key_types)
        if typed is None or not row["_cdc_toast"]:
            continue
        known = before_move(history.get(typed, []), row["_cdc_position"])
        if known is None:
            continue
        done = {c: known[c] for c in row["_cdc_toast"] if c in known}
        if not done:
            continue
        row.update(done)
        row["_cdc_toast"] = [c for c in row["_cdc_toast"] if c not in done] or None
        filled += len(done)
        mine = history.get(tuple(row[k] for k in key_columns), [])
        for i, event in enumerate(mine):
            if not event.delete and event.position == row["_cdc_position"]:
                mine[i] = Event(event.position, event.order, False, {**event.values, **done},
                                event.unknown - set(done))
    return pa.Table.from_pylist(rows, schema=moved.schema), filled


def before_move(events: list[Event], position: str) -> dict[str, Any] | None:
    """The values the old key's row held just before the move at ``position`` (``None``: not provable).

    The history up to ``position`` must end with the move's delete: a delete at ``position`` itself
    (Debezium gives the two halves of one update the source position of that update; an earlier
    delete would end another life of the old key). The values are those of the images since the
    delete before it, each column from the newest image that knows it.
    """
    upto = sorted((e for e in events if e.position <= position), key=lambda e: (e.position, e.order))
    if not upto or not upto[-1].delete or upto[-1].position != position:
        return None
    life: list[Event] = []
    end = upto[-1].position
    for event in reversed(upto[:-1]):
        if event.delete and event.position != end:  # the same delete known twice (batch, record) ends nothing
            break
        if not event.delete:
            life.append(event)
    values: dict[str, Any] = {}
    for event in reversed(life):  # oldest first: a newer image overrides what it knows
        for column, value in event.values.items():
            if column not in event.unknown:
                values[column] = value
    return values or None


def batch_events(rows: pa.Table, key_columns: tuple[str, ...], columns: list[str]) -> Histories:
    """Events of the batch's changes of the old keys (``rows``: key, :data:`HISTORY_COLUMNS`, ``columns``)."""
    out: dict[tuple[Any, ...], list[Event]] = {}
    ordered = rows.take(pc.sort_indices(rows, [("_cdc_position", "ascending"), ("_cdc_offset", "ascending")])) \
        if "_cdc_offset" in rows.column_names else rows
    for n, r in enumerate(ordered.to_pylist()):
        key = tuple(r[k] for k in key_columns)
        delete = r["_cdc_op"] == "d"
        out.setdefault(key, []).append(Event(r["_cdc_position"], 1_000_000 + n, delete,
                                             {} if delete else {c: r[c] for c in columns},
                                             frozenset(r["_cdc_toast"] or ())))
    return out


def stored_events(rows: pa.Table, key_columns: tuple[str, ...], columns: list[str], *,
                  history: bool) -> dict[tuple[Any, ...], list[Event]]:
    """Events of what the table stores for the old keys.

    ``rows``: key, ``_cdc_position``, ``_cdc_deleted``, ``_cdc_unknown_columns`` and ``columns`` of
    the current rows (a soft-deleted row keeps the values its delete ended); for an scd2 table
    (``history``) every version, with ``_cdc_end_position`` and ``_cdc_end_op``.
    """
    out: dict[tuple[Any, ...], list[Event]] = {}
    for r in rows.to_pylist():
        key = tuple(r[k] for k in key_columns)
        events = out.setdefault(key, [])
        unknown = frozenset(r.get("_cdc_unknown_columns") or ())
        values = {c: r[c] for c in columns}
        if history:
            events.append(Event(r["_cdc_position"], 0, False, values, unknown))
            if r.get("_cdc_end_op") == "d" and r.get("_cdc_end_position"):
                events.append(Event(r["_cdc_end_position"], 1, True, {}))
        elif r.get("_cdc_deleted"):
            # The delete's position is the row's; the values are those it ended (a truncate's too).
            events.append(Event(r["_cdc_position"], 0, False, values, unknown))
            events.append(Event(r["_cdc_position"], 1, True, {}))
        else:
            events.append(Event(r["_cdc_position"], 0, False, values, unknown))
    return out


def merged(*histories: Mapping[tuple[Any, ...], list[Event]]) -> dict[tuple[Any, ...], list[Event]]:
    """One history per key from several sources."""
    out: dict[tuple[Any, ...], list[Event]] = {}
    for h in histories:
        for key, events in h.items():
            out.setdefault(key, []).extend(events)
    return out
