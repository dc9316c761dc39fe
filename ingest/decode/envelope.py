"""Debezium records -> :class:`ChangeEvent` / :class:`ControlRecord`.

The wire readers (:mod:`.avro`, :mod:`.jsonconv`) hand over a plain record (dict) and, when the
message had a schema, a :class:`ValuePlan` built once for that schema. This module reads what the
record means: a change envelope (``before``/``after``/``source``/``op``), a row already flattened by
``ExtractNewRecordState`` (``__op``, ``__deleted``, ``__lsn`` ...), or one of the records that carry no
row change (heartbeat, schema change, transaction boundary, logical message, tombstone).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ingest.decode.position import optional_int, source_position
from ingest.decode.semantic import FieldPlan, as_key_field, convert_image, infer_image
from ingest.errors import DecodeError
from ingest.model import (
    SNAPSHOT,
    STREAMED,
    UNAVAILABLE,
    ChangeEvent,
    ColumnSpec,
    ControlRecord,
    KafkaCoordinates,
    Op,
)

RecordKind = Literal["envelope", "flattened", "heartbeat", "schema_change", "transaction"]
#: Reads the Kafka key bytes into ``{column: value}`` (``None`` when the message has no key).
KeyReader = Callable[[bytes | None], dict[str, Any] | None]

_OPS: Final[frozenset[str]] = frozenset({"c", "u", "d", "r", "t"})
_SCHEMA_CHANGE_FIELDS: Final = frozenset({"ddl", "tableChanges", "historyRecord"})
_IMAGE_FIELDS: Final = frozenset({"before", "after"})
#: Kafka key already decoded by the caller (or not yet: :data:`_UNREAD`).
_UNREAD: Final[Any] = object()
_NO_UNAVAILABLE: Final[frozenset[str]] = frozenset()


@dataclass(frozen=True, slots=True)
class ValuePlan:
    """What a value schema says, worked out once per schema id / fingerprint.

    Args:
        kind: what records of this schema are.
        image: plans of the row columns (the envelope's ``after``/``before`` struct, or the
            flattened row without its ``__`` fields); empty for control records.
        columns: the column specs of ``image``, in schema order.
        schema_ref: ``avro:<id>`` or ``json:<sha1-prefix>``.
        meta: names of the ``__`` metadata fields of a flattened row.
    """

    kind: RecordKind
    image: tuple[FieldPlan, ...]
    columns: tuple[ColumnSpec, ...]
    schema_ref: str
    meta: tuple[str, ...] = ()
    _by_key: dict[tuple[str, ...], ValuePlan] = field(default_factory=dict, compare=False, repr=False)

    def for_key(self, key_columns: tuple[str, ...]) -> ValuePlan:
        """This plan with its primary-key columns read as keys (:func:`.semantic.as_key_field`).

        A key must keep every value distinct: a nanosecond timestamp key stays exact instead of
        being cut to Delta's microseconds. Worked out once per schema and key.
        """
        plan = self._by_key.get(key_columns)
        if plan is None:
            image = tuple(as_key_field(f) if f.name in key_columns else f for f in self.image)
            same = all(a is b for a, b in zip(image, self.image, strict=True))
            plan = self if same else make_value_plan(self.kind, image, self.schema_ref, self.meta)
            self._by_key[key_columns] = plan
        return plan


def classify(field_names: Collection[str], schema_name: str | None) -> RecordKind:
    """Tell what a record is from its top-level field names (and schema name, when known)."""
    names = frozenset(field_names)
    if (schema_name or "").endswith("Heartbeat") or names == {"ts_ms"}:
        return "heartbeat"
    if names & _SCHEMA_CHANGE_FIELDS:
        return "schema_change"
    if "status" in names and ("event_count" in names or "data_collections" in names):
        return "transaction"
    if (
        (schema_name or "").endswith(".Envelope")
        or ("op" in names and ("source" in names or names & _IMAGE_FIELDS))
        or ("source" in names and names & _IMAGE_FIELDS)
    ):
        return "envelope"
    return "flattened"


def make_value_plan(kind: RecordKind, image: tuple[FieldPlan, ...], schema_ref: str,
                    meta: tuple[str, ...] = ()) -> ValuePlan:
    """Build the plan of a value schema (the column specs are collected once, here)."""
    return ValuePlan(kind, image, tuple(f.spec for f in image), schema_ref, meta)


def to_event(
    record: Any,
    plan: ValuePlan | None,
    *,
    key: bytes | None,
    read_key: KeyReader,
    key_columns: tuple[str, ...] | None,
    coords: KafkaCoordinates,
    keep_before: bool = True,
) -> ChangeEvent | ControlRecord:
    """Turn one decoded value record into a change event or a control record.

    Args:
        record: the decoded value (``None`` for a tombstone).
        plan: the value schema's plan, or ``None`` when the message had no schema.
        key: raw Kafka key bytes, read only if the key is needed.
        read_key: decodes ``key``.
        key_columns: configured primary-key columns (``None``/empty: use the Kafka key).
        coords: the message's Kafka coordinates (position fallback).

    Raises:
        DecodeError: the record is not a change Debezium could have sent.
    """
    if record is None:
        return tombstone(key, read_key, key_columns)
    if not isinstance(record, dict):
        raise DecodeError(f"envelope: value is a {type(record).__name__}, not a record")
    if plan is not None:
        kind = plan.kind
    elif "op" in record and ("source" in record or "after" in record or "before" in record):
        kind = "envelope"  # the common case, without building a set of the field names
    else:
        kind = classify(record.keys(), None)
    if kind == "envelope":
        return _envelope(record, plan, key, read_key, key_columns or None, coords, keep_before)
    if kind == "flattened":
        return _flattened(record, plan, key, read_key, key_columns or None, coords)
    return _control(kind, record)


def _envelope(record: dict[str, Any], plan: ValuePlan | None, key: bytes | None, read_key: KeyReader,
              key_columns: tuple[str, ...] | None, coords: KafkaCoordinates,
              keep_before: bool = True) -> ChangeEvent | ControlRecord:
    op = record.get("op")
    if op is None:
        raise DecodeError("envelope: missing 'op'")
    if op == "m":
        message = record.get("message")
        return ControlRecord("message", str(message.get("prefix", "")) if isinstance(message, dict) else "")
    if op not in _OPS:
        raise DecodeError(f"envelope: unknown op {op!r}")
    source = record.get("source")
    if not isinstance(source, dict):
        source = {}
    position = source_position(source, SNAPSHOT if op == "r" else STREAMED, coords, trust_connector=True)
    source_ts_ms = optional_int(source.get("ts_ms"))
    if source_ts_ms is None:
        source_ts_ms = optional_int(record.get("ts_ms"))
    snapshot = snapshot_mark(source.get("snapshot"))
    schema_ref = plan.schema_ref if plan is not None else None
    transaction = transaction_of(record.get("transaction"), source.get("connector"))
    if op == "t":
        columns = plan.columns if plan is not None else ()
        return ChangeEvent("t", {}, None, None, position, columns, (), source_ts_ms, snapshot,
                           _NO_UNAVAILABLE, schema_ref, transaction=transaction)
    plan, kafka_key = _keyed(plan, key_columns, key, read_key)
    # A configured key's update may move the row: only its before image says from where.
    reads_before = keep_before or op == "d" or (bool(key_columns) and op == "u")
    raw_before = record.get("before") if reads_before else None
    before, before_columns, before_unavailable = _image(raw_before, plan, "before")
    after, after_columns, after_unavailable = _image(record.get("after"), plan, "after")
    if op == "d":
        image, columns, unavailable, after = before, before_columns, before_unavailable, None
    elif after is None:
        raise DecodeError(f"envelope: op '{op}' without an 'after' image")
    else:
        image, columns, unavailable = after, after_columns, after_unavailable
    key_values, key_names = resolve_key(image, key_columns, key, read_key, kafka_key)
    moved_from = _moved_from(before, key_values) if key_columns and op == "u" else None
    if moved_from is None and op == "u" and not keep_before:
        before = None
    return ChangeEvent(op, key_values, after, before, position, columns, key_names, source_ts_ms, snapshot,
                       unavailable, schema_ref, transaction=transaction, moved_from=moved_from)


def _moved_from(before: Mapping[str, Any] | None, key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The old key of an update whose configured key columns changed, from its before image;
    ``None`` when they did not change or the before image does not hold them all (PostgreSQL's
    ``REPLICA IDENTITY DEFAULT`` sends only the table's own primary key there)."""
    if before is None:
        return None
    old = {name: before.get(name) for name in key}
    if any(value is None or value is UNAVAILABLE for value in old.values()) or old == key:
        return None
    return old


