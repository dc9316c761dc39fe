"""Re-apply quarantined messages after a fix (``ingest quarantine replay``).

The held messages' raw bytes are decoded again with the table's decoder (so a registry or decoder
fix takes effect), split, reduced and -- unless bypassed -- validated again with the table's
current suite, then applied through the stream's own path (:func:`ingest.merge.apply_batch`):

* **Ordering holds.** The MERGE is guarded by position and by the tombstones of deleted keys, so
  a quarantined change older than what the table holds is *stale* and never overwrites newer
  data, and a deleted key is not brought back.
* **Progress does not move.** The commit records no app transactions (``offsets={}``): the
  table's stream offsets stay where the stream put them.
* **Idempotent.** Replayed rows are stamped (``replayed_at``, ``replay_version``) and a second
  replay skips them; even replaying them again on purpose changes nothing, since an equal
  position is stale.

A row that fails again (still undecodable, or still failing the suite) stays held, unstamped,
with its original reason. Under policy ``fail`` a re-check that fails raises
:class:`~ingest.errors.QualityGateError` and nothing is applied.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa

from ingest import audit, quarantine
from ingest.audit import AuditRecord
from ingest.batch import (
    DecodeStep,
    TablePaths,
    check_quality,
    decode_batch,
    fill_outcome,
    fill_quality,
    split_batch,
)
from ingest.config import IngestConfig
from ingest.merge import MergeRequest, apply_batch
from ingest.quality import QualityGate, QualityReport
from ingest.reduce import reduce_changes
from ingest.tablestate import load_state

#: ``batch_id`` of replay commits in the audit table (stream batches are >= 0).
REPLAY_BATCH = -1
MessageId = tuple[str, int, int, str]  # topic, partition, offset, stage


@dataclass(slots=True)
class ReplayReport:
    """What a replay did.

    Attributes:
        table: the table.
        selected: quarantined rows picked for the replay.
        replayed: rows stamped as replayed (applied, stale or superseded: in any case done).
        still_held: rows that failed again, with the new reason; they stay pending.
        record: audit record of the replay commit (``None``: nothing was committed).
        quality: the re-check's report (status ``skipped`` when bypassed).
    """

    table: str
    selected: int = 0
    replayed: int = 0
    still_held: list[tuple[MessageId, str]] = field(default_factory=list)
    record: AuditRecord | None = None
    quality: QualityReport | None = None


def replay_quarantine(config: IngestConfig, table: str, *, stage: str | None = None, batch_id: int | None = None,
                      ids: Iterable[tuple[str, int, int]] | None = None, recheck: bool = True) -> ReplayReport:
    """Re-apply the table's pending quarantined messages (see module docstring).

    Args:
        config: the configuration.
        table: the table whose quarantined messages to replay.
        stage: only messages held at this stage (``decode``, ``key``, ``quality``).
        batch_id: only messages held by this stream batch.
        ids: only these ``(topic, partition, offset)``.
        recheck: validate again with the table's suite (default); ``False`` applies without it.

    Raises:
        SuiteError: the suite cannot be loaded (re-check only).
        QualityGateError: the re-check failed under policy ``fail``; nothing was applied.
    """
    spec = config.table(table)
    paths = TablePaths.of(config, table)
    run_id = f"replay_{uuid.uuid4().hex[:8]}"
    report = ReplayReport(table)
    rows = quarantine.read(paths.quarantine, table=table, stage=stage, pending=True)
    wanted = set(ids) if ids is not None else None
    picked = [r for r in rows.to_pylist()
              if (batch_id is None or r["batch_id"] == batch_id)
              and (wanted is None or (r["topic"], r["partition"], r["offset"]) in wanted)]
    report.selected = len(picked)
    if not picked:
        return report
    started_at, t0 = datetime.now(UTC), time.perf_counter()

    # Decode again from the raw bytes, exactly as the stream's decode step does.
    kafka = pa.table({
        "topic": pa.array([r["topic"] for r in picked], pa.string()),
        "partition": pa.array([r["partition"] for r in picked], pa.int32()),
        "offset": pa.array([r["offset"] for r in picked], pa.int64()),
        "timestamp": pa.array([r["kafka_timestamp"] for r in picked], pa.timestamp("us", tz="UTC")),
        "key": pa.array([r["raw_key"] for r in picked], pa.binary()),
        "value": pa.array([r["raw_value"] for r in picked], pa.binary()),
    })
    cols = pa.Table.from_batches([decode_batch(DecodeStep.for_table(config, spec).decoder(), kafka)]).to_pydict()
    state = load_state(paths.table)
    split = split_batch(spec, cols, list(range(len(picked))), state.key_columns or spec.primary_key,
                        batch_id=REPLAY_BATCH, run_id=run_id)
    table_key = tuple(split.table_key or ())
    reduction = reduce_changes(split.changes, table_key)
    record = AuditRecord(table=table, run_id=run_id, batch_id=REPLAY_BATCH, received=len(picked),
                         started_at=started_at, status="replayed")
    if recheck and spec.expectations:
        report.quality = check_quality(spec, QualityGate.for_table(config, spec), reduction, split, cols,
                                       state.columns, batch_id=REPLAY_BATCH, run_id=run_id)
    else:
        report.quality = QualityReport()
    fill_quality(record, report.quality)
    record.skipped = sum(split.controls.values())
    record.quarantined = len(split.held)
    record.superseded = reduction.superseded
    held = {(h.topic, h.partition, h.offset) for h in split.held}
    stage_of = {(r["topic"], r["partition"], r["offset"]): r["stage"] for r in picked}
    report.still_held = [((h.topic, h.partition, h.offset, stage_of[(h.topic, h.partition, h.offset)]), h.reason)
                         for h in split.held]

    version = None
    if reduction.winners or reduction.truncate is not None:
        outcome = apply_batch(MergeRequest(
            table=table, path=paths.table, tombstones_path=paths.tombstones, delete_mode=spec.delete_mode,
            key_columns=table_key, reduction=reduction, offsets={},
            describe=lambda outcome: fill_outcome(record, outcome).to_metadata(),
        ))
        fill_outcome(record, outcome)
        record.rows_truncated = outcome.rows_truncated
        record.delta_version = version = outcome.delta_version
        record.apply_ms = outcome.merge_ms
        report.record = record
    done = [(r["topic"], r["partition"], r["offset"], r["stage"]) for r in picked
            if (r["topic"], r["partition"], r["offset"]) not in held]
    report.replayed = quarantine.mark_replayed(paths.quarantine, table, done, at=datetime.now(UTC), version=version)
    record.total_ms = int((time.perf_counter() - t0) * 1000)
    record.finished_at = datetime.now(UTC)
    if report.record is not None:
        audit.append(paths.audit, [record])
    return report
