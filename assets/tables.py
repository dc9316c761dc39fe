"""One asset per configured table: materializing it drains the table's available changes.

The asset calls the engine through the :class:`~assets.resources.IngestPipeline` resource and turns
its audit records into materialization metadata (counts, offsets, lag, Delta version, rows, schema,
batch durations, path) and into the ``quality`` check: the table's Great Expectations results,
blocking when the table's quality policy is ``fail``.
"""

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg

from assets.constants import DEFAULT_NAMES, QUALITY_CHECK, Names
from assets.resources import IngestPipeline
from ingest.columns import FRAMEWORK_NAMES
from ingest.config import TableSpec
from ingest.lake.delta import open_table, table_schema
from ingest.ops.status import TableStatus
from ingest.secrets import redact
from ingest.stream.report import TableRun

#: Counts summed over a run's batches and reported as metadata.
COUNTS = ("received", "inserted", "updated", "deleted", "truncates", "superseded", "stale", "quarantined", "skipped")
#: Quality statuses that mean expectations failed (``failed``: the batch was stopped).
_UNHEALTHY = ("warned", "quarantined", "failed")
_GATE_ERROR = "QualityGateError"


def build_table_asset(spec: TableSpec, names: Names = DEFAULT_NAMES) -> dg.AssetsDefinition:
    """The asset of one configured table (with its ``quality`` check)."""
    quality = dg.AssetCheckSpec(
        QUALITY_CHECK,
        asset=names.table_key(spec.name),
        blocking=spec.quality_policy == "fail",
        description=f"Great Expectations suite {spec.expectations or '(none)'} on every micro-batch; "
        f"policy {spec.quality_policy}" + (" (blocks downstream assets)" if spec.quality_policy == "fail" else ""),
    )

    @dg.asset(
        key=names.table_key(spec.name),
        group_name=names.group,
        pool=names.pool(spec.name),
        required_resource_keys={names.resource},
        kinds={"spark", "delta"},
        check_specs=[quality],
        description=f"Delta table `{spec.name}` kept equal to the source through the Debezium topic "
        f"`{spec.topic}` (delete mode {spec.delete_mode}, quality policy {spec.quality_policy}). "
        "Materializing drains the changes available now (availableNow).",
        metadata={
            "topic": spec.topic,
            "primary_key": ", ".join(spec.primary_key) if spec.primary_key else "from the Kafka key",
            "delete_mode": spec.delete_mode,
            "quality_policy": spec.quality_policy,
        },
    )
    def _table(context: dg.AssetExecutionContext) -> Iterator[dg.MaterializeResult]:
        ingest_pipeline: IngestPipeline = getattr(context.resources, names.resource)
        before = ingest_pipeline.status(spec.name)
        run = ingest_pipeline.drain(spec.name)
        after = ingest_pipeline.status(spec.name)
        for record in run.batches:
            context.log.info(
                f"batch {record.batch_id}: received {record.received}, inserted {record.inserted}, updated "
                f"{record.updated}, deleted {record.deleted}, quarantined {record.quarantined} "
                f"-> Delta version {record.delta_version} ({record.total_ms} ms)"
            )
        yield dg.MaterializeResult(
            metadata=materialization_metadata(spec, run, before, after, ingest_pipeline.paths(spec.name).table),
            check_results=[quality_check_result(spec, run)],
            data_version=dg.DataVersion(str(after.delta_version)) if after.delta_version is not None else None,
        )
        if run.error and not is_quality_gate(run):
            # A quality gate is reported by its blocking check; any other error fails the step.
            raise dg.Failure(description=f"table {spec.name}: {run.error}", metadata={"error": run.error})

    return _table


def is_quality_gate(run: TableRun) -> bool:
    """Whether the run stopped because expectations failed under policy ``fail``."""
    return bool(run.error and _GATE_ERROR in run.error) or any(
        getattr(b, "quality_status", "") == "failed" for b in run.batches
    )


