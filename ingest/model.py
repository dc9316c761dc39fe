"""Domain types shared by the stages: what a decoded Debezium message becomes.

A message decodes to exactly one of:

* :class:`ChangeEvent` -- a row change (``c``, ``u``, ``d``, ``r``) or a truncate (``t``);
* :class:`ControlRecord` -- something that carries no row change and is counted, not applied
  (Debezium tombstone, heartbeat, schema-change, transaction metadata, logical message);
* a :class:`ingest.errors.DecodeError` raised by the decoder -- the message goes to quarantine.

Column values in images are plain Python objects of the column's Delta type (see
:data:`DELTA_PRIMITIVES`): ``int``, ``float``, ``bool``, ``str``, ``bytes``, ``decimal.Decimal``,
``datetime.date``, ``datetime.datetime`` (naive for ``timestamp_ntz``, UTC-aware for
``timestamp``). Times of day are ``int`` microseconds (Delta has no time type). A PostgreSQL
unchanged-TOAST placeholder is the :data:`UNAVAILABLE` sentinel: the stored value must be kept.
"""

from __future__ import annotations

import builtins
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, TypeVar

Op = Literal["c", "u", "d", "r", "t"]
ControlKind = Literal["tombstone", "heartbeat", "schema_change", "transaction", "message"]

#: Delta primitive type names a column may have (``decimal(p,s)`` is also allowed).
DELTA_PRIMITIVES: Final = frozenset(
    {"byte", "short", "integer", "long", "float", "double", "boolean", "string", "binary",
     "date", "timestamp", "timestamp_ntz"}
)
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


class _Unavailable:
    """Sentinel for Debezium's ``__debezium_unavailable_value`` (unchanged TOAST)."""

    _instance: _Unavailable | None = None

    def __new__(cls) -> _Unavailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNAVAILABLE"

    def __reduce__(self) -> str:
        # Pickles as the module-level name so identity survives the Spark worker boundary.
        return "UNAVAILABLE"


UNAVAILABLE: Final = _Unavailable()
#: The type of a schemaless JSON column that is null in a message: no type is known yet, and any
#: type holds it (:func:`ingest.rules.schema.holds`); a table never stores it.
UNTYPED: Final = "void"


