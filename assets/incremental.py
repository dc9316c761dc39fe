"""An analytic asset kept up to date from a table's change data feed, not recomputed.

When ``orders`` is in a transaction group (``source.transactions``), the aggregate is brought up to
the latest cut's version of ``orders``, not beyond it.

``analytics/orders_by_status``: live orders and their amount per status (the ``amount`` column, or
``total`` where orders have that instead; without either, the amount is null). Each materialization
reads only the changes of ``orders`` committed since the version it last consumed (its cursor) and
folds them into the stored aggregate: an insert or an update's post-image adds its row, a delete or
an update's pre-image takes it away; a row flagged ``_cdc_deleted`` (soft-delete mode) counts as
gone. The cursor is stored in the aggregate's own Delta commit (``cdc.feed_cursor``), so the
aggregate and the position it is exact at are written together: a run that dies before its commit
is simply done again.

The first run, and any run whose changes the feed no longer holds (a table created before the feed
was on, or vacuumed past the cursor), computes the aggregate from the table's rows at one version
and continues from there.
"""


import json
from collections.abc import Iterable
from typing import Any, Final

import dagster as dg
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable

from assets.constants import ANALYTICS_GROUP, ANALYTICS_KEY_PREFIX, DEFAULT_NAMES, Names, table_key
from assets.resources import IngestPipeline
from ingest.config import IngestConfig
from ingest.lake.delta import open_table, read_all, write_table
from ingest.read.changes import ChangeFeedError, ChangeRange, changes
from ingest.read.consistent import ConsistencyError, pinned

ORDERS_BY_STATUS: Final = "orders_by_status"
CURSOR_KEY: Final = "cdc.feed_cursor"
_SOURCE: Final = "orders"
_ADDS: Final = frozenset({"insert", "update_postimage"})
_REMOVES: Final = frozenset({"delete", "update_preimage"})

#: status -> (orders, amount); amounts keep the source's kind (Decimal for a decimal column)
Aggregate = dict[str, tuple[int, Any]]


def fold(aggregate: Aggregate, rows: Iterable[dict[str, Any]]) -> Aggregate:
    """``aggregate`` moved on by change-feed rows (``_change_type``, ``status``, ``amount``)."""
    out = dict(aggregate)
    for row in rows:
        kind = row["_change_type"]
        if kind not in _ADDS and kind not in _REMOVES:
            raise ValueError(f"unknown change type {kind!r}")
        if row.get("_cdc_deleted"):
            continue  # a soft-deleted row is not a live order, before or after
        sign = 1 if kind in _ADDS else -1
        status = row["status"] or "unknown"
        count, amount = out.get(status, (0, 0))
        out[status] = (count + sign, amount + sign * (row["amount"] or 0))
    return {status: value for status, value in out.items() if value[0] != 0}


def measure_of(table: DeltaTable) -> str | None:
    """The orders column summed as the amount: ``amount``, else ``total``, else none."""
    names = set(pa.schema(table.schema().to_arrow()).names)
    return next((name for name in ("amount", "total") if name in names), None)


def _with_amount(rows: pa.Table, measure: str | None) -> pa.Table:
    """``rows`` with the measure as ``amount`` (null when orders have none)."""
    if measure is None:
        return rows.append_column("amount", pa.nulls(rows.num_rows, pa.int64()))
    return rows.rename_columns(["amount" if c == measure else c for c in rows.column_names])


def recompute(table: DeltaTable) -> Aggregate:
    """The aggregate from the table's live rows at its loaded version."""
    measure = measure_of(table)
    rows = read_all(table, columns=["status", *([measure] if measure else [])],
                    where="NOT coalesce(_cdc_deleted, false)")
    return fold({}, ({**r, "_change_type": "insert"} for r in _with_amount(rows, measure).to_pylist()))


def as_table(aggregate: Aggregate, amount_type: pa.DataType, measured: bool = True) -> pa.Table:
    statuses = sorted(aggregate)
    return pa.table({
        "status": pa.array(statuses, pa.string()),
        "orders": pa.array([aggregate[s][0] for s in statuses], pa.int64()),
        "amount": pa.array([aggregate[s][1] for s in statuses], amount_type) if measured
        else pa.nulls(len(statuses), amount_type),
    })


def stored(path: Any) -> tuple[Aggregate, int | None]:
    """The stored aggregate and the source version it is exact at (``None``: nothing stored)."""
    table = open_table(path)
    if table is None:
        return {}, None
    cursor = next((json.loads(c[CURSOR_KEY]) for c in table.history() if CURSOR_KEY in c), None)
    if cursor is None:
        return {}, None
    rows = read_all(table).to_pylist()
    return {r["status"]: (r["orders"], r["amount"] if r["amount"] is not None else 0) for r in rows}, int(
        cursor["version"])


