"""Table maintenance, as the Dagster job runs it: the engine lives in the runtime, :mod:`ingest.ops.maintain`.

``ingest maintain`` runs the same code without Dagster; this module keeps the names the job, the
tests and the benchmarks import from here.
"""

from ingest.lake.delta import MAINTENANCE_KEY
from ingest.ops.maintain import (
    MaintenanceOptions,
    TableMaintenance,
    log_retention,
    maintain,
    maintain_cdc_table,
    maintain_shared_table,
)

__all__ = ["MAINTENANCE_KEY", "MaintenanceOptions", "TableMaintenance", "log_retention", "maintain",
           "maintain_cdc_table", "maintain_shared_table"]
