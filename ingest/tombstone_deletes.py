"""Kafka tombstones that are deletes: flattened streams (DESIGN 3.2, 5b).

With ``ExtractNewRecordState`` Debezium's default delete handling sends a delete as a tombstone
only (2.5+: ``delete.tombstone.handling.mode=tombstone``; 1.x: ``delete.handling.mode=drop``).
In such a stream the tombstone is the delete of its key. After a full envelope's ``d`` event it
only serves log compaction and changes nothing.

How a stream is known to be flattened: the table's ``kafka_tombstones`` setting (``delete`` /
``ignore``), or with ``auto`` (the default) the records themselves -- a batch holding
``ExtractNewRecordState`` rows says so, and the table remembers it in its Delta log for batches
that hold only tombstones.

A tombstone carries no source position. It deletes its key right after the change it follows:
the latest earlier change of the key on the same partition in the batch, else the row the table
stores (unless that row came from a later offset of the same partition). Its position is that
change's position at phase :data:`ingest.events.AFTER`, so it orders before any later change of the
key, and an older redelivered change stays stale. A tombstone that follows a delete, or finds
nothing to delete, is a no-op counted as skipped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from deltalake import DeltaTable

from ingest.events import ChangeEvent, ControlRecord, KafkaCoordinates, SourcePosition
from ingest.mergeplan import stored_rows
from ingest.reduce import Key, PositionedChange, event_key


@dataclass(slots=True)
class Tombstone:
    """A tombstone message of the batch, with where it sits."""

    record: ControlRecord
    coords: KafkaCoordinates
    #: its row in the decoded batch (raw bytes for quarantine)
    row: int


@dataclass(slots=True)
class Resolution:
    """What the batch's tombstones became."""

    deletes: list[PositionedChange]
    #: tombstones whose key cannot be used: ``(tombstone, reason)``; they go to quarantine.
    unusable: list[tuple[Tombstone, str]]
    #: no-ops (``tombstone`` count), for the audit's skipped term.
    skipped: Counter[str]


def are_deletes(setting: str, batch_flattened: bool | None, table_flattened: bool | None) -> bool:
    """Whether this table's tombstones delete their keys (see module docstring)."""
    if setting != "auto":
        return setting == "delete"
    known = batch_flattened if batch_flattened is not None else table_flattened
    return bool(known)


def resolve(tombstones: list[Tombstone], changes: list[PositionedChange], table_key: tuple[str, ...] | None,
            table: DeltaTable | None, *, table_name: str) -> Resolution:
    """Turn tombstones into positioned deletes (see module docstring)."""
    out = Resolution([], [], Counter())
    latest: dict[tuple[int, Key], list[PositionedChange]] = {}
    for change in sorted(changes, key=lambda c: c.coords.offset):
        if change.event.op != "t" and table_key:
            latest.setdefault((change.coords.partition, event_key(change.event, table_key)), []).append(change)

    pending: list[tuple[Tombstone, ChangeEvent]] = []
    for tomb in sorted(tombstones, key=lambda t: (t.coords.partition, t.coords.offset)):
        record = tomb.record
        if record.key is None:
            out.unusable.append((tomb, f"tombstone: {record.key_error or 'no key'}"))
            continue
        key_columns = table_key or record.key_columns
        if tuple(record.key_columns) != tuple(key_columns):
            out.unusable.append((tomb, f"tombstone: primary key columns {list(record.key_columns)} differ from "
                                       f"the table's {list(key_columns)}"))
            continue
        table_key = key_columns
        key = tuple(record.key[k] for k in key_columns)
        earlier = [c for c in latest.get((tomb.coords.partition, key), ()) if c.coords.offset < tomb.coords.offset]
        delete = ChangeEvent("d", dict(record.key), None, dict(record.key), SourcePosition(0, 0, 0, 0), (),
                             key_columns, tomb.coords.timestamp_ms)
        if not earlier:
            pending.append((tomb, delete))
            continue
        base = earlier[-1]
        if base.event.is_delete:
            out.skipped["tombstone"] += 1
            continue
        delete.position = base.event.position.after()
        positioned = PositionedChange(delete, tomb.coords)
        out.deletes.append(positioned)
        latest[(tomb.coords.partition, key)].append(positioned)

    if pending and table is not None and table_key:
        lookups = [PositionedChange(d, t.coords) for t, d in pending]
        stored = stored_rows(table, table_key, lookups, table_name=table_name)
    else:
        stored = {}
    for tomb, delete in pending:
        row = stored.get(event_key(delete, table_key or ()))
        from_later_offset = row is not None and row.coords[0] == tomb.coords.partition \
            and row.coords[1] > tomb.coords.offset
        if row is None or row.deleted or from_later_offset:
            out.skipped["tombstone"] += 1  # nothing it could delete
            continue
        delete.position = SourcePosition.decode(row.position).after()
        out.deletes.append(PositionedChange(delete, tomb.coords))
    return out