def materialization_metadata(spec: TableSpec, run: TableRun, before: TableStatus, after: TableStatus,
                             path: Any) -> dict[str, Any]:
    """Materialization metadata of one drain: what changed, where the offsets stand, what the table is."""
    meta: dict[str, Any] = {name: run.total(name) for name in COUNTS}
    meta["batches"] = len(run.batches)
    meta["already_applied"] = run.already_applied
    meta["offsets_before"] = dg.MetadataValue.json(_offsets(before))
    meta["offsets_after"] = dg.MetadataValue.json(_offsets(after))
    if after.lag is not None:
        meta["lag"] = after.lag
    else:
        meta["lag_unknown"] = redact(after.source_error or "")
    meta["delta_version"] = after.delta_version if after.delta_version is not None else -1
    meta["dagster/row_count"] = after.rows
    meta["table_path"] = dg.MetadataValue.path(str(path))
    schema = column_schema(path)
    if schema is not None:
        meta["dagster/column_schema"] = schema
    durations = [{"batch_id": b.batch_id, "total_ms": b.total_ms, "decode_ms": b.decode_ms, "apply_ms": b.apply_ms,
                  "delta_version": b.delta_version} for b in run.batches]
    meta["batch_durations"] = dg.MetadataValue.json(durations)
    meta["max_batch_ms"] = max((b.total_ms for b in run.batches), default=0)
    if run.error:
        meta["error"] = dg.MetadataValue.text(run.error)
    return meta


def _offsets(status: TableStatus) -> dict[str, Any]:
    """Last applied and end offset per partition (``applied`` null: nothing applied yet)."""
    partitions = {str(p): {"applied": status.applied.get(p), "end": end} for p, end in sorted(status.end.items())}
    return {"topic": status.topic, "partitions": partitions}


def column_schema(path: Any) -> dg.TableSchema | None:
    """The Delta table's columns (framework columns described as such)."""
    table = open_table(path)
    if table is None:
        return None
    return dg.TableSchema(columns=[
        dg.TableColumn(f.name, str(f.type), description="framework column" if f.name in FRAMEWORK_NAMES else None)
        for f in table_schema(table)
    ])


def quality_check_result(spec: TableSpec, run: TableRun) -> dg.AssetCheckResult:
    """The ``quality`` check of one drain, from the batches' expectation results.

    Fails with ERROR severity when a batch was stopped by the ``fail`` policy (the check is then
    blocking), with WARN severity when expectations failed under ``warn`` or ``quarantine``.
    """
    batches: Sequence[Any] = run.batches
    evaluated = sum(getattr(b, "expectations_evaluated", 0) or 0 for b in batches)
    failed = sum(getattr(b, "expectations_failed", 0) or 0 for b in batches)
    statuses = Counter(getattr(b, "quality_status", "skipped") or "skipped" for b in batches)
    failures: Counter[str] = Counter()
    for b in batches:
        raw = getattr(b, "quality_failures", "") or ""
        try:
            failures.update({str(k): int(v) for k, v in (json.loads(raw) if raw else {}).items()})
        except (ValueError, TypeError, AttributeError):
            failures["(unreadable quality_failures)"] += 1
    metadata: dict[str, Any] = {
        "suite": spec.expectations or "(none)",
        "policy": spec.quality_policy,
        "batches": len(batches),
        "expectations_evaluated": evaluated,
        "expectations_failed": failed,
        "statuses": dg.MetadataValue.json(dict(statuses)),
        "unexpected_by_expectation": dg.MetadataValue.json(dict(failures)),
    }
    if is_quality_gate(run):
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata,
                                   description=f"quality gate stopped the table: {run.error or 'batch failed'}")
    unhealthy = sum(statuses[s] for s in _UNHEALTHY)
    if failed or unhealthy:
        return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN, metadata=metadata,
                                   description=f"{failed} expectation failures in {unhealthy} of {len(batches)} "
                                   f"batches (policy {spec.quality_policy})")
    description = ("no suite configured" if not spec.expectations
                   else "no new batches" if not batches else f"{evaluated} expectations passed")
    return dg.AssetCheckResult(passed=True, metadata=metadata, description=description)
