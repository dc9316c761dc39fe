"""Analytic assets that consume the CDC tables: lineage and a real reader in the UI.

``analytics/daily_revenue_by_segment``: revenue, orders and units per order day and customer
segment, from the live rows of ``orders`` and ``customers`` (cancelled orders excluded). It is read
with delta-rs's DataFusion engine (polars where a table has deletion vectors) and written back as a
Delta table under the tables root. When its tables are in a transaction group
(``source.transactions``), it reads them at the latest cut: one source transaction in all of them.
"""

from typing import Final

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from assets.constants import ANALYTICS_GROUP, ANALYTICS_KEY_PREFIX, DEFAULT_NAMES, Names, table_key
from assets.resources import IngestPipeline
from ingest.columns import normalize
from ingest.config import IngestConfig
from ingest.lake.delta import open_table, query_tables, write_table
from ingest.read.consistent import ConsistencyError, pinned

DAILY_REVENUE: Final = "daily_revenue_by_segment"
#: The tables the analytic asset reads; it exists only when both are configured.
_SOURCES: Final = ("orders", "customers")

_LIVE_CUSTOMERS: Final = "(SELECT * FROM customers WHERE NOT coalesce(_cdc_deleted, false))"

#: The demo's orders carry their own quantity and amount.
DAILY_REVENUE_SQL: Final = f"""
SELECT CAST(o.ordered_at AS DATE)            AS order_date,
       coalesce(c.segment, 'unknown')        AS segment,
       count(*)                              AS orders,
       sum(CAST(o.quantity AS BIGINT))       AS units,
       sum(o.amount)                         AS revenue
FROM orders o
LEFT JOIN {_LIVE_CUSTOMERS} c ON o.customer_id = c.id
WHERE NOT coalesce(o._cdc_deleted, false) AND o.status <> 'cancelled'
GROUP BY 1, 2
ORDER BY 1, 2
"""

#: A normalised schema (the stack's ``shop``): the order's total, units from its live lines.
DAILY_REVENUE_WITH_ITEMS_SQL: Final = f"""
SELECT CAST(o.ordered_at AS DATE)            AS order_date,
       coalesce(c.segment, 'unknown')        AS segment,
       count(*)                              AS orders,
       sum(coalesce(i.units, 0))             AS units,
       sum(o.total)                          AS revenue
FROM orders o
LEFT JOIN {_LIVE_CUSTOMERS} c ON o.customer_id = c.id
LEFT JOIN (SELECT order_id, sum(CAST(quantity AS BIGINT)) AS units FROM order_items
           WHERE NOT coalesce(_cdc_deleted, false) GROUP BY order_id) i ON o.id = i.order_id
WHERE NOT coalesce(o._cdc_deleted, false) AND o.status <> 'cancelled'
GROUP BY 1, 2
ORDER BY 1, 2
"""


def daily_revenue(config: IngestConfig) -> pa.Table:
    """Daily revenue per customer segment from the live rows of the Delta tables.

    Orders with ``quantity`` and ``amount`` (the demo) are summed as they are; orders with a
    ``total`` and an ``order_items`` table with ``quantity`` (a normalised schema) take units from
    their live lines.
    """
    tables: dict[str, DeltaTable] = {}
    configured = {t.name for t in config.tables}
    names: list[str] = [n for n in (*_SOURCES, "order_items") if n in configured]
    try:
        cut = pinned(config, names)  # a transaction group: every table at one source transaction
    except ConsistencyError as exc:
        raise dg.Failure(str(exc)) from None
    for name in names:
        table = open_table(config.table_path(name))
        if table is not None and cut is not None:
            version = cut.versions.get(name)
            if version is None:
                table = None  # created after the cut
            else:
                table.load_as_version(version)
        if table is None and name in _SOURCES:
            raise dg.Failure(f"table {name} has no Delta table yet: materialize {table_key(name).to_user_string()}")
        if table is not None:
            tables[name] = table
    columns = {f.name for f in tables["orders"].schema().fields}
    items = tables.get("order_items")
    if {"quantity", "amount"} <= columns:
        sql = DAILY_REVENUE_SQL
    elif "total" in columns and items is not None and "quantity" in {f.name for f in items.schema().fields}:
        sql = DAILY_REVENUE_WITH_ITEMS_SQL
    else:
        raise dg.Failure("orders has neither quantity and amount, nor a total with order_items.quantity: "
                         f"its columns are {sorted(c for c in columns if not c.startswith('_cdc_'))}")
    return normalize(query_tables(tables, sql))


def build_analytics_assets(config: IngestConfig, names: Names = DEFAULT_NAMES) -> list[dg.AssetsDefinition]:
    """The analytic assets this configuration supports (none without ``orders`` and ``customers``)."""
    configured = {t.name for t in config.tables}
    if not set(_SOURCES) <= configured:
        return []

    @dg.asset(
        key=dg.AssetKey([ANALYTICS_KEY_PREFIX, DAILY_REVENUE]),
        deps=[names.table_key(name) for name in _SOURCES],
        required_resource_keys={names.resource},
        group_name=ANALYTICS_GROUP,
        kinds={"delta", "datafusion"},
        description="Revenue, orders and units per order day and customer segment (cancelled orders excluded), "
        "from the live rows of orders and customers; written as a Delta table.",
    )
    def daily_revenue_by_segment(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        ingest_pipeline: IngestPipeline = getattr(context.resources, names.resource)
        settings = ingest_pipeline.config()
        result = daily_revenue(settings)
        path = settings.tables_root / ANALYTICS_KEY_PREFIX / DAILY_REVENUE
        write_table(path, result, mode="overwrite", schema_mode="overwrite")
        revenue = pc.sum(result["revenue"]).as_py() if result.num_rows else 0
        context.log.info(f"{result.num_rows} day/segment rows, revenue {revenue}")
        by_segment = (result.group_by("segment").aggregate([("revenue", "sum")]).sort_by("segment").to_pylist()
                      if result.num_rows else [])
        preview = "\n".join(["| segment | revenue |", "|---|---:|"]
                            + [f"| {r['segment']} | {r['revenue_sum']} |" for r in by_segment])
        return dg.MaterializeResult(metadata={
            "dagster/row_count": result.num_rows,
            "dagster/column_schema": dg.TableSchema(
                columns=[dg.TableColumn(f.name, str(f.type)) for f in result.schema]),
            "days": len(set(result["order_date"].to_pylist())),
            "total_revenue": float(revenue or 0),
            "revenue_by_segment": dg.MetadataValue.md(preview),
            "table_path": dg.MetadataValue.path(str(path)),
            "delta_version": open_table(path).version(),  # type: ignore[union-attr]
        })

    return [daily_revenue_by_segment]
