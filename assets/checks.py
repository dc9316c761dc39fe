"""Per-table health checks that read the audit trail and the offsets, runnable at any time.

* ``audit_balance``: every audit row of the table satisfies ``received = applied + superseded +
  stale + quarantined + skipped`` (docs/architecture.md#nothing-is-lost-silently); ERROR severity.
* ``lag``: remaining lag and freshness. A table is healthy when at most ``max_lag_records``
  records are pending, or when it has committed a batch within ``max_staleness`` (it is catching
  up). Otherwise it is stale: WARN severity, since new data arriving is not a fault by itself.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from assets.constants import BALANCE_CHECK, DEFAULT_NAMES, LAG_CHECK, Names
from assets.resources import IngestPipeline
from ingest.config import TableSpec
from ingest.records import audit
from ingest.records.audit import AuditRecord
from ingest.secrets import redact


@dataclass(frozen=True, slots=True)
class LagThresholds:
    """When the ``lag`` check calls a table stale.

    Args:
        max_lag_records: pending records tolerated without further question.
        max_staleness: with more pending records than that, the newest commit must be this recent.
    """

    max_lag_records: int = 0
    max_staleness: timedelta = timedelta(hours=1)


#: One record of lag is already lag; a table catching up must have committed within the hour.
DEFAULT_THRESHOLDS = LagThresholds()


def build_table_checks(spec: TableSpec, thresholds: LagThresholds = DEFAULT_THRESHOLDS,
                       names: Names = DEFAULT_NAMES) -> dg.AssetChecksDefinition:
    """The ``audit_balance`` and ``lag`` checks of one table, in one op."""
    key = names.table_key(spec.name)
    specs = [
        dg.AssetCheckSpec(BALANCE_CHECK, asset=key,
                          description="every batch in the audit trail balances: received = inserted + updated + "
                          "deleted + truncates + superseded + stale + quarantined + skipped"),
        dg.AssetCheckSpec(LAG_CHECK, asset=key,
                          description=f"at most {thresholds.max_lag_records} records pending, or a commit within "
                          f"{thresholds.max_staleness} while catching up"),
    ]

    @dg.multi_asset_check(name=names.op(f"{spec.name}_health_checks"), specs=specs, can_subset=True,
                          required_resource_keys={names.resource})
    def _checks(context: dg.AssetCheckExecutionContext) -> Iterator[dg.AssetCheckResult]:
        ingest_pipeline: IngestPipeline = getattr(context.resources, names.resource)
        selected = {k.name for k in context.selected_asset_check_keys}
        if BALANCE_CHECK in selected:
            yield balance_check_result(spec, ingest_pipeline, key)
        if LAG_CHECK in selected:
            yield lag_check_result(spec, ingest_pipeline, thresholds, key=key)

    return _checks


def balance_check_result(spec: TableSpec, engine: IngestPipeline,
                         key: dg.AssetKey | None = None) -> dg.AssetCheckResult:
    """``audit_balance`` over every audit row of the table (its asset ``key``: ``cdc/<table>`` by default)."""
    key = key or DEFAULT_NAMES.table_key(spec.name)
    rows = audit.read(engine.paths(spec.name).audit, table=spec.name).to_pylist()
    records = [AuditRecord.from_metadata(r) for r in rows]
    unbalanced = [r for r in records if not r.balanced]
    metadata: dict[str, Any] = {
        "batches": len(records),
        "received": sum(r.received for r in records),
        "applied": sum(r.applied for r in records),
        "superseded": sum(r.superseded for r in records),
        "stale": sum(r.stale for r in records),
        "quarantined": sum(r.quarantined for r in records),
        "skipped": sum(r.skipped for r in records),
        "unbalanced_batches": dg.MetadataValue.json(
            [{"run_id": r.run_id, "batch_id": r.batch_id, "delta_version": r.delta_version} for r in unbalanced[:20]]
        ),
    }
    if unbalanced:
        return dg.AssetCheckResult(check_name=BALANCE_CHECK, asset_key=key, passed=False,
                                   metadata=metadata,
                                   description=f"{len(unbalanced)} of {len(records)} batches do not balance")
    return dg.AssetCheckResult(check_name=BALANCE_CHECK, asset_key=key, passed=True,
                               metadata=metadata, description=f"{len(records)} batches balance")


def lag_check_result(spec: TableSpec, engine: IngestPipeline, thresholds: LagThresholds,
                     *, now: datetime | None = None, key: dg.AssetKey | None = None) -> dg.AssetCheckResult:
    """``lag``: pending records and the age of the newest commit (asset ``key``: ``cdc/<table>`` by default)."""
    status = engine.status(spec.name)
    now = now or datetime.now(UTC)
    finished = (status.last_batch or {}).get("finished_at")
    age = (now - finished) if isinstance(finished, datetime) else None
    key = key or DEFAULT_NAMES.table_key(spec.name)
    if status.lag is None:
        # The source did not answer: the lag is unknown, and saying "0 pending" would hide an outage.
        return dg.AssetCheckResult(check_name=LAG_CHECK, asset_key=key, passed=False,
                                   severity=dg.AssetCheckSeverity.ERROR,
                                   metadata={"source_error": redact(status.source_error or "")},
                                   description=f"lag unknown: {redact(status.source_error or '')}")
    metadata: dict[str, Any] = {
        "lag": status.lag,
        "max_lag_records": thresholds.max_lag_records,
        "last_commit_age_seconds": round(age.total_seconds(), 1) if age is not None else -1,
        "max_staleness_seconds": thresholds.max_staleness.total_seconds(),
        "delta_version": status.delta_version if status.delta_version is not None else -1,
    }
    if status.lag <= thresholds.max_lag_records:
        return dg.AssetCheckResult(check_name=LAG_CHECK, asset_key=key, passed=True, metadata=metadata,
                                   description=f"caught up: {status.lag} records pending")
    if age is not None and age <= thresholds.max_staleness:
        return dg.AssetCheckResult(check_name=LAG_CHECK, asset_key=key, passed=True, metadata=metadata,
                                   description=f"catching up: {status.lag} pending, last commit {_ago(age)} ago")
    since = f"last commit {_ago(age)} ago" if age is not None else "nothing committed yet"
    return dg.AssetCheckResult(check_name=LAG_CHECK, asset_key=key, passed=False,
                               severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                               description=f"stale: {status.lag} records pending, {since}")


def _ago(age: timedelta) -> str:
    seconds = int(age.total_seconds())
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds}s"