def parse_decimal(type_name: str) -> tuple[int, int] | None:
    """Return ``(precision, scale)`` for ``decimal(p,s)``, else ``None``."""
    m = _DECIMAL.match(type_name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_valid_type(type_name: str) -> bool:
    """True if ``type_name`` is a Delta primitive this engine writes."""
    return type_name in DELTA_PRIMITIVES or parse_decimal(type_name) is not None


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """A column of a change image as the source schema describes it.

    Args:
        name: source column name, kept as-is in the target table.
        type: Delta primitive type name, e.g. ``long``, ``decimal(10,2)``, ``timestamp``.
        nullable: whether the source allows nulls.
        semantic: the Debezium/Connect semantic type name it came from, if any (for docs/debugging).
        default: the source's default value for the column as its schema states it, as SQL-like text
            (``'x'``, ``5``), or ``None`` for none or NULL. Informative only: two specs that differ
            in it are the same column.
    """

    name: str
    type: str
    nullable: bool = True
    semantic: str | None = None
    default: str | None = field(default=None, compare=False)

    def __reduce__(self) -> tuple[builtins.type[ColumnSpec], tuple[Any, ...]]:
        # Events cross the Spark worker boundary pickled; the dataclass default is ~10x slower.
        return (ColumnSpec, (self.name, self.type, self.nullable, self.semantic, self.default))


#: Phases of a change at one source point: a snapshot read orders before a streamed change there,
#: and a delete carried only by a Kafka tombstone orders right after the change it follows.
SNAPSHOT, STREAMED, AFTER = 0, 1, 2
#: Widest component accepted (an SQL Server LSN has 80 bits; Oracle SCNs are unbounded in theory).
MAX_COMPONENT: Final = (1 << 128) - 1
_KAFKA_PARTITION_HEX = 8  # Kafka partitions are int32: fixed width, so SQL can compare the prefix


def _component(value: int) -> str:
    """Order-preserving text of a non-negative integer: two hex digits of length, then the digits."""
    if not value:
        return "00"
    digits = f"{value:x}"
    return _LENGTHS[len(digits)] + digits  # at most 32 digits (MAX_COMPONENT)


_LENGTHS: Final = tuple(f"{n:02x}" for n in range(256))


class SourcePosition(NamedTuple):
    """Comparable place of a change in the source's history.

    Built from the Debezium ``source`` block (see :func:`ingest.decode.position.source_position`):
    PostgreSQL ``(commit point, lsn, 0)``, MySQL ``(binlog file number, pos, row)``, SQL Server and
    Db2 ``(commit_lsn, change_lsn, event_serial_no)``, Oracle ``(commit_scn, scn, txSeq)``, MongoDB
    ``(ts_ms, ord, 0)``. ``phase`` is :data:`SNAPSHOT` for reads, :data:`STREAMED` for changes and
    :data:`AFTER` for a delete carried only by a Kafka tombstone.

    Without any of those (``fallback``), the position is the Kafka ``(partition, offset)``. Offsets
    of different partitions are not comparable; :mod:`ingest.rules.ordering` never compares them as one
    sequence.

    The encoded form (``s...``/``k...``) is text whose order is the position order, so Delta and SQL
    compare it directly; every component is variable-width with a length prefix.

    A named tuple, not a dataclass: one is built for every message decoded, and a tuple is built
    several times faster; it compares field by field, in this order.
    """

    a: int
    b: int
    c: int
    phase: int
    fallback: bool = False

    def encode(self) -> str:
        if self.fallback:
            return f"k{self.a:0{_KAFKA_PARTITION_HEX}x}{_component(self.b)}{_component(self.c)}{self.phase}"
        return f"s{_component(self.a)}{_component(self.b)}{_component(self.c)}{self.phase}"

    @classmethod
    def decode(cls, text: str) -> SourcePosition:
        """Inverse of :meth:`encode`.

        Raises:
            ValueError: ``text`` is not an encoded position.
        """
        try:
            kind, rest = text[0], text[1:]
            parts: list[int] = []
            if kind == "k":
                parts.append(int(rest[:_KAFKA_PARTITION_HEX], 16))
                rest = rest[_KAFKA_PARTITION_HEX:]
            elif kind != "s":
                raise ValueError(kind)
            while len(rest) > 1:
                width = int(rest[:2], 16)
                parts.append(int(rest[2:2 + width] or "0", 16))
                rest = rest[2 + width:]
            a, b, c = parts
            return cls(a, b, c, int(rest), kind == "k")
        except (ValueError, IndexError):
            raise ValueError(f"not an encoded source position: {text!r}") from None

    @classmethod
    def kafka(cls, partition: int, offset: int) -> SourcePosition:
        return cls(partition, offset, 0, STREAMED, True)

    def after(self) -> SourcePosition:
        """The position right after this one at the same source point (a tombstone's delete)."""
        return SourcePosition(self.a, self.b, self.c, AFTER, self.fallback)


class KafkaCoordinates(NamedTuple):
    """Where a message sits in its topic (a named tuple: one is built for every message decoded)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None


def key_text(key: Mapping[str, Any]) -> str:
    """A row's primary key as the quarantine names it (``row_key``): JSON of ``{column: value}``, a
    value JSON cannot hold (a date, a decimal, a timestamp) written as its text."""
    return json.dumps(dict(key), default=str)


_P = TypeVar("_P", int, str)  # a partition: its number, or as Kafka's JSON names it


def ends_before(ends: Mapping[_P, int], applied: Callable[[_P], int | None]) -> dict[_P, tuple[int, int]]:
    """The partitions of a topic that end (``ends``: the next offset of each) at or before the last offset
    ``applied`` gives for them (``None``: none), as ``partition -> (that offset, the end)``.

    Kafka keeps a topic's offsets through retention and compaction, and its end offsets only grow, so
    such a topic is not the one that was read: it was deleted and created again, or it is another
    cluster's (:class:`ingest.errors.TopicBehindTableError`).
    """
    return {p: (done, end) for p, end in sorted(ends.items())
            if (done := applied(p)) is not None and end <= done}


@dataclass(slots=True)
class ChangeEvent:
    """One decoded Debezium row change.

    Args:
        op: ``c`` create, ``u`` update, ``d`` delete, ``r`` snapshot read, ``t`` truncate.
        key: primary-key column values (from the Kafka key; empty for a truncate).
        after: the row after the change (``None`` for ``d`` and ``t``).
        before: the row before the change if the connector sent it.
        position: ordering position (see :class:`SourcePosition`).
        columns: types of the image columns, in source order.
        key_columns: primary-key column names, in key order.
        source_ts_ms: ``source.ts_ms`` (when the change happened in the database), if known.
        snapshot: the ``source.snapshot`` value (``true``, ``first``, ``last``, ``incremental`` ...).
        unavailable: columns whose value is the unchanged-TOAST placeholder.
        schema_ref: identifies the value schema (e.g. ``avro:42``), for schema-evolution checks.
        flattened: the record was a row flattened by ``ExtractNewRecordState`` (``__op``, ``__lsn``
            ...), not a full envelope; in such a stream a Kafka tombstone is the delete of its key.
        transaction: the envelope's ``transaction`` block (connector option
            ``provide.transaction.metadata``): the source transaction's id and this change's
            ``data_collection_order``, its place among the transaction's changes of this table.
        moved_from: an update that moved the row from another key, when the table's key is the
            configured ``primary_key`` (Debezium, not knowing that key, sends the move as one
            update): the old key's values, read from the before image.
    """

    op: Op
    key: dict[str, Any]
    after: dict[str, Any] | None
    before: dict[str, Any] | None
    position: SourcePosition
    columns: tuple[ColumnSpec, ...]
    key_columns: tuple[str, ...]
    source_ts_ms: int | None = None
    snapshot: str | None = None
    unavailable: frozenset[str] = field(default_factory=frozenset)
    schema_ref: str | None = None
    flattened: bool = False
    transaction: tuple[str, int] | None = None
    moved_from: dict[str, Any] | None = None

    @property
    def is_delete(self) -> bool:
        return self.op == "d"

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (ChangeEvent, (self.op, self.key, self.after, self.before, self.position, self.columns,
                              self.key_columns, self.source_ts_ms, self.snapshot, self.unavailable, self.schema_ref,
                              self.flattened, self.transaction, self.moved_from))


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A message that carries no row change of its own; counted as skipped in the audit.

    A Kafka tombstone (``kind="tombstone"``) also carries its decoded ``key`` (or why the key could
    not be read, ``key_error``): after a full envelope's ``d`` it only serves log compaction, but in
    a flattened stream it is the delete of that key (see :mod:`ingest.rules.kafka_tombstones`).
    """

    kind: ControlKind
    detail: str = ""
    key: dict[str, Any] | None = None
    key_columns: tuple[str, ...] = ()
    key_error: str | None = None


