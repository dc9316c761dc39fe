"""Per-table status: applied offsets, lag, Delta version, last batch; and the connectors' heartbeats.

End offsets come from the configured source (Kafka's admin API or the embedded log). A source that
cannot answer leaves the lag unknown and says why (``source_error``); it is never reported as 0. Nor is
a topic that ends before the offsets its table applied (``behind``): it is not the topic the table read.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from ingest.commit.state import load_state
from ingest.config import IngestConfig
from ingest.cuts.publish import Outcome, Publisher
from ingest.errors import SourceUnavailableError, TopicBehindTableError
from ingest.lake.delta import open_table, query
from ingest.lake.layout import TablePaths
from ingest.lake.location import Location
from ingest.records import audit
from ingest.source.catalog import Catalog, Heartbeat, catalog_for, heartbeat_topics, newest_heartbeats


@dataclass(slots=True)
class TableStatus:
    table: str
    topic: str
    applied: dict[int, int | None]
    end: dict[int, int]
    delta_version: int | None
    rows: int
    last_batch: dict | None
    #: why the source's end offsets are unknown (``None``: they are known)
    source_error: str | None = None
    #: why the topic is not the one the table read: it ends before offsets the table applied
    #: (:class:`~ingest.errors.TopicBehindTableError`; a run stops the table)
    behind: str | None = None

    @property
    def lag(self) -> int | None:
        """Records in the topic the table has not applied; ``None`` when the source did not answer or the
        topic ends before the table (:attr:`behind`)."""
        if self.source_error is not None or self.behind is not None:
            return None
        return sum(end - (-1 if (applied := self.applied.get(p)) is None else applied) - 1
                   for p, end in self.end.items())


def table_status(config: IngestConfig, *, source: Catalog | None = None) -> list[TableStatus]:
    """The status of every configured table (one source connection for all of them)."""
    source = source or catalog_for(config)
    out, unavailable = [], None
    for spec in config.tables:
        paths = TablePaths.of(config, spec.name)
        state = load_state(paths.table)
        end, error = {}, unavailable  # a source that did not answer is not asked again for every table
        if unavailable is None:
            try:
                end = source.end_offsets(spec.topic)
            except SourceUnavailableError as exc:
                error = unavailable = str(exc)
        applied = {p: state.applied_offset(spec.topic, p) for p in end}
        batches = audit.read(paths.audit, table=spec.name)
        last = None
        if batches.num_rows:
            last = max(batches.to_pylist(), key=lambda r: (r["delta_version"] or -1, r["finished_at"]))
        behind = state.ends_before(spec.topic, end)
        out.append(TableStatus(spec.name, spec.topic, applied, end, state.version, live_row_count(paths.table), last,
                               error, str(TopicBehindTableError(spec.name, spec.topic, behind)) if behind else None))
    return out


def heartbeat_status(config: IngestConfig, *, source: Catalog | None = None) -> list[Heartbeat]:
    """The newest heartbeat of each connector of the configured tables (``source.kafka.heartbeat_topic``)."""
    topics = heartbeat_topics(config)
    return newest_heartbeats(source or catalog_for(config), topics) if topics else []


def describe_heartbeat(beat: Heartbeat, now: float) -> str:
    """One heartbeat topic as ``ingest status`` says it: how old its newest record is, or why it has none."""
    if beat.error is not None:
        return f"heartbeats: {beat.topic} not read: {beat.error}"
    if beat.written is None:
        return (f"no heartbeats in {beat.topic}: set the connector's heartbeat.interval.ms so that a connector "
                "that stopped can be seen (docs/operations.md#a-connector-that-stopped)")
    return f"heartbeats: {beat.topic}, the newest {max(0.0, now - beat.written):.0f} s ago"


def live_row_count(path: Location) -> int:
    """Rows a reader sees (soft-deleted rows excluded)."""
    table = open_table(path)
    if table is None:
        return 0
    result = query(table, "SELECT count(*) AS n FROM t WHERE NOT coalesce(_cdc_deleted, false)")
    return int(pc.sum(result["n"]).as_py() or 0)


def cut_status(config: IngestConfig) -> Outcome | None:
    """The latest cut of the configuration's transaction group and what holds a newer one back
    (``None`` without a group); nothing is published."""
    if config.source.transactions is None:
        return None
    return Publisher(config).attempt(write=False)
