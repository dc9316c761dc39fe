"""One table's micro-batch on the driver: from decoded rows to an audited Delta commit.

The journey: drop what the table already applied (its app transactions say so) -> split changes,
control records and undecodable messages -> reduce to the latest change per key -> validate those
after-images with the table's expectations suite (:mod:`ingest.quality`) -> quarantine what cannot
or must not be applied -> one MERGE commit -> audit row.
"""

from __future__ import annotations

import json
import pickle
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest import audit, faults, quarantine
from ingest.audit import AuditRecord
from ingest.config import IngestConfig, TableSpec
from ingest.errors import DecodeError, RegistryUnavailableError, TableError
from ingest.events import ChangeEvent, ColumnSpec, ControlRecord, KafkaCoordinates
from ingest.merge import MergeOutcome, MergeRequest, apply_batch
from ingest.quality.gate import Hold, QualityGate, QualityReport
from ingest.quarantine import QuarantineRecord
from ingest.reduce import PositionedChange, Reduction, event_key, reduce_changes
from ingest.tablestate import TableState, load_state
from ingest.tombstone_deletes import Tombstone, are_deletes, resolve

#: Rows produced by the decode step (Spark ``mapInArrow``), one per Kafka message.
DECODED_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("kind", pa.string()),  # change | control | error
        ("payload", pa.binary()),  # pickled ChangeEvent / ControlRecord
        ("reason", pa.string()),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),
    ]
)
DECODED_DDL = (
    "topic string, partition int, offset long, timestamp timestamp, kind string, payload binary, "
    "reason string, raw_key binary, raw_value binary"
)


class DecodeStep:
    """The function Spark runs in ``mapInArrow``: Kafka rows in, decoded rows out.

    Picklable (Spark ships it to Python workers); the decoder and its schema caches are built
    lazily once per worker process.
    """

    def __init__(self, *, value_format: str, registry_dir: str | None, registry_url: str | None,
                 key_columns: tuple[str, ...] | None, registry_credentials_env: str | None = None,
                 secrets_file: str | None = None) -> None:
        self.value_format = value_format
        self.registry_dir = registry_dir
        self.registry_url = registry_url
        self.key_columns = key_columns
        # Where the registry's credentials are found, never the credentials: they are looked up in
        # the worker, so no secret travels in the pickled plan.
        self.registry_credentials_env = registry_credentials_env
        self.secrets_file = secrets_file
        self._decoder: Any = None

    @classmethod
    def for_table(cls, config: IngestConfig, spec: TableSpec) -> DecodeStep:
        """The decode step of one configured table (source format, registry, key override)."""
        source = config.source
        return cls(
            value_format=source.value_format,
            registry_dir=str(config.registry_dir) if source.registry.kind == "embedded" else None,
            registry_url=source.registry.url if source.registry.kind == "confluent" else None,
            key_columns=spec.primary_key,
            registry_credentials_env=source.registry.credentials_env,
            secrets_file=str(config.secrets_path) if config.secrets_path else None,
        )

    def decoder(self) -> Any:
        if self._decoder is None:
            from ingest.decode import MessageDecoder
            from ingest.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry

            registry: Any = (
                ConfluentSchemaRegistry.from_settings(self.registry_url, credentials_env=self.registry_credentials_env,
                                                      secrets_file=self.secrets_file) if self.registry_url
                else EmbeddedSchemaRegistry(self.registry_dir) if self.registry_dir else None)
            self._decoder = MessageDecoder(value_format=self.value_format,  # type: ignore[arg-type]
                                           registry=registry, key_columns=self.key_columns)
        return self._decoder

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_decoder"] = None
        return state

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = self.decoder()
        for batch in batches:
            for part in byte_bounded(batch, DECODE_SLICE_BYTES):
                yield decode_batch(decoder, part)


#: Raw bytes decoded into one output batch. The output holds the raw key and value again plus the
#: decoded change, so it stays well below Arrow's 2 GiB per binary column of a batch.
DECODE_SLICE_BYTES = 256 * 1024 * 1024