#: ``source.snapshot`` marks that close a table's initial snapshot (its last read, or the snapshot's).
SNAPSHOT_CLOSERS: Final = frozenset({"last_in_data_collection", "last"})


@dataclass(frozen=True, slots=True)
class SourceMark:
    """How far into the source's transactions a table's changes reach (docs/architecture.md#cuts-across-tables).

    A table's commits carry the mark of everything it has received, carried forward; a batch's own
    mark (:meth:`merged` into the table's) says what that batch received.

    Attributes:
        txn: the transaction of the latest transactional change received (by source position).
        txn_order: that change's place among its transaction's changes of this table.
        txn_position: that change's encoded source position.
        snapshot: ``none`` (no initial-snapshot read), ``open`` (reads, not yet the table's last), or
            ``closed`` (the table's last read, or a streamed transactional change, came).
        untracked: streamed changes received without a transaction block (then no cut can be proven).
    """

    txn: str | None = None
    txn_order: int | None = None
    txn_position: str | None = None
    snapshot: Literal["none", "open", "closed"] = "none"
    untracked: int = 0

    def merged(self, batch: SourceMark) -> SourceMark:
        """This (carried-forward) mark moved on by a batch's."""
        newer = batch.txn_position is not None and (self.txn_position is None
                                                    or batch.txn_position > self.txn_position)
        txn = batch if newer else self
        snapshot = "closed" if "closed" in (self.snapshot, batch.snapshot) else (
            "open" if "open" in (self.snapshot, batch.snapshot) else "none")
        return SourceMark(txn.txn, txn.txn_order, txn.txn_position, snapshot,  # type: ignore[arg-type]
                          self.untracked + batch.untracked)

    def to_json(self) -> dict[str, Any]:
        return {"txn": self.txn, "txn_order": self.txn_order, "txn_position": self.txn_position,
                "snapshot": self.snapshot, "untracked": self.untracked}

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> SourceMark:
        if not raw:
            return cls()
        return cls(raw.get("txn"), raw.get("txn_order"), raw.get("txn_position"), raw.get("snapshot") or "none",
                   int(raw.get("untracked") or 0))