def transaction_of(block: Any, connector: Any = None) -> tuple[str, int] | None:
    """``(id, data_collection_order)`` of an envelope's ``transaction`` block; ``None`` without one.

    PostgreSQL's connector writes ``<txId>:<LSN>`` with the LSN of each change (its END record: of
    the commit), so a PostgreSQL transaction is known by its ``txId`` alone
    (:func:`ingest.cuts.calculus.transaction_keys`).
    """
    if type(block) is not dict:
        return None
    txn, order = block.get("id"), optional_int(block.get("data_collection_order"))
    if txn is None or order is None:
        return None
    text = str(txn)
    if connector == "postgresql":
        text = text.split(":", 1)[0]
    return text, order


def _keyed(plan: ValuePlan | None, key_columns: tuple[str, ...] | None, key: bytes | None,
           read_key: KeyReader) -> tuple[ValuePlan | None, Any]:
    """The value plan specialised for the row's key columns, and the Kafka key if it had to be read."""
    if plan is None:
        return None, _UNREAD
    if key_columns:
        return plan.for_key(key_columns), _UNREAD
    kafka_key = read_key(key)
    return (plan.for_key(tuple(kafka_key)) if kafka_key else plan), kafka_key


def tombstone(key: bytes | None, read_key: KeyReader, key_columns: tuple[str, ...] | None) -> ControlRecord:
    """A Kafka tombstone with its key decoded (or why it could not be), never an error by itself."""
    try:
        values, names = resolve_key(None, key_columns or None, key, read_key)
    except DecodeError as exc:
        return ControlRecord("tombstone", key_error=exc.reason)
    return ControlRecord("tombstone", key=values, key_columns=names)


