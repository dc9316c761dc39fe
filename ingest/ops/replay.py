"""Re-apply quarantined messages after a fix (``ingest quarantine replay``).

The held messages' raw bytes are decoded again with the table's decoder (so a registry or decoder
fix takes effect), split, reduced and -- unless bypassed -- validated again with the table's
current suite, then applied through the stream's own path (:func:`ingest.apply.pipeline.process_batch`):

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

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa

from ingest.apply.journey import apply_parts
from ingest.commit.writers import Writers
from ingest.config import IngestConfig
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.lake.layout import TablePaths
from ingest.quality import QualityGate, QualityReport
from ingest.records import quarantine
from ingest.records.audit import AuditRecord

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
    # Decode again from the raw bytes, exactly as the stream's decode step does, and apply through
    # the stream's own path.
    kafka = pa.table({
        "topic": pa.array([r["topic"] for r in picked], pa.string()),
        "partition": pa.array([r["partition"] for r in picked], pa.int32()),
        "offset": pa.array([r["offset"] for r in picked], pa.int64()),
        "timestamp": pa.array([r["kafka_timestamp"] for r in picked], pa.timestamp("us", tz="UTC")),
        "key": pa.array([r["raw_key"] for r in picked], pa.binary()),
        "value": pa.array([r["raw_value"] for r in picked], pa.binary()),
    })
    parts = BatchDecoder(DecoderSpec.for_table(config, spec)).decode(kafka)
    gate = QualityGate.at_start(config, spec) if recheck and spec.expectations else None
    replay_spec = spec if gate is not None else spec.model_copy(update={"expectations": None})
    # The stream's own journey, on the driver: the held messages sit below the table's offsets, so a
    # replay assembles them as if nothing were applied, and records no offsets.
    result = apply_parts(replay_spec, paths, parts, writer=Writers(config).for_table(spec), batch_id=REPLAY_BATCH,
                         run_id=run_id, gate=gate, replay=True)
    report.quality = result.quality or QualityReport()
    report.record = result.record
    stage_of = {(r["topic"], r["partition"], r["offset"]): r["stage"] for r in picked}
    held = {(h.topic, h.partition, h.offset) for h in result.held}
    report.still_held = [((h.topic, h.partition, h.offset, stage_of[(h.topic, h.partition, h.offset)]), h.reason)
                         for h in result.held]
    done = [(r["topic"], r["partition"], r["offset"], r["stage"]) for r in picked
            if (r["topic"], r["partition"], r["offset"]) not in held]
    version = result.record.delta_version if result.record is not None else None
    report.replayed = quarantine.mark_replayed(paths.quarantine, table, done, at=datetime.now(UTC), version=version)
    return report
