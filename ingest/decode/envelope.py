"""Debezium records -> :class:`ChangeEvent` / :class:`ControlRecord`.

The wire readers (:mod:`.avro`, :mod:`.jsonconv`) hand over a plain record (dict) and, when the
message had a schema, a :class:`ValuePlan` built once for that schema. This module reads what the
record means: a change envelope (``before``/``after``/``source``/``op``), a row already flattened by
``ExtractNewRecordState`` (``__op``, ``__deleted``, ``__lsn`` ...), or one of the records that carry no
row change (heartbeat, schema change, transaction boundary, logical message, tombstone).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ingest.decode.semantic import FieldPlan, convert_image, infer_image
from ingest.errors import DecodeError
from ingest.events import (
    UNAVAILABLE,
    ChangeEvent,
    ColumnSpec,
    ControlRecord,
    KafkaCoordinates,
    Op,
    SourcePosition,
)

RecordKind = Literal["envelope", "flattened", "heartbeat", "schema_change", "transaction"]
#: Reads the Kafka key bytes into ``{column: value}`` (``None`` when the message has no key).
KeyReader = Callable[[bytes | None], dict[str, Any] | None]

TOMBSTONE: Final = ControlRecord("tombstone")
_OPS: Final[frozenset[str]] = frozenset({"c", "u", "d", "r", "t"})
_SCHEMA_CHANGE_FIELDS: Final = frozenset({"ddl", "tableChanges", "historyRecord"})
_IMAGE_FIELDS: Final = frozenset({"before", "after"})
_BINLOG_NUMBER: Final = re.compile(r"(\d+)$")
_MAX_POSITION: Final = (1 << 64) - 1  # SourcePosition encodes each component as 64-bit unsigned
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
        return TOMBSTONE
    if not isinstance(record, dict):
        raise DecodeError(f"envelope: value is a {type(record).__name__}, not a record")
    if plan is not None:
        kind = plan.kind
    elif "op" in record and ("source" in record or "after" in record or "before" in record):
        kind = "envelope"  # the common case, without building a set of the field names
    else:
        kind = classify(record.keys(), None)
    if kind == "envelope":
        return _envelope(record, plan, key, read_key, key_columns or None, coords)
    if kind == "flattened":
        return _flattened(record, plan, key, read_key, key_columns or None, coords)
    return _control(kind, record)


def _envelope(record: dict[str, Any], plan: ValuePlan | None, key: bytes | None, read_key: KeyReader,
              key_columns: tuple[str, ...] | None, coords: KafkaCoordinates) -> ChangeEvent | ControlRecord:
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
    position = source_position(source, 0 if op == "r" else 1, coords, trust_connector=True)
    source_ts_ms = _optional_int(source.get("ts_ms"))
    if source_ts_ms is None:
        source_ts_ms = _optional_int(record.get("ts_ms"))
    snapshot = _snapshot(source.get("snapshot"))
    schema_ref = plan.schema_ref if plan is not None else None
    if op == "t":
        columns = plan.columns if plan is not None else ()
        return ChangeEvent("t", {}, None, None, position, columns, (), source_ts_ms, snapshot,
                           _NO_UNAVAILABLE, schema_ref)
    before, before_columns, before_unavailable = _image(record.get("before"), plan, "before")
    after, after_columns, after_unavailable = _image(record.get("after"), plan, "after")
    if op == "d":
        image, columns, unavailable, after = before, before_columns, before_unavailable, None
    elif after is None:
        raise DecodeError(f"envelope: op '{op}' without an 'after' image")
    else:
        image, columns, unavailable = after, after_columns, after_unavailable
    key_values, key_names = resolve_key(image, key_columns, key, read_key)
    return ChangeEvent(op, key_values, after, before, position, columns, key_names, source_ts_ms, snapshot,
                       unavailable, schema_ref)


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
    position = source_position(source, 0 if op == "r" else 1, coords, trust_connector=False)
    source_ts_ms = _optional_int(source.get("ts_ms"))
    snapshot = _snapshot(source.get("snapshot"))
    schema_ref = plan.schema_ref if plan is not None else None
    if op == "t":
        columns = plan.columns if plan is not None else ()
        return ChangeEvent("t", {}, None, None, position, columns, (), source_ts_ms, snapshot,
                           _NO_UNAVAILABLE, schema_ref)
    if plan is None:
        row, columns, unavailable = infer_image(record, skip_meta=True)
    else:
        row, unavailable = convert_image(record, plan.image)
        columns = plan.columns
    key_values, key_names = resolve_key(row, key_columns, key, read_key)
    after, before = (None, row) if op == "d" else (row, None)
    return ChangeEvent(op, key_values, after, before, position, columns, key_names, source_ts_ms, snapshot,
                       unavailable, schema_ref)


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
                read_key: KeyReader) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Primary-key values of a change.

    With ``key_columns`` configured, values come from the row image by those names; the Kafka key
    is decoded only for a column the image lacks (or holds as null). Without it, the Kafka key's
    columns are the key.

    Raises:
        DecodeError: a key column is null or missing, or there is no key at all.
    """
    if key_columns:
        values: dict[str, Any] = {}
        kafka_key: dict[str, Any] | None = None
        key_read = False
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
    kafka_key = read_key(key)
    if kafka_key is None:
        raise DecodeError("key: the message has no Kafka key and no key_columns are configured for its table")
    if not kafka_key:
        raise DecodeError("key: the Kafka key has no columns; configure key_columns for this table")
    for name, value in kafka_key.items():
        if value is None:
            raise DecodeError(f"key: null primary key column '{name}'")
    return kafka_key, tuple(kafka_key)


