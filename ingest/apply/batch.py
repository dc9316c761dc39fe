"""One table's micro-batch, columnar: the decode step's parts unified, and what the journey holds back.

The parts (:mod:`ingest.decode.columnar`) come typed by their own schema version. Here they become
three tables: ``changes`` (every row change and truncate, cast to the batch's combined columns),
``tombstones`` (Kafka tombstones with their keys) and ``meta`` (undecodable messages and the
records that carry no change). Records the table has already applied -- its Delta app transactions
say so -- are dropped first. Nothing here turns rows into Python objects.

:meth:`MicroBatch.from_parts` assembles a batch on the driver; the executors placement assembles
the same batch with its ``changes`` left in Spark (:mod:`ingest.apply.placement.executors.assembly`),
from the same functions. :class:`Held` gathers what the journey holds back for quarantine, and
:class:`BatchResult` is what a table's batch did.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ingest.columns import arrow_type, delta_type_name
from ingest.commit.state import TableState
from ingest.config import ColumnSelection
from ingest.decode.parts import FRAME, INFERRED, columns_of, part_kind
from ingest.errors import RegistryUnavailableError, TableError
from ingest.model import SNAPSHOT_CLOSERS, ColumnSpec, SourceMark
from ingest.records.quarantine import QuarantineRecord, Stage
from ingest.rules.rereads import SuspectReads
from ingest.rules.schema import combine

if TYPE_CHECKING:
    from ingest.quality.verdict import QualityReport
    from ingest.records.audit import AuditRecord

#: Control kinds that carry no row change, as the decode step names them.
CONTROL_KINDS = ("heartbeat", "schema_change", "transaction", "message")
#: A batch's change rows: an Arrow table on the driver, a DataFrame on Spark's executors.
Rows = TypeVar("Rows")
#: Raw key and value (and Kafka timestamp) of messages by ``(topic, partition, offset)``, fetched
#: again from the source for changes held back after decoding.
RawFetch = Callable[[list[tuple[str, int, int]]], dict[tuple[str, int, int], tuple[Any, Any, Any]]]


@dataclass(slots=True)
class MicroBatch(Generic[Rows]):
    """One table's batch, columnar.

    Attributes:
        changes: row changes and truncates: :data:`~ingest.decode.parts.FRAME` columns, then the
            user columns of every schema version in the batch (combined: new columns added, safe
            widenings applied); a column a schema version lacks is null in its rows. An Arrow table
            on the driver, a DataFrame (persisted until :meth:`release`) on the executors.
        tombstones: Kafka tombstones whose key decoded: framework columns and the key columns.
        meta: undecodable messages (``_cdc_kind`` ``error``, with raw bytes and reason) and control
            records (heartbeats, schema changes, transaction markers, logical messages, tombstones
            whose key could not be read).
        columns: the combined user columns of ``changes`` (Delta types).
        received: records of the batch the table had not applied yet.
        already_applied: records dropped because the table's app transactions cover them.
        offsets: ``(topic, partition) -> [first, last]`` offset of the records kept.
    """

    changes: Rows
    tombstones: pa.Table
    meta: pa.Table
    columns: list[ColumnSpec]
    received: int = 0
    already_applied: int = 0
    offsets: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    #: unpersists what the executors keep of the batch (nothing on the driver)
    release: Callable[[], object] = field(default=lambda: None, repr=False)

    @property
    def controls(self) -> Counter[str]:
        """Control records by kind (skipped in the audit)."""
        kinds = self.meta["_cdc_kind"].to_pylist() if self.meta.num_rows else []
        return Counter(k for k in kinds if k != "error")

    @property
    def errors(self) -> pa.Table:
        """The messages that could not be decoded, with their raw bytes and reason."""
        return self.meta.filter(pc.equal(self.meta["_cdc_kind"], "error"))

    @property
    def unreadable_tombstones(self) -> pa.Table:
        """Kafka tombstones whose key could not be read (with the reason)."""
        return self.meta.filter(pc.and_(pc.equal(self.meta["_cdc_kind"], "tombstone"),
                                        pc.is_valid(self.meta["_cdc_reason"])))

    def tombstone_key(self) -> tuple[str, ...] | None:
        """The primary key the batch's first tombstone names, if any."""
        if self.tombstones.num_rows == 0:
            return None
        return tuple(json.loads(self.tombstones["_cdc_key_columns"][0].as_py()))

    @classmethod
    def from_parts(cls, parts: Sequence[pa.RecordBatch], state: TableState, *, table: str = "",
                   select: ColumnSelection | None = None, key_columns: Sequence[str] = ()) -> MicroBatch[pa.Table]:
        """Unify the decode step's parts; drop what ``state`` says the table already applied.

        ``select`` keeps only the table's chosen columns (and ``key_columns``, the state's and each
        change's own key): the others are dropped before their types are combined, so no change of
        theirs can stop the table.

        Raises:
            TableError: a source column collides with the framework's reserved ``_cdc_`` prefix.
            RegistryUnavailableError: the decode step could not reach the schema registry.
            SchemaIncompatibleError: two schema versions disagree on a column's type unsafely.
        """
        changes, tombstones, meta = [], [], []
        received = already = 0
        offsets: dict[tuple[str, int], list[int]] = {}
        for part in parts:
            if part.num_rows == 0:
                continue
            named = with_source_names(pa.Table.from_batches([part]), table_name=table)
            kept = _not_applied(named, state)
            already += named.num_rows - kept.num_rows
            if kept.num_rows == 0:
                continue
            received += kept.num_rows
            add_spans(kept, offsets)
            kind = part_kind(part.schema)
            if kind == "changes":
                declared = declared_columns(kept)
                if select is not None:
                    keys = {*key_columns, *(state.key_columns or ()), *part_key_columns(kept)}
                    declared = [c for c in declared if select.keeps(c.name, keys)]
                changes.append((kept, declared))
            elif kind == "tombstones":
                tombstones.append(kept)
            else:
                meta.append(kept.select(list(FRAME.names)))
        refuse_unavailable(meta)
        columns = combine_columns([cols for _, cols in changes])
        return cls(
            changes=unify_parts([t for t, _ in changes], columns),
            tombstones=concat_frames(tombstones),
            meta=pa.concat_tables(meta) if meta else FRAME.empty_table(),
            columns=columns, received=received, already_applied=already, offsets=offsets,
        )


