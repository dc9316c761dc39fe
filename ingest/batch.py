"""One table's micro-batch on the driver: from decoded rows to an audited Delta commit.

The journey: drop what the table already applied (its app transactions say so) -> split changes,
control records and undecodable messages -> quarantine what cannot be applied -> reduce to the
latest change per key -> one MERGE commit -> audit row.
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

from ingest import audit, faults, quarantine
from ingest.audit import AuditRecord
from ingest.config import IngestConfig, TableSpec
from ingest.errors import DecodeError
from ingest.events import ChangeEvent, ControlRecord, KafkaCoordinates
from ingest.merge import MergeOutcome, MergeRequest, apply_batch
from ingest.quarantine import QuarantineRecord
from ingest.reduce import PositionedChange, reduce_changes
from ingest.tablestate import load_state

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
                 key_columns: tuple[str, ...] | None) -> None:
        self.value_format = value_format
        self.registry_dir = registry_dir
        self.registry_url = registry_url
        self.key_columns = key_columns
        self._decoder: Any = None

    def decoder(self) -> Any:
        if self._decoder is None:
            from ingest.decode import MessageDecoder
            from ingest.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry

            registry: Any = (ConfluentSchemaRegistry({"url": self.registry_url}) if self.registry_url
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
            yield decode_batch(decoder, batch)


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

    @classmethod
    def of(cls, config: IngestConfig, name: str) -> TablePaths:
        root = config.tables_root
        return cls(root / name, root / "_cdc_tombstones" / name, root / config.target.audit_table,
                   root / config.target.quarantine_table)


@dataclass(slots=True)
class BatchResult:
    """What the driver did with one table's batch."""

    record: AuditRecord | None
    already_applied: int = 0
    controls: Counter[str] = field(default_factory=Counter)


def process_batch(spec: TableSpec, paths: TablePaths, rows: pa.Table, *, batch_id: int, run_id: str,
                  decode_ms: int = 0) -> BatchResult:
    """Apply one table's decoded micro-batch (see module docstring). Idempotent under replay."""
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
    offsets: dict[tuple[str, int], list[int]] = {}
    changes: list[PositionedChange] = []
    held: list[QuarantineRecord] = []
    controls: Counter[str] = Counter()
    table_key = state.key_columns or spec.primary_key

    # 2. Split changes, control records and undecodable messages.
    payloads = load_events([cols["kind"][i] for i in keep], [cols["payload"][i] for i in keep])
    for i, result in zip(keep, payloads, strict=True):
        topic, part, off = cols["topic"][i], cols["partition"][i], cols["offset"][i]
        span = offsets.setdefault((topic, part), [off, off])
        span[0], span[1] = min(span[0], off), max(span[1], off)
        kind = cols["kind"][i]
        if kind == "error":
            held.append(_held(spec, cols, i, "decode", cols["reason"][i], batch_id, run_id))
            continue
        if isinstance(result, ControlRecord):
            controls[result.kind] += 1
            continue
        event: ChangeEvent = result
        if event.op != "t":
            if table_key is None:
                table_key = event.key_columns
            if tuple(event.key_columns) != tuple(table_key):
                reason = f"primary key columns {list(event.key_columns)} differ from the table's {list(table_key)}"
                held.append(_held(spec, cols, i, "key", reason, batch_id, run_id))
                continue
        changes.append(PositionedChange(event, KafkaCoordinates(topic, part, off, None)))
    record.skipped = sum(controls.values())
    record.offsets = json.dumps({f"{t}:{p}": span for (t, p), span in sorted(offsets.items())})

    # 3. Quarantine first: if we crash after it, the replay finds the rows already there.
    quarantine.write(paths.quarantine, held)
    record.quarantined = len(held)
    faults.point("after-quarantine")

    # 4. Reduce to the latest change per key, then one commit.
    reduction = reduce_changes(changes, tuple(table_key or ()))
    record.superseded = reduction.superseded
    outcome = apply_batch(MergeRequest(
        table=spec.name, path=paths.table, tombstones_path=paths.tombstones, delete_mode=spec.delete_mode,
        key_columns=tuple(table_key or ()), reduction=reduction,
        offsets={tp: span[1] for tp, span in offsets.items()},
        describe=lambda outcome: _fill(record, outcome).to_metadata(),
    ))
    faults.point("after-delta-commit")
    _fill(record, outcome)
    record.rows_truncated = outcome.rows_truncated
    record.delta_version = outcome.delta_version
    record.status = "committed" if outcome.committed else "nothing-to-commit"
    record.apply_ms = outcome.merge_ms
    record.total_ms = decode_ms + int((time.perf_counter() - t0) * 1000)
    record.finished_at = datetime.now(UTC)
    audit.append(paths.audit, [record])
    faults.point("after-batch")
    return BatchResult(record, already_applied=already, controls=controls)


def _fill(record: AuditRecord, outcome: MergeOutcome) -> AuditRecord:
    """Copy the apply counts into the record (before the commit, so the commit info holds them)."""
    record.inserted, record.updated, record.deleted = outcome.inserted, outcome.updated, outcome.deleted
    record.truncates = outcome.truncates_applied
    record.stale = outcome.stale
    record.schema_change = outcome.schema_change
    return record


def _held(spec: TableSpec, cols: dict[str, list[Any]], i: int, stage: str, reason: str, batch_id: int,
          run_id: str) -> QuarantineRecord:
    return QuarantineRecord(
        table=spec.name, topic=cols["topic"][i], partition=cols["partition"][i], offset=cols["offset"][i],
        kafka_timestamp=cols["timestamp"][i], raw_key=cols["raw_key"][i], raw_value=cols["raw_value"][i],
        stage=stage, reason=reason, batch_id=batch_id, run_id=run_id, quarantined_at=datetime.now(UTC),
    )