def source_position(source: Mapping[str, Any], phase: int, coords: KafkaCoordinates, *,
                    trust_connector: bool) -> SourcePosition:
    """Comparable position of a change from its Debezium ``source`` block.

    PostgreSQL: ``(last committed LSN, lsn, 0)`` -- ``lsn`` alone does not order transactions, the
    commit point does. MySQL/MariaDB: ``(binlog file number, pos, row)``. Anything else: the Kafka
    ``(partition, offset)``, always phase 1.

    Args:
        source: the ``source`` block (or the fields a flattened row kept from it).
        phase: 0 for snapshot reads, 1 for streamed changes.
        coords: Kafka coordinates for the fallback.
        trust_connector: take ``source.connector`` as proof of the layout (envelopes); flattened
            rows only carry what was asked for, so there the position fields must be present.

    Raises:
        DecodeError: a position field is present but malformed.
    """
    connector = source.get("connector") if trust_connector else None
    lsn = source.get("lsn")
    if connector == "postgresql" or lsn is not None:
        committed, sequence_lsn = _pg_sequence(source.get("sequence"))
        lsn = _position_int("lsn", lsn if lsn is not None else sequence_lsn)
        return SourcePosition(committed, lsn, 0, phase)
    file, pos = source.get("file"), source.get("pos")
    if connector in ("mysql", "mariadb") or (file is not None and pos is not None):
        return SourcePosition(_binlog_number(file), _position_int("pos", pos),
                              _position_int("row", source.get("row")), phase)
    return SourcePosition.kafka(coords.partition, coords.offset)


def _pg_sequence(sequence: Any) -> tuple[int, Any]:
    if sequence is None:
        return 0, None
    if type(sequence) is str and sequence.startswith('["') and sequence.endswith('"]'):
        # The usual '["<committed>","<lsn>"]' without a JSON parse; anything else takes json.loads.
        committed, _, lsn = sequence[2:-2].partition('","')
        if committed.isdigit() and lsn.isdigit():
            return _position_int("sequence[0]", committed), lsn
    try:
        items = json.loads(sequence) if isinstance(sequence, str) else sequence
    except ValueError as exc:
        raise DecodeError(f"envelope: source.sequence is not a JSON array: {sequence!r}") from exc
    if not isinstance(items, list) or len(items) != 2:
        raise DecodeError(f"envelope: source.sequence is not a [lastCommittedLsn, lsn] pair: {sequence!r}")
    return _position_int("sequence[0]", items[0]), items[1]


def _binlog_number(file: Any) -> int:
    if file is None:
        return 0
    match = _BINLOG_NUMBER.search(str(file))
    if match is None:
        raise DecodeError(f"envelope: cannot read a binlog sequence number from source.file {file!r}")
    return _position_int("file", int(match.group(1)))


def _position_int(field: str, value: Any) -> int:
    if value is None:
        return 0
    try:
        number = int(value) if type(value) is int or type(value) is str else None
    except ValueError:
        number = None
    if number is None or not 0 <= number <= _MAX_POSITION:
        raise DecodeError(f"envelope: source.{field} is not a 64-bit unsigned integer: {value!r}")
    return number


def _optional_int(value: Any) -> int | None:
    # Documentation samples show timestamps as strings; accept those, ignore anything else.
    if type(value) is int:
        return value
    if type(value) is str and value.lstrip("-").isdigit():
        return int(value)
    return None


def _snapshot(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):  # older connectors send a boolean
        return "true" if value else "false"
    return str(value)
