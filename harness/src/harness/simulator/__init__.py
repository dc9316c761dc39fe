"""A simulated PostgreSQL source and its Debezium change stream, with the true final state.

``generate(spec, log, registry, truth_dir)`` writes a realistic, seeded CDC workload (snapshot,
transactions, deletes with tombstones, a truncate, an added column, TOAST placeholders,
redeliveries, partition skew and optional malformed messages) into the embedded topic log and
saves the state every target table must end up in (:class:`Truth`). Modules, along the way:
``model`` (tables and live rows), ``rows`` (plausible values), ``workload`` (snapshot and
transactions), ``wal`` (LSNs, xids, commit order), ``wire`` and ``encode`` (Debezium's Avro and
JsonConverter shapes), ``delivery`` (partitioning, redelivery, skew) and ``truth`` (on disk).
"""

from harness.simulator.spec import WorkloadSpec
from harness.simulator.truth import Truth
from harness.simulator.workload import generate

__all__ = ["Truth", "WorkloadSpec", "generate"]
