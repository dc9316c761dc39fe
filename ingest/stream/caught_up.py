"""Whether a run has anything to do, asked of the Delta logs and the source, without Spark.

A table has work when its topic holds a record past the last offset its Delta log records as
applied, and still holds it (Kafka's retention may have dropped records no run ever read). Every
record a run reads ends in that log -- applied, superseded, stale, quarantined or skipped as
already applied -- so a table with no such record would only start Spark to learn it has nothing
to do (docs/architecture.md#progress-lives-in-the-table). A table that caught up after a stop reads
the same span (:func:`backlog`), in pieces (:func:`chunks`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ingest.commit.state import TableState, load_state
from ingest.config import IngestConfig, TableSpec
from ingest.errors import SourceUnavailableError
from ingest.lake.layout import TablePaths
from ingest.source.catalog import Catalog, catalog_for

log = logging.getLogger(__name__)


def pending(config: IngestConfig, specs: list[TableSpec], catalog: Catalog | None = None,
            states: dict[str, TableState] | None = None) -> dict[str, int]:
    """Per table, the records its topic holds that its Delta log does not record as read (``states``:
    the tables' as read already).

    Raises:
        SourceUnavailableError: the source cannot say where its partitions end.
    """
    catalog = catalog or catalog_for(config)
    found = {}
    for spec in specs:
        state = states[spec.name] if states is not None else load_state(TablePaths.of(config, spec.name).table)
        ends = catalog.end_offsets(spec.topic)
        if not ends:
            say_no_topic(spec)
        nexts = {p: after_applied(state.applied_offset(spec.topic, p)) for p in ends}
        if any(nexts[p] < end for p, end in ends.items()):
            starts = catalog.start_offsets(spec.topic)  # asked only when it matters: one more request
            found[spec.name] = sum(max(0, end - max(nexts[p], starts.get(p, 0))) for p, end in ends.items())
        else:
            found[spec.name] = 0
    return found


def say_no_topic(spec: TableSpec) -> None:
    """Warn that ``spec``'s topic does not exist: a misspelled name would otherwise look caught up."""
    log.warning("table %s: topic %s does not exist, so there is nothing to read until it does (Debezium creates "
                "a table's topic with its first change; if the source table has rows, check the name)",
                spec.name, spec.topic)


def gap_of(topic: str, state: TableState, first_held: dict[int, int]) -> dict[int, tuple[int, int]]:
    """The offsets of ``topic`` the table (``state``) has not applied and the source no longer holds,
    given the first offset it still holds per partition: partition -> (first, last) missing."""
    gaps = {}
    for p, first in sorted(first_held.items()):
        wanted = after_applied(state.applied_offset(topic, p))
        if first > wanted:
            gaps[p] = (wanted, first - 1)
    return gaps


def retention_gap(spec: TableSpec, state: TableState, source: Catalog) -> dict[int, tuple[int, int]]:
    """:func:`gap_of` ``spec``'s topic as the source holds it now. A table added after its topic's
    retention dropped the snapshot has one from offset 0."""
    return gap_of(spec.topic, state, source.start_offsets(spec.topic))


def warn_retention_gap(spec: TableSpec, state: TableState, source: Catalog) -> None:
    """:func:`say_retention_gap` of :func:`retention_gap`, once at a run's start.

    A source that does not answer is not this check's to report: the query's start meets it and
    says so as it always has."""
    try:
        gaps = retention_gap(spec, state, source)
    except SourceUnavailableError:
        return
    say_retention_gap(spec, gaps)


def say_retention_gap(spec: TableSpec, gaps: dict[int, tuple[int, int]]) -> None:
    """One warning line when ``gaps`` holds changes the table will never see: rows whose only changes
    were there are missing, with nothing else to show it."""
    if gaps:
        where = ", ".join(f"partition {p} offsets {a}..{b}" for p, (a, b) in gaps.items())
        log.warning("table %s: %s no longer holds %s (retention), which the table never applied: rows whose "
                    "changes were only there are missing; re-read the table from the database with "
                    "`ingest resnapshot %s` (docs/operations.md, adding a table)", spec.name, spec.topic, where,
                    spec.name)


def after_applied(applied: int | None) -> int:
    """The first offset after ``applied``, the last one a table applied (``None``: none yet)."""
    return 0 if applied is None else applied + 1


def backlog(source: Catalog, spec: TableSpec, state: TableState) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition, where the table's records not applied yet start and where they end, as the source
    holds them now; the records retention took before the table applied them are said once."""
    end = source.end_offsets(spec.topic)
    first = source.start_offsets(spec.topic)
    say_retention_gap(spec, gap_of(spec.topic, state, first))
    return {p: max(first.get(p, 0), after_applied(state.applied_offset(spec.topic, p))) for p in end}, end


def chunks(start: dict[int, int], end: dict[int, int], limit: int) -> Iterator[tuple[dict[int, int], dict[int, int]]]:
    """``[start, end)`` per partition in pieces of about ``limit`` records, the partitions side by side."""
    pos = {p: o for p, o in start.items() if p in end}
    while live := [p for p in sorted(pos) if pos[p] < end[p]]:
        share = max(1, limit // len(live))
        stop = {p: min(end[p], pos[p] + share) for p in live}
        yield {p: pos[p] for p in live}, stop
        pos.update(stop)