def part_key_columns(table: pa.Table) -> list[str]:
    """The primary-key columns a part's changes name (``_cdc_key_columns``)."""
    named = pc.unique(table["_cdc_key_columns"].drop_null()).to_pylist()
    return [k for names in named for k in json.loads(names)]


def combine_columns(versions: Sequence[Sequence[ColumnSpec]]) -> list[ColumnSpec]:
    """The union of the schema versions' columns, widened where they differ (:func:`ingest.rules.schema.combine`).

    Raises:
        SchemaIncompatibleError: two versions disagree on a column in a way no widening covers.
    """
    return combine("", versions) if versions else []


def refuse_unavailable(meta: list[pa.Table]) -> None:
    """A batch whose schema registry did not answer fails whole, before anything is written (transient)."""
    for table in meta:
        down = table.filter(pc.equal(table["_cdc_kind"], "unavailable"))
        if down.num_rows:
            raise RegistryUnavailableError(down["_cdc_reason"][0].as_py())


def with_source_names(table: pa.Table, *, table_name: str) -> pa.Table:
    """A part with its user columns under their real names (after the reserved-name check)."""
    columns = columns_of(table.schema)
    for col in columns:
        if col.name.startswith("_cdc_") or col.name.startswith("__cdc_"):
            raise TableError(table_name, f"source column {col.name!r} collides with the framework's reserved "
                                         "prefix '_cdc_'")
    renamed = table.rename_columns(list(FRAME.names) + [c.name for c in columns])
    return renamed.replace_schema_metadata(table.schema.metadata)


def declared_columns(table: pa.Table) -> list[ColumnSpec]:
    """A part's user columns; a column typed by the driver (a key the image lacked) takes its Arrow type."""
    return [c if c.type != INFERRED else ColumnSpec(c.name, delta_type_name(table.schema.field(c.name).type))
            for c in columns_of(table.schema)]


def _not_applied(table: pa.Table, state: TableState) -> pa.Table:
    if state.table is None:
        return table
    keep = None
    # A few thousand rows: Acero's thread pool costs more than it saves, and waits for a core.
    pairs = pa.table({"t": table["_cdc_topic"], "p": table["_cdc_partition"]}).group_by(
        ["t", "p"], use_threads=False).aggregate([])
    for topic, partition in zip(pairs["t"].to_pylist(), pairs["p"].to_pylist(), strict=True):
        applied = state.applied_offset(topic, partition)
        if applied is None:
            continue
        mine = pc.and_(pc.equal(table["_cdc_topic"], topic), pc.equal(table["_cdc_partition"], partition))
        done = pc.and_(mine, pc.less_equal(table["_cdc_offset"], applied))
        keep = pc.invert(done) if keep is None else pc.and_(keep, pc.invert(done))
    return table if keep is None else table.filter(keep)


