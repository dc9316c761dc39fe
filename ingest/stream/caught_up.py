"""Whether a run has anything to do, asked of the Delta logs and the source, without Spark.

A table has work when its topic holds a record past the last offset its Delta log records as
applied, and still holds it (Kafka's retention may have dropped records no run ever read). Every
record a run reads ends in that log -- applied, superseded, stale, quarantined or skipped as
already applied -- so a table with no such record would only start Spark to learn it has nothing
to do (docs/architecture.md#progress-lives-in-the-table).
"""

from __future__ import annotations

from ingest.commit.state import load_state
from ingest.config import IngestConfig, TableSpec
from ingest.lake.layout import TablePaths
from ingest.source.catalog import Catalog, catalog_for


def pending(config: IngestConfig, specs: list[TableSpec], catalog: Catalog | None = None) -> dict[str, int]:
    """Per table, the records its topic holds that its Delta log does not record as read.

    Raises:
        SourceUnavailableError: the source cannot say where its partitions end.
    """
    catalog = catalog or catalog_for(config)
    found = {}
    for spec in specs:
        state = load_state(TablePaths.of(config, spec.name).table)
        ends = catalog.end_offsets(spec.topic)
        nexts = {p: (-1 if (done := state.applied_offset(spec.topic, p)) is None else done) + 1 for p in ends}
        if any(nexts[p] < end for p, end in ends.items()):
            starts = catalog.start_offsets(spec.topic)  # asked only when it matters: one more request
            found[spec.name] = sum(max(0, end - max(nexts[p], starts.get(p, 0))) for p, end in ends.items())
        else:
            found[spec.name] = 0
    return found