def _image(raw: Any, plan: ValuePlan | None, label: str
           ) -> tuple[dict[str, Any] | None, tuple[ColumnSpec, ...], frozenset[str]]:
    if raw is None:
        return None, plan.columns if plan is not None else (), _NO_UNAVAILABLE
    if not isinstance(raw, dict):
        raise DecodeError(f"envelope: '{label}' is a {type(raw).__name__}, not a record")
    if plan is None:
        values, columns, unavailable = infer_image(raw)
        return values, columns, unavailable
    values, unavailable = convert_image(raw, plan.image)
    return values, plan.columns, unavailable


def _flattened(record: dict[str, Any], plan: ValuePlan | None, key: bytes | None, read_key: KeyReader,
               key_columns: tuple[str, ...] | None, coords: KafkaCoordinates) -> ChangeEvent | ControlRecord:
    meta_names = plan.meta if plan is not None else [k for k in record if k.startswith("__")]
    meta = {name[2:]: record.get(name) for name in meta_names}
    deleted = meta.get("deleted")
    is_deleted = deleted is True or (isinstance(deleted, str) and deleted.lower() == "true")
    raw_op = meta.get("op")
    if raw_op == "m":
        return ControlRecord("message")
    if raw_op is not None and raw_op not in _OPS:
        raise DecodeError(f"envelope: unknown op {raw_op!r} in '__op'")
    # Without __op a row is an upsert: "u" is the safe reading for both inserts and updates.
    op: Op = "d" if is_deleted else (raw_op or "u")
    source = _flattened_source(meta)
    position = source_position(source, SNAPSHOT if op == "r" else STREAMED, coords, trust_connector=False)
    source_ts_ms = optional_int(source.get("ts_ms"))
    snapshot = snapshot_mark(source.get("snapshot"))
    schema_ref = plan.schema_ref if plan is not None else None
    if op == "t":
        columns = plan.columns if plan is not None else ()
        return ChangeEvent("t", {}, None, None, position, columns, (), source_ts_ms, snapshot,
                           _NO_UNAVAILABLE, schema_ref, True)
    plan, kafka_key = _keyed(plan, key_columns, key, read_key)
    if plan is None:
        row, columns, unavailable = infer_image(record, skip_meta=True)
    else:
        row, unavailable = convert_image(record, plan.image)
        columns = plan.columns
    key_values, key_names = resolve_key(row, key_columns, key, read_key, kafka_key)
    after, before = (None, row) if op == "d" else (row, None)
    return ChangeEvent(op, key_values, after, before, position, columns, key_names, source_ts_ms, snapshot,
                       unavailable, schema_ref, True)


