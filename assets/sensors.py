"""One sensor per table: request a materialization when the topic has offsets not yet applied.

The cursor holds the end offsets (per partition) up to which a run was last requested, so it
follows the topic. A tick requests a run only when the topic has records the table has not
applied *and* that arrived after the last request; the run key is the table and those end
offsets, so the same range is never requested twice. While a run that materializes the table is
queued or running the sensor waits (and keeps its cursor), and the table's concurrency pool keeps
any other run of the same table from starting meanwhile. A run that fails is retried when new
records arrive, or by hand.
"""

import json

import dagster as dg

from assets.constants import TABLE_TAG, table_key
from assets.resources import IngestEngine
from ingest.config import TableSpec
from ingest.ops.status import TableStatus

#: Default seconds between two evaluations of a table's sensor.
DEFAULT_INTERVAL_SECONDS = 30
_IN_FLIGHT = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


def build_offsets_sensor(spec: TableSpec, *, minimum_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
                         default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
                         ) -> dg.SensorDefinition:
    """The sensor that materializes ``spec``'s asset when its topic has new, unapplied offsets."""
    key = table_key(spec.name)

    @dg.sensor(
        name=f"{spec.name}_offsets_sensor",
        target=[key],
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Materializes {key.to_user_string()} when topic {spec.topic} has offsets the table has not "
        "applied; the cursor follows the topic's end offsets.",
    )
    def _sensor(context: dg.SensorEvaluationContext, ingest_engine: IngestEngine) -> dg.SensorResult | dg.SkipReason:
        status = ingest_engine.status(spec.name)
        if status.source_error is not None:
            return dg.SkipReason(f"{spec.name}: {status.source_error}")
        pending = pending_partitions(status)
        if not pending:
            return dg.SkipReason(f"{spec.name}: caught up with {spec.topic}")
        requested = _cursor(context.cursor)
        end = {str(p): e for p, e in sorted(status.end.items())}
        if all(end.get(p, 0) <= requested.get(p, 0) for p in end):
            return dg.SkipReason(f"{spec.name}: a run was already requested for offsets up to {requested}")
        in_flight = runs_in_flight(context.instance, key)
        if in_flight:
            return dg.SkipReason(f"{spec.name}: run {in_flight[0]} is in flight; waiting for it")
        run_key = f"{spec.name}:" + ",".join(f"{p}={e}" for p, e in end.items())
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=run_key, asset_selection=[key], tags={TABLE_TAG: spec.name})],
            cursor=json.dumps(end, sort_keys=True),
        )

    return _sensor


def pending_partitions(status: TableStatus) -> dict[int, int]:
    """Records not yet applied, per partition that has any."""
    out = {}
    for partition, end in status.end.items():
        applied = status.applied.get(partition)
        waiting = end - ((applied if applied is not None else -1) + 1)
        if waiting > 0:
            out[partition] = waiting
    return out


def runs_in_flight(instance: dg.DagsterInstance, key: dg.AssetKey) -> list[str]:
    """Ids of queued or running runs that materialize ``key``."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=list(_IN_FLIGHT)), limit=100)
    return [r.run_id for r in runs
            if (r.asset_selection is not None and key in r.asset_selection) or r.tags.get(TABLE_TAG) == key.path[-1]]


def _cursor(raw: str | None) -> dict[str, int]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}
