"""One sensor for every table: request a table's materialization when its topic has offsets not yet applied.

One sensor serves all the tables (a whole database can mean hundreds): each tick reads every
table's status with one configuration load and one source connection, and requests one run per
table that needs it. The cursor holds, per table, the end offsets (per partition) up to which a
run was last requested, so it follows the topics. A table gets a run only when its topic has
records the table has not applied *and* that arrived after its last request; the run key is the
table and those end offsets, so the same range is never requested twice. While a run that
materializes a table is queued or running the sensor waits for that table (and keeps its cursor),
and the table's concurrency pool keeps any other run of it from starting meanwhile. A run that
fails is retried when new records arrive, or by hand.
"""

import json

import dagster as dg

from assets.constants import DEFAULT_NAMES, TABLE_TAG, Names
from assets.resources import IngestPipeline
from ingest.config import TableSpec
from ingest.ops.status import TableStatus

#: Default seconds between two evaluations of the sensor.
DEFAULT_INTERVAL_SECONDS = 30
SENSOR_NAME = DEFAULT_NAMES.sensor
_IN_FLIGHT = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


def build_offsets_sensor(specs: list[TableSpec], *, minimum_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
                         default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
                         names: Names = DEFAULT_NAMES) -> dg.SensorDefinition:
    """The sensor that materializes each of ``specs``' assets when its topic has new, unapplied offsets."""
    keys = {spec.name: names.table_key(spec.name) for spec in specs}
    topics = {spec.name: spec.topic for spec in specs}

    @dg.sensor(
        name=names.sensor,
        required_resource_keys={names.resource},
        target=list(keys.values()),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=f"Materializes each of the {len(keys)} CDC tables whose topic has offsets the table has not "
        "applied; the cursor follows every topic's end offsets.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        ingest_pipeline: IngestPipeline = getattr(context.resources, names.resource)
        statuses = ingest_pipeline.statuses(list(keys))
        cursor = _cursor(context.cursor)
        requests, skipped = [], []
        in_flight = runs_in_flight(context.instance, list(keys.values()))
        for name, key in keys.items():
            status = statuses.get(name)
            if status is None:
                skipped.append(f"{name}: its topic {topics[name]} is no longer configured or discovered")
                continue
            why = _why_not(status, cursor.get(name, {}), in_flight.get(name))
            if why is not None:
                skipped.append(why)
                continue
            end = {str(p): e for p, e in sorted(status.end.items())}
            requests.append(dg.RunRequest(run_key=f"{name}:" + ",".join(f"{p}={e}" for p, e in end.items()),
                                          asset_selection=[key], tags={TABLE_TAG: name}))
            cursor[name] = end
        if not requests:
            return dg.SkipReason("; ".join(skipped) or "no tables")
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


def _why_not(status: TableStatus, requested: dict[str, int], in_flight: str | None) -> str | None:
    """Why the table needs no run now (``None``: it does)."""
    name = status.table
    if status.source_error is not None:
        return f"{name}: {status.source_error}"
    if not pending_partitions(status):
        return f"{name}: caught up with {status.topic}"
    end = {str(p): e for p, e in status.end.items()}
    if all(end.get(p, 0) <= requested.get(p, 0) for p in end):
        return f"{name}: a run was already requested for offsets up to {requested}"
    if in_flight is not None:
        return f"{name}: run {in_flight} is in flight; waiting for it"
    return None


def pending_partitions(status: TableStatus) -> dict[int, int]:
    """Records not yet applied, per partition that has any."""
    out = {}
    for partition, end in status.end.items():
        applied = status.applied.get(partition)
        waiting = end - ((applied if applied is not None else -1) + 1)
        if waiting > 0:
            out[partition] = waiting
    return out


def runs_in_flight(instance: dg.DagsterInstance, keys: list[dg.AssetKey]) -> dict[str, str]:
    """Table name -> id of a queued or running run that materializes it, for the tables of ``keys``."""
    wanted = {key: key.path[-1] for key in keys}
    out: dict[str, str] = {}
    for r in instance.get_runs(filters=dg.RunsFilter(statuses=list(_IN_FLIGHT)), limit=1000):
        tables = {wanted[k] for k in r.asset_selection or () if k in wanted}
        if r.tags.get(TABLE_TAG) in wanted.values():
            tables.add(r.tags[TABLE_TAG])
        for table in tables:
            out.setdefault(table, r.run_id)
    return out


def _cursor(raw: str | None) -> dict[str, dict[str, int]]:
    """Table -> partition -> end offset last requested (an unreadable cursor reads as empty)."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(t): {str(p): int(e) for p, e in ends.items()} for t, ends in data.items() if isinstance(ends, dict)}
