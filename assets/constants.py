"""Names the Dagster definitions share: groups, key prefixes, pools, tags and the resource key."""

from __future__ import annotations

from typing import Final

import dagster as dg

#: Asset group of the CDC target tables (one asset per configured table).
CDC_TABLES_GROUP: Final = "cdc_tables"
#: Asset group of the analytic assets that read the CDC tables.
ANALYTICS_GROUP: Final = "analytics"

#: Key prefix of the table assets: ``cdc/<table>``.
CDC_KEY_PREFIX: Final = "cdc"
#: Key prefix of the analytic assets: ``analytics/<name>``.
ANALYTICS_KEY_PREFIX: Final = "analytics"

#: Resource key under which the ingestion engine is bound.
ENGINE_RESOURCE_KEY: Final = "ingest_pipeline"

#: Run tag naming the table a sensor-requested run ingests.
TABLE_TAG: Final = "cdc/table"
#: Run tag on maintenance runs.
MAINTENANCE_TAG: Final = "cdc/maintenance"

#: Name of the asset check reporting a table's Great Expectations results.
QUALITY_CHECK: Final = "quality"
#: Name of the asset check verifying the audit balance of every batch.
BALANCE_CHECK: Final = "audit_balance"
#: Name of the asset check on remaining lag and freshness.
LAG_CHECK: Final = "lag"


def table_key(table: str) -> dg.AssetKey:
    """Asset key of a CDC target table."""
    return dg.AssetKey([CDC_KEY_PREFIX, table])


def table_pool(table: str) -> str:
    """Concurrency pool of a table: ingestion and maintenance of one table never overlap.

    The instance gives every pool one slot (``concurrency.pools.default_limit: 1`` in
    ``dagster.yaml``), so two runs that touch the same table wait for each other.
    """
    return f"cdc_table_{table}"


#: Pool of the maintenance of the shared audit and quarantine tables.
SHARED_TABLES_POOL: Final = "cdc_shared_tables"