def add_spans(table: pa.Table, offsets: dict[tuple[str, int], list[int]]) -> None:
    """Widen ``offsets`` (``(topic, partition) -> [first, last]``) to the offsets of ``table``'s rows."""
    grouped = pa.table({"t": table["_cdc_topic"], "p": table["_cdc_partition"], "o": table["_cdc_offset"]}).group_by(
        ["t", "p"], use_threads=False).aggregate([("o", "min"), ("o", "max")])
    for topic, partition, lo, hi in zip(grouped["t"].to_pylist(), grouped["p"].to_pylist(),
                                        grouped["o_min"].to_pylist(), grouped["o_max"].to_pylist(), strict=True):
        span = offsets.setdefault((topic, partition), [lo, hi])
        span[0], span[1] = min(span[0], lo), max(span[1], hi)


def unify_parts(tables: Sequence[pa.Table], columns: Sequence[ColumnSpec]) -> pa.Table:
    """Every part cast to the combined columns (absent ones null), in one table."""
    target = pa.schema([*FRAME, *(pa.field(c.name, arrow_type(c.type)) for c in columns)])
    if not tables:
        return target.empty_table()
    out = []
    for table in tables:
        arrays = []
        for f in target:
            if f.name in table.column_names:
                arrays.append(_widen(table[f.name], f.type))
            else:
                arrays.append(pa.nulls(table.num_rows, f.type))
        out.append(pa.Table.from_arrays(arrays, schema=target))
    return pa.concat_tables(out)