def _flattened_source(meta: Mapping[str, Any]) -> dict[str, Any]:
    # ExtractNewRecordState names source fields __lsn, __file ..., and those that clash with envelope
    # fields __source_ts_ms etc.; the source_ spelling wins because it is the database's own time.
    present = {name: value for name, value in meta.items() if value is not None}
    plain = {name: value for name, value in present.items() if not name.startswith("source_")}
    return plain | {name[7:]: value for name, value in present.items() if name.startswith("source_")}


def _control(kind: RecordKind, record: Mapping[str, Any]) -> ControlRecord:
    if kind == "heartbeat":
        return ControlRecord("heartbeat", f"ts_ms={record.get('ts_ms')}")
    if kind == "schema_change":
        ddl = record.get("ddl")
        return ControlRecord("schema_change", str(ddl)[:200] if ddl else "")
    return ControlRecord("transaction", f"{record.get('status')} {record.get('id')}")


def resolve_key(image: Mapping[str, Any] | None, key_columns: tuple[str, ...] | None, key: bytes | None,
                read_key: KeyReader, kafka_key: Any = _UNREAD) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Primary-key values of a change.

    With ``key_columns`` configured, values come from the row image by those names; the Kafka key
    is decoded only for a column the image lacks (or holds as null). Without it, the Kafka key's
    columns are the key.

    Raises:
        DecodeError: a key column is null or missing, or there is no key at all.
    """
    if key_columns:
        values: dict[str, Any] = {}
        key_read = kafka_key is not _UNREAD
        for name in key_columns:
            value = image.get(name) if image is not None else None
            if value is None or value is UNAVAILABLE:
                if not key_read:
                    kafka_key, key_read = read_key(key), True
                value = kafka_key.get(name) if kafka_key else None
                if value is None or value is UNAVAILABLE:
                    known = name in (image or ()) or name in (kafka_key or ())
                    suffix = "" if known else " (missing from the row image and the Kafka key)"
                    raise DecodeError(f"key: null primary key column '{name}'{suffix}")
            values[name] = value
        return values, key_columns
    if kafka_key is _UNREAD:
        kafka_key = read_key(key)
    if kafka_key is None:
        raise DecodeError("key: the message has no Kafka key, and its table has no primary_key configured")
    if not kafka_key:
        raise DecodeError("key: the Kafka key has no columns; configure the table's primary_key")
    for name, value in kafka_key.items():
        if value is None:
            raise DecodeError(f"key: null primary key column '{name}'")
    return kafka_key, tuple(kafka_key)


def snapshot_mark(value: Any) -> str | None:
    """A `source.snapshot` value as text (older connectors send a boolean)."""
    if value is None:
        return None
    if isinstance(value, bool):  # older connectors send a boolean
        return "true" if value else "false"
    return str(value)
