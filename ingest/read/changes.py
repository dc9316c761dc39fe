"""A table's change data feed, as analysts and downstream jobs read it (``ingest changes``).

Tables record Delta's change data feed (``target.change_data_feed``, on by default): each commit's
inserted rows, the pre- and post-image of updated rows and deleted rows, with ``_change_type``,
``_commit_version`` and ``_commit_timestamp``. delta-rs reads it; a table with deletion vectors
(delta-spark's) is read with Spark's ``readChangeFeed``.

Two kinds of commit change no row value and are left out: a schema widening rewrites every row with
the same values in a wider type (Delta would report each row deleted and inserted again), and
maintenance (compaction) is not a data change in Delta's own log. In soft-delete mode a source delete
is an update that sets ``_cdc_deleted``, and appears as one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ingest.columns import normalize
from ingest.commit.state import STATE_KEY, newest_cdc_commit
from ingest.config import IngestConfig
from ingest.errors import QueryError
from ingest.lake.delta import has_deletion_vectors, open_table, records_change_feed
from ingest.lake.location import LakePath
from ingest.read.query import absent_table, commit_times

#: The change types of Delta's change data feed, in the order a commit's changes are listed.
CHANGE_TYPES = ("delete", "update_preimage", "update_postimage", "insert")
CHANGE_COLUMNS = ("_commit_version", "_change_type", "_commit_timestamp")
#: What a schema widening's commit carries (both engines), see :mod:`ingest.rules.schema`.
SCHEMA_CHANGE_KEY = "cdc.schema_change"


class ChangeFeedError(QueryError):
    """The change feed cannot be read as asked (no table, feed not enabled, versions out of range)."""


@dataclass(frozen=True, slots=True)
class ChangeRange:
    """Which commits to read: from a version (inclusive) or from a time, up to a version (inclusive)."""

    from_version: int | None = None
    since: datetime | None = None
    to_version: int | None = None


def changes(config: IngestConfig, name: str, which: ChangeRange,
            spark: Callable[[], Any] | None = None, say: Callable[[str], None] | None = None) -> pa.Table:
    """The table's changes in ``which``, ordered by commit version, then change type, then key.

    Args:
        spark: gives a Spark session, for tables with deletion vectors (default: the configuration's).
        say: told when the read goes through Spark, whose start takes a while.

    Raises:
        ChangeFeedError: no such table, its change data feed is off, or the range is outside its history.
    """
    table = open_table(config.tables_root / name)
    if table is None:
        raise ChangeFeedError(absent_table(config, name))
    if not records_change_feed(table):
        raise ChangeFeedError(
            f"{name}: its change data feed is not enabled (with target.change_data_feed: true, the default, "
            "the next batch applied to the table switches it on, and it records changes from then on)")
    history = table.history()  # read once: versions' times, widenings, the key
    times = commit_times(table, history)
    start = _start_version(table, name, which, times)
    end = table.version() if which.to_version is None else which.to_version
    if end < start:
        raise ChangeFeedError(f"{name}: no versions between {start} and {end} (latest is {table.version()})")
    if has_deletion_vectors(table):
        if say is not None:
            say(f"{name}: the table has deletion vectors; reading versions {start}..{end} with Spark's "
                "readChangeFeed (a Spark session takes several seconds to start)")
        if spark is None:
            from ingest.spark.session import delta_session  # pyspark only for tables that need it

            spark = partial(delta_session, config.spark, s3=not config.lake_is_local)
        session = spark()
        rows = _read_with_spark(config.tables_root / name, start, end, session)
    else:
        try:
            rows = normalize(pa.table(table.load_cdf(starting_version=start, ending_version=end).read_all()))
        except Exception as exc:  # delta-rs names the cause: the feed was off then, or files vacuumed
            raise ChangeFeedError(f"{name}: cannot read changes {start}..{end}: {exc}") from exc
    rows = _uniform(rows, times)
    skipped = _not_data_changes(history, start, end)
    if skipped:
        rows = rows.filter(pc.invert(pc.is_in(rows["_commit_version"], pa.array(sorted(skipped), pa.int64()))))
    return _ordered(rows, _key_columns(history))


def _start_version(table: DeltaTable, name: str, which: ChangeRange, times: dict[int, datetime]) -> int:
    if which.from_version is not None:
        if not 0 <= which.from_version <= table.version():
            raise ChangeFeedError(f"{name}: no version {which.from_version} (versions 0..{table.version()})")
        return which.from_version
    if which.since is None:
        return 0
    later = [version for version, moment in times.items() if moment >= which.since]
    if not later:
        raise ChangeFeedError(f"{name}: no commit since {which.since.isoformat()}")
    return min(later)


def _not_data_changes(history: list[dict[str, Any]], start: int, end: int) -> set[int]:
    """Versions in ``start..end`` that rewrote rows without changing them (schema widenings)."""
    out = set()
    for commit in history:
        if not start <= commit.get("version", -1) <= end:
            continue
        user = commit.get("userMetadata")
        if SCHEMA_CHANGE_KEY in commit or (isinstance(user, str) and SCHEMA_CHANGE_KEY in user):
            out.add(commit["version"])
    return out


def _ordered(rows: pa.Table, keys: list[str]) -> pa.Table:
    """Change columns first, then the table's own; sorted by version, change type, the rest."""
    first = [c for c in CHANGE_COLUMNS if c in rows.column_names]
    rows = rows.select(first + [c for c in rows.column_names if c not in first])
    rank = pa.array([CHANGE_TYPES.index(t) if t in CHANGE_TYPES else len(CHANGE_TYPES)
                     for t in rows["_change_type"].to_pylist()], pa.int8())
    keyed = rows.append_column("__rank", rank)
    order = [("_commit_version", "ascending"), *((k, "ascending") for k in keys if k in rows.column_names),
             ("__rank", "ascending")]
    return keyed.sort_by(order).drop_columns(["__rank"])


def _key_columns(history: list[dict[str, Any]]) -> list[str]:
    """The primary key the table's newest CDC commit records (history is newest first)."""
    newest = newest_cdc_commit(history)
    return list((newest or {}).get(STATE_KEY, {}).get("primary_key") or ())


def _uniform(rows: pa.Table, times: dict[int, datetime]) -> pa.Table:
    """The change columns in one type whichever reader read them: version int64, time in UTC.

    ``_commit_timestamp`` is the commit info's time (as ``ingest history`` and ``--as-of`` use it);
    readers take the log file's, a few milliseconds later.
    """
    wanted = {"_commit_version": pa.int64(), "_commit_timestamp": pa.timestamp("us", tz="UTC")}
    rows = rows.cast(pa.schema([pa.field(f.name, wanted.get(f.name, f.type)) for f in rows.schema]))
    at = rows.schema.get_field_index("_commit_timestamp")
    stamps = pa.array([times.get(v) for v in rows["_commit_version"].to_pylist()], pa.timestamp("us", tz="UTC"))
    return rows.set_column(at, "_commit_timestamp", stamps)


def _read_with_spark(where: LakePath, start: int, end: int, spark: Any) -> pa.Table:
    # Spark: only for a change feed read with Spark
    from ingest.spark.session import spark_location

    frame = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", start)
             .option("endingVersion", end).load(spark_location(spark, where)))
    return normalize(frame.toArrow())


def as_json_lines(rows: pa.Table) -> str:
    return "\n".join(json.dumps(r, default=_default) for r in rows.to_pylist())


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat() if value.tzinfo else value.isoformat()
    return str(value)