def byte_bounded(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    """Slices of ``batch`` whose keys and values hold at most ``limit`` bytes (at least one row each)."""
    if batch.nbytes <= limit:
        yield batch
        return
    sizes = pc.add(pc.fill_null(pc.binary_length(batch.column("key")), 0),
                   pc.fill_null(pc.binary_length(batch.column("value")), 0)).to_pylist()
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if total + size > limit and i > start:
            yield batch.slice(start, i - start)
            start, total = i, 0
        total += size
    yield batch.slice(start)


def decode_batch(decoder: Any, batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """Decode Kafka-shaped rows; a message that fails becomes an ``error`` row, never an exception."""
    cols = batch.to_pydict()
    out: dict[str, list[Any]] = {name: [] for name in DECODED_SCHEMA.names}
    sent_columns: set[str] = set()
    for topic, partition, offset, ts, key, value in zip(
        cols["topic"], cols["partition"], cols["offset"], cols["timestamp"], cols["key"], cols["value"], strict=True
    ):
        coords = KafkaCoordinates(topic, partition, offset, int(ts.timestamp() * 1000) if ts else None)
        # Raw bytes travel with every row: quarantine at any later stage keeps the original message.
        kind, payload, reason = "change", None, None
        try:
            result = decoder.decode(key, value, coords)
            kind = "control" if isinstance(result, ControlRecord) else "change"
            if isinstance(result, ChangeEvent) and result.schema_ref is not None:
                # Columns of a schema travel once per batch; restore_columns() puts them back.
                if result.schema_ref in sent_columns:
                    result = replace(result, columns=())
                else:
                    sent_columns.add(result.schema_ref)
            payload = pickle.dumps(result, protocol=5)
        except DecodeError as exc:
            kind, reason = "error", exc.reason
        except RegistryUnavailableError:
            raise  # not the message's fault: fail the batch (the table stops, a rerun retries)
        except Exception as exc:  # a decoder bug must not lose the message either
            kind, reason = "error", f"decoder failure: {type(exc).__name__}: {exc}"
        out["topic"].append(topic)
        out["partition"].append(partition)
        out["offset"].append(offset)
        out["timestamp"].append(ts)
        out["kind"].append(kind)
        out["payload"].append(payload)
        out["reason"].append(reason)
        out["raw_key"].append(key)
        out["raw_value"].append(value)
    return pa.RecordBatch.from_pydict(out, schema=DECODED_SCHEMA)


def load_events(kinds: list[str], payloads: list[bytes | None]) -> list[Any]:
    """Unpickle decoded payloads and give every event the columns of its schema again."""
    results: list[Any] = [pickle.loads(p) if k != "error" and p is not None else None
                          for k, p in zip(kinds, payloads, strict=True)]
    columns = {r.schema_ref: r.columns for r in results
               if isinstance(r, ChangeEvent) and r.columns and r.schema_ref is not None}
    for r in results:
        if isinstance(r, ChangeEvent) and not r.columns and r.schema_ref in columns:
            r.columns = columns[r.schema_ref]
    return results


@dataclass(slots=True)
class TablePaths:
    table: Path
    tombstones: Path
    audit: Path
    quarantine: Path
    quality_results: Path | None = None

    @classmethod
    def of(cls, config: IngestConfig, name: str) -> TablePaths:
        root = config.tables_root
        return cls(root / name, root / "_cdc_tombstones" / name, root / config.target.audit_table,
                   root / config.target.quarantine_table, config.quality_results_dir / name)


@dataclass(slots=True)
class BatchResult:
    """What the driver did with one table's batch."""

    record: AuditRecord | None
    already_applied: int = 0
    controls: Counter[str] = field(default_factory=Counter)
    quality: QualityReport | None = None


@dataclass(slots=True)
class SplitBatch:
    """A batch split into changes, held messages and control records (step 2)."""

    changes: list[PositionedChange]
    held: list[QuarantineRecord]
    controls: Counter[str]
    offsets: dict[tuple[str, int], list[int]]
    table_key: tuple[str, ...] | None
    #: ``(topic, partition, offset)`` of a change -> its row in the decoded batch (raw bytes live there).
    rows: dict[tuple[str, int, int], int]
    #: Kafka tombstones, resolved once the batch is split (:mod:`ingest.tombstone_deletes`).
    tombstones: list[Tombstone] = field(default_factory=list)
    #: whether the batch's records are ``ExtractNewRecordState`` rows (``None``: it holds none).
    flattened: bool | None = None


def process_batch(spec: TableSpec, paths: TablePaths, rows: pa.Table, *, batch_id: int, run_id: str,
                  decode_ms: int = 0, gate: QualityGate | None = None) -> BatchResult:
    """Apply one table's decoded micro-batch (see module docstring). Idempotent under replay.

    Args:
        gate: the table's quality gate (required when the table names an expectations suite).

    Raises:
        QualityGateError: expectations under policy ``fail`` failed; nothing was written.
        SchemaIncompatibleError, CommitConflictError: from the MERGE; nothing was committed.
    """
    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    state = load_state(paths.table)

    # 1. Drop what this table already applied: its Delta app transactions are the truth.
    cols = rows.to_pydict()
    keep = []
    already = 0
    applied_cache: dict[tuple[str, int], int | None] = {}
    for i, (topic, part, off) in enumerate(zip(cols["topic"], cols["partition"], cols["offset"], strict=True)):
        tp = (topic, part)
        if tp not in applied_cache:
            applied_cache[tp] = state.applied_offset(topic, part)
        done = applied_cache[tp]
        if done is not None and off <= done:
            already += 1
        else:
            keep.append(i)
    if not keep:
        return BatchResult(None, already_applied=already)

    record = AuditRecord(table=spec.name, run_id=run_id, batch_id=batch_id, received=len(keep),
                         started_at=started_at, decode_ms=decode_ms)
    # 2. Split changes, control records and undecodable messages; tombstones of a flattened stream
    # become the deletes of their keys.
    split = split_batch(spec, cols, keep, state.key_columns or spec.primary_key, batch_id=batch_id, run_id=run_id)
    resolve_tombstones(spec, split, cols, state, batch_id=batch_id, run_id=run_id)
    record.skipped = sum(split.controls.values())
    record.offsets = json.dumps({f"{t}:{p}": span for (t, p), span in sorted(split.offsets.items())})

    # 3. Reduce to the latest change per key; 4. validate those after-images (a `fail` raises here,
    # before anything is written, so the table's offsets do not move).
    table_key = tuple(split.table_key or ())
    reduction = reduce_changes(split.changes, table_key, keep_truncated=spec.delete_mode == "soft")
    report = check_quality(spec, gate, reduction, split, cols, state.columns, batch_id=batch_id, run_id=run_id)
    fill_quality(record, report)

    # 5. Quarantine first: if we crash after it, the replay finds the rows already there.
    quarantine.write(paths.quarantine, split.held)
    record.quarantined = len(split.held)
    faults.point("after-quarantine")

    # 6. One commit.
    record.superseded = reduction.superseded
    outcome = apply_batch(MergeRequest(
        table=spec.name, path=paths.table, tombstones_path=paths.tombstones, delete_mode=spec.delete_mode,
        key_columns=table_key, reduction=reduction,
        offsets={tp: span[1] for tp, span in split.offsets.items()},
        describe=lambda outcome: fill_outcome(record, outcome).to_metadata(),
        flattened=split.flattened,
    ))
    faults.point("after-delta-commit")
    fill_outcome(record, outcome)
    record.rows_truncated = outcome.rows_truncated
    record.delta_version = outcome.delta_version
    record.status = "committed" if outcome.committed else "nothing-to-commit"
    record.apply_ms = outcome.merge_ms
    record.total_ms = decode_ms + int((time.perf_counter() - t0) * 1000)
    record.finished_at = datetime.now(UTC)
    audit.append(paths.audit, [record])
    faults.point("after-batch")
    return BatchResult(record, already_applied=already, controls=split.controls, quality=report)


def split_batch(spec: TableSpec, cols: dict[str, list[Any]], keep: list[int], table_key: tuple[str, ...] | None,
                *, batch_id: int, run_id: str) -> SplitBatch:
    """Step 2: changes to apply, messages to hold back (undecodable, wrong key) and control records."""
    split = SplitBatch([], [], Counter(), {}, table_key, {})
    payloads = load_events([cols["kind"][i] for i in keep], [cols["payload"][i] for i in keep])
    for i, result in zip(keep, payloads, strict=True):
        topic, part, off = cols["topic"][i], cols["partition"][i], cols["offset"][i]
        span = split.offsets.setdefault((topic, part), [off, off])
        span[0], span[1] = min(span[0], off), max(span[1], off)
        kind = cols["kind"][i]
        if kind == "error":
            split.held.append(_held(spec, cols, i, "decode", cols["reason"][i], batch_id, run_id))
            continue
        if isinstance(result, ControlRecord):
            if result.kind == "tombstone":
                split.tombstones.append(Tombstone(result, KafkaCoordinates(topic, part, off, _millis(cols, i)), i))
            else:
                split.controls[result.kind] += 1
            continue
        event: ChangeEvent = result
        split.flattened = event.flattened or bool(split.flattened)
        if event.op != "t":
            if split.table_key is None:
                split.table_key = event.key_columns
            if tuple(event.key_columns) != tuple(split.table_key):
                reason = (f"primary key columns {list(event.key_columns)} differ from the table's "
                          f"{list(split.table_key)}")
                split.held.append(_held(spec, cols, i, "key", reason, batch_id, run_id))
                continue
        split.rows[(topic, part, off)] = i
        split.changes.append(PositionedChange(event, KafkaCoordinates(topic, part, off, None)))
    return split


def resolve_tombstones(spec: TableSpec, split: SplitBatch, cols: dict[str, list[Any]], state: TableState, *,
                       batch_id: int, run_id: str) -> None:
    """Step 2b: tombstones are skipped, or (flattened streams) become deletes of their keys."""
    if not split.tombstones:
        return
    if not are_deletes(spec.kafka_tombstones, split.flattened, state.flattened):
        split.controls["tombstone"] += len(split.tombstones)
        return
    resolution = resolve(split.tombstones, split.changes, split.table_key, state.table, table_name=spec.name)
    for tomb, reason in resolution.unusable:
        split.held.append(_held(spec, cols, tomb.row, "key", reason, batch_id, run_id))
    split.controls.update(resolution.skipped)
    rows = {(t.coords.topic, t.coords.partition, t.coords.offset): t.row for t in split.tombstones}
    for delete in resolution.deletes:
        c = delete.coords
        split.rows[(c.topic, c.partition, c.offset)] = rows[(c.topic, c.partition, c.offset)]
        split.changes.append(delete)
    if split.table_key is None and resolution.deletes:
        split.table_key = resolution.deletes[0].event.key_columns


def _millis(cols: dict[str, list[Any]], i: int) -> int | None:
    ts = cols["timestamp"][i]
    return int(ts.timestamp() * 1000) if ts is not None else None


def check_quality(spec: TableSpec, gate: QualityGate | None, reduction: Reduction, split: SplitBatch,
                  cols: dict[str, list[Any]], table_columns: list[ColumnSpec] | None, *, batch_id: int,
                  run_id: str) -> QualityReport:
    """Step 4: run the gate; changes it holds leave the reduction and join ``split.held``.

    Raises:
        TableError: the table names a suite but no gate was given.
        QualityGateError, SuiteMismatchError: from the gate, before anything is written.
    """
    if not spec.expectations:
        return QualityReport()
    if gate is None:
        raise TableError(spec.name, f"names expectations suite {spec.expectations!r} but no quality gate was loaded")
    report = gate.check(reduction.winners, table_columns, batch_id=batch_id, run_id=run_id)
    if report.held:
        for change, hold, winner in withdraw(reduction, split.changes, report.held, tuple(split.table_key or ())):
            c, w = change.coords, winner.coords
            reason = hold.reason if c == w else (
                f"held with the later change of its key at {w.topic}[{w.partition}]@{w.offset}: {hold.reason}")
            held = _held(spec, cols, split.rows[(c.topic, c.partition, c.offset)], "quality", reason, batch_id, run_id)
            held.expectations = json.dumps(list(dict.fromkeys(hold.expectations)))
            held.row_key = json.dumps(change.event.key, default=str)
            split.held.append(held)
    return report


def withdraw(reduction: Reduction, changes: list[PositionedChange], held: dict[int, Hold],
             key_columns: tuple[str, ...]) -> list[tuple[PositionedChange, Hold, PositionedChange]]:
    """Take the held winners out of the reduction, with every earlier change of their keys.

    Returns ``(change, why, winner)`` for every change held.

    The earlier changes were only superseded by the held winner; holding them with it keeps the
    key's whole story in quarantine (a replay applies it as the batch would have, TOAST fills
    included) and each message in exactly one audit term: they move from superseded to quarantined.
    Changes older than the batch's truncate stay superseded by the truncate, which still applies.
    """
    why = {event_key(reduction.winners[i].event, key_columns): (hold, reduction.winners[i]) for i, hold in held.items()}
    cutoff = reduction.truncate.event.position.encode() if reduction.truncate else None
    out = []
    for change in changes:
        if change.event.op == "t" or (cutoff is not None and change.event.position.encode() < cutoff):
            continue
        found = why.get(event_key(change.event, key_columns))
        if found is not None:
            out.append((change, *found))
    reduction.winners = [w for i, w in enumerate(reduction.winners) if i not in held]
    reduction.superseded -= len(out) - len(held)
    return out


def fill_quality(record: AuditRecord, report: QualityReport) -> None:
    record.expectations_evaluated = report.evaluated
    record.expectations_failed = report.failed
    record.quality_status = report.status
    record.quality_failures = report.failures_json()


def fill_outcome(record: AuditRecord, outcome: MergeOutcome) -> AuditRecord:
    """Copy the apply counts into the record (before the commit, so the commit info holds them)."""
    record.inserted, record.updated, record.deleted = outcome.inserted, outcome.updated, outcome.deleted
    record.truncates = outcome.truncates_applied
    record.stale = outcome.stale
    record.toast_unknown = outcome.toast_unknown
    record.schema_change = outcome.schema_change
    return record


def _held(spec: TableSpec, cols: dict[str, list[Any]], i: int, stage: str, reason: str, batch_id: int,
          run_id: str) -> QuarantineRecord:
    return QuarantineRecord(
        table=spec.name, topic=cols["topic"][i], partition=cols["partition"][i], offset=cols["offset"][i],
        kafka_timestamp=cols["timestamp"][i], raw_key=cols["raw_key"][i], raw_value=cols["raw_value"][i],
        stage=stage, reason=reason, batch_id=batch_id, run_id=run_id, quarantined_at=datetime.now(UTC),
    )
