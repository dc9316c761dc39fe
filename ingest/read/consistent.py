"""Reading every table of a transaction group at one cut: the same source transactions in each.

``ingest query --consistent`` reads the group's tables at the latest published cut;
``--consistent-as-of`` at an earlier one. From Python, :func:`cut_for` gives the cut -- its
``versions`` are what to pass to any Delta reader (Spark: ``option("versionAsOf", v)`` or
``VERSION AS OF v``) -- and :func:`run_consistent` runs DuckDB SQL over those versions. Tables
outside the group are read at their latest version, as without ``--consistent``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

import pyarrow as pa

from ingest.config import IngestConfig
from ingest.cuts import store
from ingest.cuts.store import Cut
from ingest.errors import QueryError
from ingest.model import SourcePosition


class ConsistencyError(QueryError):
    """A consistent read that cannot be made: no transaction group, no cut yet, no cut that early."""


def cut_for(config: IngestConfig, as_of: str | None = None) -> Cut:
    """The latest cut, or the latest at or before ``as_of``.

    Args:
        as_of: a cut number (``#12``), a source transaction id, a cut's source position (as
            ``ingest cuts`` lists it), or a time (ISO 8601; UTC unless it says otherwise).

    Raises:
        ConsistencyError: the configuration has no transaction group, no cut is published yet, or
            none is that early.
    """
    if config.source.transactions is None:
        raise ConsistencyError(
            "--consistent needs a transaction group: set source.transactions.topic to the connector's "
            "<topic.prefix>.transaction, and provide.transaction.metadata: true in the connector")
    path = config.tables_root / config.target.cuts_table
    if as_of is None:
        latest = store.latest(path)
        if latest is None:
            raise ConsistencyError(f"no cut published yet for {config.source.transactions.topic}: run the "
                                   "pipeline until its tables have applied a whole transaction ('ingest status' "
                                   "says what holds the cut back)")
        return latest
    cuts = store.every(path)
    chosen = _at_or_before(cuts, as_of.strip())
    if chosen is None:
        first = f"the first is #{cuts[0].cut} (transaction {cuts[0].txn})" if cuts else "none is published yet"
        raise ConsistencyError(f"--consistent-as-of {as_of!r}: no cut at or before it; {first}")
    return chosen


def _at_or_before(cuts: list[Cut], point: str) -> Cut | None:
    if point.startswith("#") and point[1:].isdigit():
        wanted = int(point[1:])
        return next((c for c in cuts if c.cut == wanted), None)
    exact = [c for c in cuts if point in (c.txn, c.txn.split(":", 1)[0])]
    if exact:
        return exact[-1]
    try:
        SourcePosition.decode(point)
        return max((c for c in cuts if c.position is not None and c.position <= point), key=_number, default=None)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(point.replace("Z", "+00:00"))
    except ValueError:
        raise ConsistencyError(f"--consistent-as-of {point!r}: not a cut (#12), a published cut's transaction "
                               "id or position ('ingest cuts' lists them), or a time (2026-11-24T06:00:00Z)") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return max((c for c in cuts if c.commit_ts is not None and c.commit_ts <= moment), key=_number, default=None)


def _number(cut: Cut) -> int:
    return cut.cut


def pinned(config: IngestConfig, names: Collection[str]) -> Cut | None:
    """The cut that readers of ``names`` read at: the latest, when every one of them is in the transaction
    group; ``None`` (read the latest versions) otherwise.

    Raises:
        ConsistencyError: they are in the group but no cut is published yet.
    """
    group = {t.name for t in config.consistent_tables()}
    if not group or not set(names) <= group:
        return None
    return cut_for(config)


def cuts(config: IngestConfig) -> list[Cut]:
    """Every published cut, oldest first.

    Raises:
        ConsistencyError: the configuration has no transaction group.
    """
    if config.source.transactions is None:
        raise ConsistencyError("no transaction group: set source.transactions.topic to the connector's "
                               "<topic.prefix>.transaction, and provide.transaction.metadata: true in the connector")
    return store.every(config.tables_root / config.target.cuts_table)


def run_consistent(config: IngestConfig, sql: str, as_of: str | None = None) -> tuple[pa.Table, Cut]:
    """Run one SQL statement over the group's tables at a cut (:func:`cut_for`); the rows and the cut."""
    from ingest.read.query import AsOf, run_sql  # DuckDB: only for SQL, not to find a cut

    cut = cut_for(config, as_of)
    missing = sorted(t for t, v in cut.versions.items() if v is None)
    points = [AsOf(version=v, table=t) for t, v in sorted(cut.versions.items()) if v is not None]
    try:
        return run_sql(config, sql, points, absent=missing), cut
    except QueryError as exc:
        raise ConsistencyError(f"{exc} (at cut #{cut.cut}, transaction {cut.txn})") from None