def _widen(array: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if array.type == target:
        return array
    # int -> double is the one widening that rounds (beyond 2**53); the others are exact.
    return array.cast(target, safe=not (pa.types.is_floating(target) and pa.types.is_integer(array.type)))


def concat_frames(tables: list[pa.Table]) -> pa.Table:
    """Parts whose columns differ (tombstones: each with its own key columns) in one table, absent columns null."""
    if not tables:
        return FRAME.empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


@dataclass(frozen=True, slots=True)
class BatchFacts:
    """What the journey must know of a batch's changes before it holds anything back.

    Attributes:
        flattened: whether its changes are ``ExtractNewRecordState`` rows (``None``: it has none).
        declared: the primary keys its changes declare (JSON lists); on the driver in the order
            first seen.
        rows: its changes that are not truncates.
        mark: how far into the source's transactions its changes reach (:class:`~ingest.model.SourceMark`).
        moved: its changes that name an old key: the new rows of primary-key updates
            (:mod:`~ingest.rules.moved`).
        newest: when the newest of its changes was committed in the source (``_cdc_source_ts``),
            if any says.
        reads: its snapshot reads (``r``: the initial snapshot, or an incremental one).
        incremental: those of an incremental snapshot (``source.snapshot: incremental``).
    """

    flattened: bool | None
    declared: list[str]
    rows: int
    mark: SourceMark = field(default_factory=SourceMark)
    moved: int = 0
    newest: datetime | None = None
    reads: int = 0
    incremental: int = 0


def facts_of(changes: pa.Table) -> BatchFacts:
    """:class:`BatchFacts` of changes on the driver."""
    rows = changes.filter(pc.not_equal(changes["_cdc_op"], "t")) if changes.num_rows else changes
    mark = source_mark_of(changes)
    newest = pc.max(changes["_cdc_source_ts"]).as_py() if changes.num_rows else None
    if rows.num_rows == 0:
        return BatchFacts(None, [], 0, mark, newest=newest)
    declared = [k for k in pc.unique(rows["_cdc_key_columns"]).to_pylist() if k]
    reads = pc.equal(rows["_cdc_op"], "r")
    return BatchFacts(bool(pc.any(rows["_cdc_flattened"]).as_py()), declared, rows.num_rows, mark,
                      int(pc.sum(pc.or_(pc.is_valid(rows["_cdc_old_key"]), pc.is_valid(rows["_cdc_new_key"]))).as_py()),
                      newest, int(pc.sum(reads).as_py() or 0),
                      int(pc.sum(pc.and_(reads, pc.equal(rows["_cdc_snapshot"], "incremental"))).as_py() or 0))


def source_mark_of(changes: pa.Table) -> SourceMark:
    """The :class:`~ingest.model.SourceMark` of a batch's changes (truncates included), on the driver."""
    if not changes.num_rows:
        return SourceMark()
    tracked = pc.is_valid(changes["_cdc_txn"])
    reads = pc.equal(changes["_cdc_op"], "r")
    marks = changes["_cdc_snapshot"]
    txn = order = position = None
    if pc.any(tracked).as_py():
        rows = changes.filter(tracked)
        last = pc.index(rows["_cdc_position"], pc.max(rows["_cdc_position"])).as_py()
        txn, order, position = (rows[c][last].as_py() for c in ("_cdc_txn", "_cdc_txn_order", "_cdc_position"))
    closed = txn is not None or pc.any(pc.is_in(marks, pa.array(sorted(SNAPSHOT_CLOSERS)))).as_py()
    opened = pc.any(pc.and_(reads, pc.fill_null(pc.not_equal(marks, "incremental"), True))).as_py()
    untracked = pc.sum(pc.and_(pc.invert(reads), pc.invert(tracked))).as_py() or 0
    return SourceMark(txn, order, position, "closed" if closed else "open" if opened else "none", untracked)


@dataclass(slots=True)
class BatchResult:
    """What the journey did with one table's batch."""

    record: AuditRecord | None
    already_applied: int = 0
    controls: Counter[str] = field(default_factory=Counter)
    quality: QualityReport | None = None
    #: the messages held back (quarantined, or -- for a replay -- still failing)
    held: list[QuarantineRecord] = field(default_factory=list)
    #: the keys whose incremental snapshot read contradicts the change streamed before it, to read again
    suspect_reads: SuspectReads | None = None


@dataclass(slots=True)
class Held:
    """Messages held back so far: ``(row of a table, stage, reason, expectations, key)`` gathered by step."""

    pending: list[tuple[dict[str, Any], Stage, str, str, str | None]] = field(default_factory=list)

    def add_rows(self, rows: pa.Table, stage: Stage, reasons: Sequence[str] | None = None,
                 expectations: Sequence[str] | None = None, row_keys: Sequence[str | None] | None = None) -> None:
        for i, row in enumerate(rows.select(["_cdc_topic", "_cdc_partition", "_cdc_offset", "_cdc_timestamp",
                                             "_cdc_reason", "_cdc_raw_key", "_cdc_raw_value",
                                             "_cdc_row_key"]).to_pylist()):
            reason = reasons[i] if reasons is not None else row["_cdc_reason"]
            self.pending.append((row, stage, reason, expectations[i] if expectations else "",
                                 row_keys[i] if row_keys else row["_cdc_row_key"]))

    def __len__(self) -> int:
        return len(self.pending)

    def resolve(self, table: str, fetch: RawFetch | None, *, batch_id: int, run_id: str) -> list[QuarantineRecord]:
        """Quarantine rows, with raw bytes fetched for the held changes that no longer carry them."""
        missing = [(r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]) for r, stage, *_ in self.pending
                   if stage != "decode" and r["_cdc_raw_value"] is None and r["_cdc_raw_key"] is None]
        raw = fetch(missing) if missing and fetch is not None else {}
        now = datetime.now(UTC)
        out = []
        for row, stage, reason, expectations, row_key in self.pending:
            coords = (row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"])
            key, value, _ts = raw.get(coords, (row["_cdc_raw_key"], row["_cdc_raw_value"], None))
            out.append(QuarantineRecord(
                table=table, topic=coords[0], partition=coords[1], offset=coords[2],
                kafka_timestamp=row["_cdc_timestamp"], raw_key=key, raw_value=value, stage=stage, reason=reason,
                batch_id=batch_id, run_id=run_id, quarantined_at=now, expectations=expectations, row_key=row_key))
        return out


def foreign_key_reasons(rows: pa.Table, key_columns: Sequence[str]) -> list[str]:
    """Why each change of ``rows`` is held: the primary key it declares is not the table's."""
    return [f"primary key columns {json.loads(k)} differ from the table's {list(key_columns)}"
            for k in rows["_cdc_key_columns"].to_pylist()]
