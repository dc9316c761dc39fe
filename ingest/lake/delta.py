"""Small Delta Lake helpers over delta-rs: opening, reading, writing and querying tables.

Reads go through delta-rs's own DataFusion engine (``QueryBuilder``) rather than
``to_pyarrow_dataset``: pyarrow dataset scanners over delta-rs can abort the interpreter at exit
(delta-rs#2184, arrow#34314), which would turn a successful CLI run into exit code 134.

A table with deletion vectors (written by the delta-spark engine) is read with polars instead:
deltalake 1.6 refuses that reader feature, polars applies the vectors (the rows they mark deleted
are not returned). Both read the same snapshot version.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from ingest.columns import normalize
from ingest.errors import LakeUnavailableError
from ingest.lake.location import LakePath, Location, reader_options, say_if_away, unavailable


def utc_literal(value: datetime) -> str:
    """A UTC timestamp literal in delta-rs's SQL, for the UTC-aware timestamp columns the engine writes
    (a naive ``::timestamp`` fails in delta-rs's delete)."""
    stamp = value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return f"arrow_cast('{stamp}Z', 'Timestamp(Microsecond, Some(\"UTC\"))')"


def quote(name: str) -> str:
    """Quote an identifier for delta-rs/DataFusion SQL (names keep their case and spaces)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def key_range(keys: pa.Table | None, column: str, alias: str = "", *, ident: Callable[[str], str] = quote,
              string: Callable[[str], str] = sql_string) -> str | None:
    """``column`` between the smallest and largest of ``keys[column]``, as a SQL predicate.

    Delta engines skip every file whose min/max statistics fall outside it, so with a table laid out
    by key a batch reads and rewrites only the files its keys live in. ``None`` when there are no
    keys or the values have no plain literal (then nothing is pruned). ``ident`` and ``string``
    write identifiers and string literals in the SQL dialect wanted (default: delta-rs's).
    """
    if keys is None or keys.num_rows == 0 or column not in keys.column_names:
        return None
    literals = [_literal(v.as_py(), string) for v in pc.min_max(keys[column]).values()]
    if None in literals:
        return None
    col = f"{alias}.{ident(column)}" if alias else ident(column)
    return f"{col} >= {literals[0]} AND {col} <= {literals[1]}"


def _literal(value: Any, string: Callable[[str], str]) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return string(value)
    return None


def rows_in_range(table: DeltaTable, keys: pa.Table, column: str) -> int:
    """How many rows the table's files hold whose ``column`` statistics overlap the range of
    ``keys[column]``: the rows a MERGE bounded by :func:`key_range` still reads. A file without
    statistics for the column counts whole."""
    files = pa.table(table.get_add_actions(flatten=True))
    if files.num_rows == 0:
        return 0
    low, high = pc.min_max(keys[column]).values()
    if not low.is_valid or f"min.{column}" not in files.column_names or f"max.{column}" not in files.column_names:
        return int(pc.sum(files["num_records"]).as_py() or 0)
    try:
        outside = pc.or_kleene(pc.less(files[f"max.{column}"], low), pc.greater(files[f"min.{column}"], high))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return int(pc.sum(files["num_records"]).as_py() or 0)
    kept = pc.invert(pc.fill_null(outside, False))
    return int(pc.sum(files["num_records"].filter(kept)).as_py() or 0)


def empty(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema``, built without pandas (``Schema.empty_table()`` imports it: a second)."""
    return pa.Table.from_batches([], schema=schema)


def open_table(path: Location) -> DeltaTable | None:
    """The Delta table at ``path`` (a directory or an object-store location), or ``None`` if there is none yet.

    Raises:
        LakeUnavailableError: the object store refused or did not answer (the cause in one line).
    """
    where = LakePath.of(path)
    say_if_away(where)
    try:
        return DeltaTable(where.uri, storage_options=where.storage_options)
    except TableNotFoundError:
        return None
    except OSError as exc:  # delta-rs's object store: credentials, endpoint, bucket
        raise LakeUnavailableError(unavailable(where, exc)) from None


def log_version(table: DeltaTable) -> int | None:
    """The newest version in the table's log, read without bringing ``table`` forward (one listing).

    delta-rs answers it on its inner handle only; ``None`` when that is missing (a later delta-rs),
    which a caller must take as "unknown".
    """
    latest = getattr(getattr(table, "_table", None), "get_latest_version", None)
    return int(latest()) if callable(latest) else None


def latest_table(path: Location, table: DeltaTable | None = None) -> DeltaTable | None:
    """:func:`open_table`, or ``table`` -- the same table as opened before -- brought up to date.

    Opening replays the log; bringing an open table up to date reads only the commits since. A log
    the handle cannot follow is opened afresh.
    """
    if table is not None:
        try:
            table.update_incremental()
            return table
        except DeltaError:
            pass
    return open_table(path)


def write_table(path: Location, data: Any, **kwargs: Any) -> None:
    """``write_deltalake`` at a lake location, with the storage options that reach it."""
    where = LakePath.of(path)
    write_deltalake(where.uri, data, storage_options=where.storage_options, **kwargs)


#: The table property that makes Delta record a table's change data feed.
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def records_change_feed(table: DeltaTable) -> bool:
    """Whether the table's properties switch its change data feed on."""
    return str(table.metadata().configuration.get(CHANGE_DATA_FEED, "false")).lower() == "true"


def has_deletion_vectors(table: DeltaTable) -> bool:
    """Whether the table's protocol names the ``deletionVectors`` reader feature."""
    return "deletionVectors" in (table.protocol().reader_features or [])


def scan(table: DeltaTable) -> Any:
    """A polars ``LazyFrame`` over the table's snapshot, deletion vectors applied."""
    # polars (about 1 s to import): only for tables with deletion vectors
    import polars as pl

    # polars reads the data files with its own object-store client, which takes the table's endpoint
    # options (the ones polars itself reads from a DeltaTable) but not delta-rs's retry settings.
    options = reader_options(getattr(table, "_storage_options", None))
    return pl.scan_delta(table.table_uri, version=table.version(), storage_options=options)


def query(table: DeltaTable, sql: str, *, name: str = "t") -> pa.Table:
    """Run ``sql`` against ``table`` registered as ``name`` and return the result."""
    return query_tables({name: table}, sql)


def query_tables(tables: Mapping[str, DeltaTable], sql: str) -> pa.Table:
    """Run ``sql`` against ``tables``, each registered under its name, and return the result.

    delta-rs's DataFusion reads tables without deletion vectors; when one of them has them (a
    delta-spark table), all are read with polars, which applies them.
    """
    if any(has_deletion_vectors(table) for table in tables.values()):
        # polars (about 1 s to import): only for tables with deletion vectors
        import polars as pl

        context = pl.SQLContext({name: scan(table) for name, table in tables.items()})
        frame = context.execute(sql, eager=False).collect()
        return frame.to_arrow(compat_level=pl.CompatLevel.oldest())
    builder = QueryBuilder()
    for name, table in tables.items():
        builder = builder.register(name, table)
    # through the stream interface: pa.table() would import pandas (a second) to rule out a DataFrame
    return pa.RecordBatchReader.from_stream(builder.execute(sql)).read_all()


def read_all(table: DeltaTable, *, columns: list[str] | None = None, where: str | None = None) -> pa.Table:
    """Read a whole table (optionally some columns and a SQL filter)."""
    cols = ", ".join(quote(c) for c in columns) if columns else "*"
    sql = f"SELECT {cols} FROM t" + (f" WHERE {where}" if where else "")
    return normalize(query(table, sql))


#: The commit-info key of a commit that changes a table's layout, never its rows (compaction, vacuum):
#: the engine's progress and key live in other commits (``ingest maintain``, :func:`pack_small_files`).
MAINTENANCE_KEY: Final = "cdc.maintenance"
#: :func:`pack_small_files` packs a tier once more than this many files are small for it.
PACK_AFTER_FILES: Final = 16
#: The tiers of :func:`pack_small_files`: the sizes (bytes) it packs files into, smallest first.
PACK_TIERS: Final = (1 << 20, 64 << 20)


def pack_small_files(table: DeltaTable, *, after: int = PACK_AFTER_FILES, tiers: tuple[int, ...] = PACK_TIERS
                     ) -> int:
    """Bin-pack the small files of a table that gains a file with most batches, once they add up.

    The engine's side tables (remembered deletes, primary-key moves) are written by a MERGE per
    batch that inserts new keys into a new small file, and read by key ranges that random keys
    stretch over every file: unpacked, each batch would read and merge one file more than the
    last. A continuous run's audit table gains a file with each micro-batch's append. Per tier,
    smallest first: when more than ``after`` files are smaller than half the tier's size,
    delta-rs's compaction packs the files below that size into files of about that size; the
    packed files count toward the next tier. So a table keeps at most ``after`` small files per
    tier, and a pack never rewrites a file of the largest tier's size or more. A table with
    deletion vectors is left as it is (delta-rs cannot write it).

    Returns:
        How many files the packing removed (0: nothing to pack).
    """
    if has_deletion_vectors(table):
        return 0
    removed = 0
    sizes = pa.table(table.get_add_actions(flatten=True))["size_bytes"]
    for size in tiers:
        small = pc.sum(pc.less(sizes, size // 2)).as_py() or 0
        if small <= after:
            continue
        metrics = table.optimize.compact(target_size=size, commit_properties=CommitProperties(
            custom_metadata={MAINTENANCE_KEY: "pack"}))
        removed += int(metrics.get("numFilesRemoved", 0))
        sizes = pa.table(table.get_add_actions(flatten=True))["size_bytes"]  # the packed files, for the next tier
    return removed


def table_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())
