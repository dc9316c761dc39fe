"""Names the Dagster definitions share: groups, key prefixes, pools, tags and the resource key."""

from __future__ import annotations

from dataclasses import dataclass
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
    """Asset key of a CDC target table (the default prefix's: :class:`Names` for another)."""
    return DEFAULT_NAMES.table_key(table)


def table_pool(table: str) -> str:
    """Concurrency pool of a table: ingestion and maintenance of one table never overlap.

    The instance gives every pool one slot (``concurrency.pools.default_limit: 1`` in
    ``dagster.yaml``), so two runs that touch the same table wait for each other.
    """
    return DEFAULT_NAMES.pool(table)



@dataclass(frozen=True)
class Names:
    """Every name one pipeline's definitions take, derived from its ``dagster.prefix``, so that two
    pipelines (two configurations) live in one ``Definitions``: asset keys ``<prefix>/<table>``, the
    group, pools, the ingest and maintenance jobs, the sensor, the schedule, the check ops and the
    resource key. The default prefix ``cdc`` gives the names the definitions always had."""

    prefix: str = CDC_KEY_PREFIX
    group: str = CDC_TABLES_GROUP

    @property
    def resource(self) -> str:
        """The key the pipeline's engine is bound under."""
        return ENGINE_RESOURCE_KEY if self.prefix == CDC_KEY_PREFIX else f"{self.prefix}_{ENGINE_RESOURCE_KEY}"

    def table_key(self, table: str) -> dg.AssetKey:
        return dg.AssetKey([self.prefix, table])

    def pool(self, table: str) -> str:
        """Concurrency pool of a table: ingestion and maintenance of one table never overlap (see
        :func:`table_pool`)."""
        return f"{self.prefix}_table_{table}"

    @property
    def shared_pool(self) -> str:
        """Pool of the maintenance of the shared audit and quarantine tables."""
        return f"{self.prefix}_shared_tables"

    @property
    def ingest_job(self) -> str:
        return f"{self.prefix}_ingest_all_tables"

    @property
    def sensor(self) -> str:
        return f"{self.prefix}_offsets_sensor"

    @property
    def audit_sensor(self) -> str:
        """The sensor of observe mode (:mod:`assets.observe`)."""
        return f"{self.prefix}_audit_sensor"

    @property
    def maintenance_job(self) -> str:
        return f"{self.prefix}_table_maintenance"

    @property
    def maintenance_schedule(self) -> str:
        return f"{self.prefix}_table_maintenance_daily"

    def op(self, name: str) -> str:
        """An op's name, unique across pipelines as a repository requires (the default prefix's as it was)."""
        return name if self.prefix == CDC_KEY_PREFIX else f"{self.prefix}_{name}"


DEFAULT_NAMES: Final = Names()