def refresh(config: IngestConfig, log: Any = None) -> dict[str, Any]:
    """Bring the aggregate up to the source's latest version; what it did, for the asset's metadata."""
    source = open_table(config.table_path(_SOURCE))
    if source is None:
        raise dg.Failure(f"table {_SOURCE} has no Delta table yet: materialize {table_key(_SOURCE).to_user_string()}")
    if "status" not in pa.schema(source.schema().to_arrow()).names:
        raise dg.Failure(f"{_SOURCE} has no status column to group by")
    latest = source.version()
    try:
        cut = pinned(config, [_SOURCE])  # in a transaction group: up to the latest cut's version only
    except ConsistencyError as exc:
        raise dg.Failure(str(exc)) from None
    if cut is not None:
        at_cut = cut.versions.get(_SOURCE)
        if at_cut is None:
            raise dg.Failure(f"{_SOURCE} has no commit at cut #{cut.cut} yet")
        latest = at_cut
    path = config.tables_root / ANALYTICS_KEY_PREFIX / ORDERS_BY_STATUS
    aggregate, cursor = stored(path)
    mode, consumed = "incremental", 0
    if cursor is not None and cursor > latest:
        cursor = None  # the source was rebuilt: start over
    if cursor is None:
        mode = "recomputed"
    elif cursor < latest:
        try:
            feed = changes(config, _SOURCE, ChangeRange(from_version=cursor + 1, to_version=latest))
        except ChangeFeedError as exc:
            if log is not None:
                log.warning(f"{_SOURCE}: the change feed cannot give versions {cursor + 1}..{latest} ({exc}); "
                            "recomputing")
            mode = "recomputed"
        else:
            consumed = feed.num_rows
            measure = measure_of(source)
            wanted = [c for c in ("_change_type", "status", measure, "_cdc_deleted") if c and c in feed.column_names]
            aggregate = fold(aggregate, _with_amount(feed.select(wanted), measure).to_pylist())
    if mode == "recomputed":
        source.load_as_version(latest)
        aggregate = recompute(source)
    amount_type = _sum_type(source)
    if mode == "recomputed" or cursor != latest:
        result = as_table(aggregate, amount_type, measure_of(source) is not None)
        write_table(path, result, mode="overwrite", schema_mode="overwrite",
                        commit_properties=CommitProperties(custom_metadata={
                            CURSOR_KEY: json.dumps({"table": _SOURCE, "version": latest})}))
    return {"mode": mode, "from_version": None if mode == "recomputed" else cursor, "to_version": latest,
            "changes_consumed": consumed, "statuses": len(aggregate),
            "orders": sum(v[0] for v in aggregate.values()), "table_path": str(path)}


def _sum_type(table: DeltaTable) -> pa.DataType:
    """A type that holds any sum of the source's measure: decimal(38, scale), bigint or double."""
    measure = measure_of(table)
    if measure is None:
        return pa.int64()
    kind = pa.schema(table.schema().to_arrow()).field(measure).type
    if isinstance(kind, pa.Decimal128Type | pa.Decimal256Type):
        return pa.decimal128(38, kind.scale)
    return pa.int64() if pa.types.is_integer(kind) else pa.float64()


def build_incremental_assets(config: IngestConfig, names: Names = DEFAULT_NAMES) -> list[dg.AssetsDefinition]:
    """The change-feed assets this configuration supports (none without ``orders``)."""
    if _SOURCE not in {t.name for t in config.tables}:
        return []

    @dg.asset(
        key=dg.AssetKey([ANALYTICS_KEY_PREFIX, ORDERS_BY_STATUS]),
        deps=[names.table_key(_SOURCE)],
        required_resource_keys={names.resource},
        group_name=ANALYTICS_GROUP,
        kinds={"delta"},
        description="Live orders and their amount per status, kept up to date from the orders table's change "
        "data feed since the version it last consumed (stored with the aggregate).",
    )
    def orders_by_status(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ingest_pipeline: IngestPipeline = getattr(context.resources, names.resource)
        done = refresh(ingest_pipeline.config(), context.log)
        context.log.info(f"{done['mode']}: {done['changes_consumed']} changes up to {_SOURCE} "
                         f"v{done['to_version']}, {done['orders']} live orders")
        return dg.MaterializeResult(metadata={
            **{k: v for k, v in done.items() if k != "table_path" and v is not None},
            "dagster/row_count": done["statuses"],
            "table_path": dg.MetadataValue.path(done["table_path"]),
        })

    return [orders_by_status]
