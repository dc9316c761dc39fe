"""Observe mode: a pipeline that runs as a service (``ingest run --continuous``), seen by Dagster.

With ``dagster.mode: observe`` the tables are external assets, which Dagster does not materialize
itself: the service applies the changes, and a sensor reads the audit table (delta-rs, no Spark)
and records each committed batch as a materialization of its table, with the batch's counts,
Delta version and offsets as metadata. The sensor's cursor holds, per table, the newest Delta
version it recorded, so each commit is recorded once. The ``audit_balance`` and ``lag`` checks
stay (they read the audit table and the source's end offsets, without Spark either).
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from assets.constants import DEFAULT_NAMES, Names
from assets.resources import IngestPipeline
from ingest.config import TableSpec
from ingest.records import audit

#: Default seconds between two reads of the audit table.
DEFAULT_OBSERVE_SECONDS = 30
#: The audit figures a recorded materialization carries.
FIGURES = ("received", "inserted", "updated", "deleted", "superseded", "stale", "quarantined", "skipped",
           "snapshot_reads", "suspect_reads", "total_ms", "apply_ms")


def build_observed_table(spec: TableSpec, names: Names = DEFAULT_NAMES) -> dg.AssetSpec:
    """A table that a service keeps: an external asset of the tables' group."""
    return dg.AssetSpec(
        key=names.table_key(spec.name), group_name=names.group, kinds={"delta"},
        description=f"Delta table `{spec.name}` kept equal to the source through the Debezium topic `{spec.topic}` "
        "by a running `ingest run --continuous`; its commits are recorded from the audit table.",
        metadata={"topic": spec.topic, "delete_mode": spec.delete_mode, "quality_policy": spec.quality_policy},
    )


def build_audit_sensor(specs: list[TableSpec], *, names: Names = DEFAULT_NAMES,
                       minimum_interval_seconds: int = DEFAULT_OBSERVE_SECONDS,
                       default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
                       ) -> dg.SensorDefinition:
    """The sensor that records each batch the service committed as a materialization of its table."""
    keys = {spec.name: names.table_key(spec.name) for spec in specs}

    @dg.sensor(name=names.audit_sensor,
               minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
               required_resource_keys={names.resource},
               description=f"Records the commits a running service made to its {len(keys)} tables, from the audit "
               "table, as materializations.")
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        engine: IngestPipeline = getattr(context.resources, names.resource)
        events, cursor = observed(engine, list(keys), json.loads(context.cursor or "{}"), keys)
        if not events:
            return dg.SkipReason("no commit since the last tick")
        return dg.SensorResult(asset_events=events, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


def observed(engine: IngestPipeline, tables: list[str], cursor: dict[str, int],
             keys: dict[str, dg.AssetKey]) -> tuple[list[dg.AssetMaterialization], dict[str, int]]:
    """The materializations of the commits newer than ``cursor`` (table -> Delta version), oldest
    first, and the cursor after them."""
    config = engine.config()
    rows = audit.read(config.tables_root / config.target.audit_table).to_pylist()
    events, after = [], dict(cursor)
    for row in sorted(rows, key=lambda r: (r["table"], r["delta_version"] if r["delta_version"] is not None else -1)):
        table, version = row["table"], row["delta_version"]
        if table not in keys or row["status"] != "committed" or version is None or version <= after.get(table, -1):
            continue
        after[table] = version
        metadata: dict[str, Any] = {k: row[k] for k in FIGURES if row.get(k) is not None}
        metadata.update(delta_version=version, run_id=row["run_id"], batch_id=row["batch_id"],
                        offsets=dg.MetadataValue.json(json.loads(row["offsets"] or "{}")))
        if row.get("finished_at") is not None:
            metadata["committed_at"] = dg.MetadataValue.timestamp(row["finished_at"])
        events.append(dg.AssetMaterialization(asset_key=keys[table], metadata=metadata,
                                              description=f"batch {row['batch_id']} of run {row['run_id']}"))
    return events, after
