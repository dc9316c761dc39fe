"""The decode step's output format: *parts*, and the builder that gathers them.

A part is an Arrow record batch of one kind -- the change rows of one value schema, the tombstones
of one key shape, or the messages that carry no change (errors, heartbeats, schema changes,
transaction markers) -- with the framework columns of :data:`FRAME` first and the user columns
after them, named by position (:func:`user_field`) and declared, with their Delta types, in the
part's schema metadata (:func:`columns_of`). Each part travels as one Arrow IPC stream in one
binary cell (:data:`PARTS_DDL`); :func:`read_parts` opens them on the driver.

Imports nothing heavy: Python workers start fast.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import arrow_type
from ingest.decode import MessageDecoder
from ingest.errors import DecodeError, RegistryUnavailableError
from ingest.model import UNAVAILABLE, ChangeEvent, ColumnSpec, ControlRecord, KafkaCoordinates, key_text

if TYPE_CHECKING:
    pass

#: Output of the decode step: one Arrow IPC stream (a part) per row.
PARTS_DDL: Final = "part binary"
PARTS_SCHEMA: Final = pa.schema([("part", pa.binary())])
COLUMNS_KEY: Final = b"cdc.columns"
KIND_KEY: Final = b"cdc.part"
#: A column type the driver decides (a tombstone's key values: cast to the table's key types).
INFERRED: Final = "inferred"

TS: Final = pa.timestamp("us", tz="UTC")
#: Framework columns of every part, before the user columns.
FRAME: Final = pa.schema([
    ("_cdc_kind", pa.string()),  # change | tombstone | error | heartbeat | schema_change | transaction | message
    ("_cdc_op", pa.string()),
    ("_cdc_position", pa.string()),
    ("_cdc_topic", pa.string()),
    ("_cdc_partition", pa.int32()),
    ("_cdc_offset", pa.int64()),
    ("_cdc_timestamp", TS),  # the Kafka timestamp
    ("_cdc_source_ts", TS),
    ("_cdc_flattened", pa.bool_()),
    ("_cdc_toast", pa.list_(pa.string())),  # columns that held the unchanged-TOAST placeholder
    ("_cdc_key_columns", pa.string()),  # JSON list of the primary-key columns
    ("_cdc_schema", pa.string()),
    ("_cdc_reason", pa.string()),
    ("_cdc_raw_key", pa.binary()),
    ("_cdc_raw_value", pa.binary()),
    # The source transaction of a change and its place among that transaction's changes of the
    # table (docs/architecture.md#cuts-across-tables); the ``source.snapshot`` mark of a snapshot read.
    ("_cdc_txn", pa.string()),
    ("_cdc_txn_order", pa.int64()),
    ("_cdc_snapshot", pa.string()),
    # A primary-key update's keys: the new row's old key (Debezium's ``__debezium.oldkey`` Kafka
    # header) and the old row's new key (``__debezium.newkey``), JSON text taken from the input's
    # headers by row (docs/architecture.md#primary-key-moves).
    ("_cdc_old_key", pa.string()),
    ("_cdc_new_key", pa.string()),
    # A message that did not decode: its Kafka key's values as the quarantine names a row
    # (:func:`ingest.model.key_text`), when the key decodes.
    ("_cdc_row_key", pa.string()),
])
_FRAME_NAMES: Final = tuple(FRAME.names)
#: Framework columns taken from the input batch by row number.
_FROM_INPUT: Final = {"_cdc_topic": "topic", "_cdc_partition": "partition", "_cdc_offset": "offset",
                      "_cdc_timestamp": "timestamp"}
#: Framework columns taken from the input's Kafka headers: Debezium's on a primary-key update's records.
_FROM_HEADERS: Final = {"_cdc_old_key": "__debezium.oldkey", "_cdc_new_key": "__debezium.newkey"}
ROW_OPS: Final = frozenset({"c", "u", "r", "d"})
Message = tuple[KafkaCoordinates, int, Any, Any]  # coordinates, row in the input batch, key, value


def arrow_type_of(type_name: str) -> pa.DataType:

    return arrow_type(type_name)


def user_field(index: int) -> str:
    """The name a part gives its ``index``-th user column (see :func:`columns_of` for the real one)."""
    return f"_u{index}"


def columns_of(schema: pa.Schema) -> tuple[ColumnSpec, ...]:
    """The user columns a part declares (Delta types), from its schema metadata."""
    raw = json.loads((schema.metadata or {}).get(COLUMNS_KEY, b"[]"))
    return tuple(ColumnSpec(*column) for column in raw)


def part_kind(schema: pa.Schema) -> str:
    """``changes``, ``tombstones`` or ``meta``."""
    return (schema.metadata or {}).get(KIND_KEY, b"changes").decode()


def write_parts(parts: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """Parts as the decode step ships them: one Arrow IPC stream per part, one row each
    (:data:`PARTS_SCHEMA`; inverse of :func:`read_parts`)."""
    blobs = []
    for part in parts:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as writer:
            writer.write_batch(part)
        blobs.append(sink.getvalue().to_pybytes())
    return pa.RecordBatch.from_arrays([pa.array(blobs, pa.binary())], schema=PARTS_SCHEMA)


def read_parts(blobs: Sequence[bytes]) -> list[pa.RecordBatch]:
    """The parts of a decoded batch, from their IPC streams (inverse of :func:`write_parts`)."""
    out = []
    for blob in blobs:
        with pa.ipc.open_stream(pa.py_buffer(blob)) as reader:
            out.extend(reader)
    return out


def _metadata(kind: str, columns: tuple[ColumnSpec, ...]) -> dict[bytes, bytes]:
    return {KIND_KEY: kind.encode(),
            COLUMNS_KEY: json.dumps([[c.name, c.type, c.nullable, c.semantic, c.default]
                                    for c in columns]).encode()}


def assemble(kind: str, columns: tuple[ColumnSpec, ...], rows: list[int], given: dict[str, pa.Array],
              user: list[pa.Array], source: pa.Table) -> pa.RecordBatch:
    """A part: framework columns (given, taken from the input by row, or null) and user columns."""
    n = len(rows)
    taken = source.take(pa.array(rows, pa.int64())) if n else source.slice(0, 0)
    arrays = []
    headers = header_values(taken.column("headers").combine_chunks(), tuple(_FROM_HEADERS.values())) \
        if "headers" in taken.column_names else {}
    for name in _FRAME_NAMES:
        if name in given:
            arrays.append(given[name])
        elif name in _FROM_HEADERS and headers:
            arrays.append(headers[_FROM_HEADERS[name]])
        elif name in _FROM_INPUT:
            arrays.append(taken.column(_FROM_INPUT[name]).combine_chunks().cast(FRAME.field(name).type))
        else:
            arrays.append(pa.nulls(n, FRAME.field(name).type))
    # User columns travel under positional names: a source column may be called anything, even
    # like a framework column (the driver refuses that, naming it); their names are in the metadata.
    fields = [*FRAME, *(pa.field(user_field(i), a.type) for i, a in enumerate(user))]
    return pa.RecordBatch.from_arrays(arrays + user, schema=pa.schema(fields, metadata=_metadata(kind, columns)))


def header_values(headers: pa.Array, names: tuple[str, ...]) -> dict[str, pa.Array]:
    """Each record's value of each Kafka header of ``names``, as text (null where it has none; the
    last one wins). One pass over the headers for all the names: it runs for every decoded part."""
    n = len(headers)
    out = {name: pa.nulls(n, pa.string()) for name in names}
    if n == 0 or headers.null_count == n:
        return out
    flat = pc.list_flatten(headers)
    if len(flat) == 0:
        return out
    keys = flat.field("key")
    hits = {name: hit for name in names if pc.any(hit := pc.fill_null(pc.equal(keys, name), False)).as_py()}
    if not hits:
        return out
    rows = pc.list_parent_indices(headers)
    for name, hit in hits.items():
        values = dict(zip(pc.filter(rows, hit).to_pylist(), pc.filter(flat.field("value"), hit).to_pylist(),
                          strict=True))
        out[name] = pa.array([None if (v := values.get(i)) is None else v.decode("utf-8", "replace")
                              for i in range(n)], pa.string())
    return out


def _typed(col: ColumnSpec, values: list[Any]) -> pa.Array:
    if col.type == INFERRED:
        return pa.array(values)
    return pa.array(values, arrow_type_of(col.type))


@dataclass(slots=True)
class _Rows:
    """Rows decoded message by message, gathered for one part."""

    kind: str  # "changes" | "tombstones" | "meta"
    columns: tuple[ColumnSpec, ...]
    rows: list[int] = field(default_factory=list)
    frame: dict[str, list[Any]] = field(default_factory=dict)
    values: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.frame = {n: [] for n in _FRAME_NAMES if n not in _FROM_INPUT and n not in _FROM_HEADERS}
        self.values = {c.name: [] for c in self.columns}

    def add(self, kind: str, row: int, *, op: str | None = None, position: str | None = None,
            source_ts_ms: int | None = None, flattened: bool = False, toast: list[str] | None = None,
            key_columns: tuple[str, ...] = (), schema: str | None = None, reason: str | None = None,
            raw_key: bytes | None = None, raw_value: bytes | None = None, row_key: str | None = None,
            image: dict[str, Any] | None = None, transaction: tuple[str, int] | None = None,
            snapshot: str | None = None) -> None:
        f = self.frame
        self.rows.append(row)
        f["_cdc_kind"].append(kind)
        f["_cdc_op"].append(op)
        f["_cdc_position"].append(position)
        f["_cdc_source_ts"].append(None if source_ts_ms is None else source_ts_ms * 1000)
        f["_cdc_flattened"].append(flattened)
        f["_cdc_toast"].append(toast)
        f["_cdc_key_columns"].append(json.dumps(list(key_columns)) if key_columns else None)
        f["_cdc_schema"].append(schema)
        f["_cdc_reason"].append(reason)
        f["_cdc_raw_key"].append(raw_key)
        f["_cdc_raw_value"].append(raw_value)
        f["_cdc_row_key"].append(row_key)
        f["_cdc_txn"].append(transaction[0] if transaction else None)
        f["_cdc_txn_order"].append(transaction[1] if transaction else None)
        f["_cdc_snapshot"].append(snapshot)
        get = image.get if image is not None else (lambda _name: None)
        for name, column in self.values.items():
            column.append(get(name))

    def part(self, source: pa.Table) -> pa.RecordBatch:
        given = {}
        for name, values in self.frame.items():
            typ = FRAME.field(name).type
            given[name] = (pa.array(values, pa.int64()).cast(typ) if name == "_cdc_source_ts"
                           else pa.array(values, typ))
        user = [_typed(c, self.values[c.name]) for c in self.columns]
        return assemble(self.kind, self.columns, self.rows, given, user, source)


class PartsBuilder:
    """The parts being gathered for one input batch (rows by their number in ``source``)."""

    def __init__(self, source: pa.Table) -> None:
        self.source = source
        self.changes: dict[int, tuple[tuple[ColumnSpec, ...], _Rows]] = {}
        self.tombstones: dict[tuple[str, ...], _Rows] = {}
        self.meta = _Rows("meta", ())
        self.converted: list[pa.RecordBatch] = []

    def parts(self) -> list[pa.RecordBatch]:
        out = list(self.converted)
        out += [rows.part(self.source) for _, rows in self.changes.values()]
        out += [rows.part(self.source) for rows in self.tombstones.values()]
        if self.meta.rows:
            out.append(self.meta.part(self.source))
        return out

    def error(self, decoder: MessageDecoder, message: Message, reason: str) -> None:
        """A message that did not decode, named by its Kafka key's values where the key decodes."""
        _coords, row, key, value = message
        self.meta.add("error", row, reason=reason, raw_key=key, raw_value=value, row_key=_row_key(decoder, key))

    def slow(self, decoder: MessageDecoder, message: Message, *, record: Any = None, plan: Any = None) -> None:
        """One message through the per-message decoder (the reference for every rule)."""
        coords, row, key, value = message
        try:
            result = (decoder.event_of(record, plan, key, coords) if record is not None
                      else decoder.decode(key, value, coords))
        except DecodeError as exc:
            self.error(decoder, message, exc.reason)
            return
        except RegistryUnavailableError:
            raise  # not the message's fault: fail the batch (the table stops, a rerun retries)
        except Exception as exc:  # a decoder bug must not lose the message either
            self.error(decoder, message, f"decoder failure: {type(exc).__name__}: {exc}")
            return
        if isinstance(result, ControlRecord):
            self.control(result, row, key)
        else:
            self.change(result, row)

    def control(self, record: ControlRecord, row: int, key: Any) -> None:
        if record.kind != "tombstone":
            self.meta.add(record.kind, row)
        elif record.key is None:
            self.meta.add("tombstone", row, reason=record.key_error or "no key", raw_key=key)
        else:
            names = tuple(record.key_columns)
            rows = self.tombstones.get(names)
            if rows is None:
                rows = self.tombstones[names] = _Rows("tombstones", tuple(ColumnSpec(n, INFERRED) for n in names))
            rows.add("tombstone", row, key_columns=names, image=record.key)

    def change(self, event: ChangeEvent, row: int) -> None:
        columns = event.columns
        entry = self.changes.get(id(columns))
        if entry is None:
            # Key columns the image lacks (a key from the Kafka key only) still need a column.
            known = {c.name for c in columns}
            extra = tuple(ColumnSpec(k, INFERRED) for k in event.key_columns if k not in known)
            entry = self.changes[id(columns)] = (columns, _Rows("changes", columns + extra))
        if event.moved_from is not None and event.before is not None:
            # A configured key moved: the delete of the old key first, at the update's position, as
            # Debezium sends a move of the key it knows (docs/architecture.md#primary-key-moves).
            before = event.before  # it holds the old key: moved_from was read from it
            self._add(entry[1], event, row, "d", before, frozenset(k for k, v in before.items() if v is UNAVAILABLE))
        image = event.after if event.after is not None else event.before
        if image is not None and event.key:
            image = {**image, **event.key}
        self._add(entry[1], event, row, event.op, image, event.unavailable)

    @staticmethod
    def _add(rows: _Rows, event: ChangeEvent, row: int, op: str, image: dict[str, Any] | None,
             unavailable: frozenset[str]) -> None:
        toast = None
        if unavailable:
            toast = sorted(unavailable)
            image = {k: (None if v is UNAVAILABLE else v) for k, v in (image or {}).items()}
        rows.add("change", row, op=op, position=event.position.encode(), source_ts_ms=event.source_ts_ms,
                 flattened=event.flattened, toast=toast, key_columns=event.key_columns,
                 schema=event.schema_ref, image=image, transaction=event.transaction,
                 snapshot=event.snapshot if op == "r" else None)


def _row_key(decoder: MessageDecoder, key: bytes | None) -> str | None:
    """The key's values as the quarantine names a row; ``None`` when the key is absent or does not
    decode either (the raw key is kept all the same)."""
    try:
        values = decoder.read_key(key)
    except Exception:  # a key that fails here adds nothing to the message's own reason
        return None
    return key_text(values) if values else None
