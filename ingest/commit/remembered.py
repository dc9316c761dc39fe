"""Remembered deletes: a side Delta table per target table, keyed by its primary key (docs/architecture.md#deletes).

In hard-delete mode a deleted row leaves the target table, so its key and the delete's position are
kept here: an older or replayed event of that key is then recognised as stale instead of bringing
the row back. Each tombstone also records when it was written (``_cdc_recorded_at``); retention
counts from then, not from the source's timestamp, so catching up an old backlog does not make its
deletes purgeable at once. The table follows the primary key's safe type widening.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from ingest.columns import arrow_type, delta_type_name, laid_out
from ingest.errors import TableError
from ingest.lake.delta import (
    open_table,
    query,
    quote,
    read_all,
    table_schema,
    utc_literal,
    write_table,
)
from ingest.lake.location import Location
from ingest.lake.lookup import KeyLookup, rows_of_keys
from ingest.lake.side import SideTable
from ingest.rules.ordering import later_than_stored_sql
from ingest.rules.schema import holds

Key = tuple[Any, ...]
_TIMESTAMP = pa.timestamp("us", tz="UTC")


def key_array(table: str, column: str, values: Sequence[Any], delta_type: str) -> pa.Array:
    """Key values as an Arrow array of the column's type; an error names the table and column."""
    try:
        return pa.array(values, arrow_type(delta_type))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise TableError(table, f"primary-key column {column!r} cannot hold the batch's values as "
                                f"{delta_type}: {exc}") from exc


class RememberedDeletes:
    """One table's remembered deletes: a :class:`~ingest.lake.side.SideTable`, kept open by a stream
    for as long as it runs, and packed behind each record."""

    def __init__(self, path: Location, table: str) -> None:
        self.path = path
        self.table = table
        self._side = SideTable(path, table, "remembered deletes")

    def open(self, key_types: Mapping[str, str]) -> DeltaTable | None:
        """The tombstone table at its latest version, its key columns widened to ``key_types``
        (``None``: none yet)."""
        return _aligned(self._side.latest(), key_types, self.table, before_write=self.settle)

    def settle(self) -> None:
        """Return once the packing behind the last record is done (one that failed has said so)."""
        self._side.settle()

    def read(self, key_columns: tuple[str, ...], key_types: Mapping[str, str],
             keys: pa.Table | None = None, *, lookup: KeyLookup = rows_of_keys) -> pa.Table | None:
        """The remembered deletes: the key columns and ``_cdc_position`` (``None``: none yet).

        Args:
            keys: only the deletes of these keys (default: all).
            lookup: what reads the deletes of ``keys`` (default :func:`~ingest.apply.stored.rows_of_keys`,
                on the driver; delta-spark's reads a large table on Spark's executors).
        """
        delta = self.open(key_types)
        if delta is None:
            return None
        columns = [*key_columns, "_cdc_position"]
        if keys is None or not key_columns:
            return read_all(delta, columns=columns)
        return lookup(delta, key_columns, keys, columns)

    def record(self, key_columns: tuple[str, ...], key_types: Mapping[str, str], deletes: pa.Table, *,
               new_keys_only: bool = False) -> None:
        """Remember deleted keys, idempotently and guarded by position.

        Args:
            deletes: the key columns, ``_cdc_position`` and ``_cdc_source_ts`` of each delete.
            new_keys_only: the caller read the remembered deletes of these keys since the last
                record and found none: the MERGE would only insert, so they are appended (a
                table written before ``_cdc_recorded_at`` existed still merges, which adds it).
        """
        if deletes.num_rows == 0:
            return
        self.settle()  # two writers of one table would conflict: the packing behind the last record first
        data: dict[str, pa.Array | pa.ChunkedArray] = {}
        for k in key_columns:
            try:
                data[k] = deletes[k].cast(arrow_type(key_types[k]))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise TableError(self.table, f"primary-key column {k!r} cannot hold the batch's values as "
                                             f"{key_types[k]}: {exc}") from exc
        data["_cdc_position"] = deletes["_cdc_position"]
        data["_cdc_deleted_at"] = deletes["_cdc_source_ts"].cast(_TIMESTAMP)
        data["_cdc_recorded_at"] = pa.array([datetime.now(UTC)] * deletes.num_rows, _TIMESTAMP)
        source = pa.table(data)
        delta = self.open(key_types)
        if delta is None:
            write_table(self.path, source, mode="append")
            return
        schema = table_schema(delta)
        if new_keys_only and set(source.column_names) == set(schema.names):
            write_deltalake(delta, laid_out(source, schema), mode="append")
            self._side.wrote()
            return
        on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in key_columns)
        # merge_schema: tombstone tables written before _cdc_recorded_at existed take the column on.
        (delta.merge(source, on, source_alias="s", target_alias="t", merge_schema=True)
         .when_matched_update_all(later_than_stored_sql("s._cdc_position", "t._cdc_position"))
         .when_not_matched_insert_all()
         .execute())
        self._side.wrote()

    def pack(self) -> None:
        """Bin-pack the small files that the batches' deletes add (:func:`~ingest.lake.delta.pack_small_files`),
        behind a MERGE of them that another writer (delta-spark's) made: each such MERGE writes one,
        and every batch reads them all. That writer calls :meth:`settle` before its MERGE."""
        self._side.wrote()


def positions(path: Location, key_columns: tuple[str, ...], key_types: Mapping[str, str], table: str) -> dict[Key, str]:
    """``key -> position of its delete`` for every remembered delete (for tools and tests)."""
    rows = RememberedDeletes(path, table).read(key_columns, key_types)
    if rows is None:
        return {}
    keys = zip(*(rows[k].to_pylist() for k in key_columns), strict=True)
    return dict(zip(keys, rows["_cdc_position"].to_pylist(), strict=True))


def purge(path: Location, older_than: datetime) -> int:
    """Forget deletes recorded before ``older_than``; returns how many were removed."""
    delta = open_table(path)
    if delta is None:
        return 0
    result = delta.delete(_recorded_before(delta, older_than))
    return int(result.get("num_deleted_rows", 0))


def purgeable(path: Location, older_than: datetime) -> int:
    """How many deletes :func:`purge` would forget now (nothing is changed)."""
    delta = open_table(path)
    if delta is None:
        return 0
    counted = query(delta, f"SELECT count(*) AS n FROM t WHERE {_recorded_before(delta, older_than)}")
    return int(counted["n"][0].as_py() or 0)


def _recorded_before(delta: DeltaTable, older_than: datetime) -> str:
    """The SQL predicate (delta-rs's dialect) of the tombstones recorded before ``older_than``."""
    cutoff = utc_literal(older_than.replace(microsecond=0))
    names = {f.name for f in table_schema(delta)}
    # Tombstones written before _cdc_recorded_at existed only know the source time.
    written = "coalesce(_cdc_recorded_at, _cdc_deleted_at)" if "_cdc_recorded_at" in names else "_cdc_deleted_at"
    return f"{written} < {cutoff}"


def millis_to_timestamp(values: Sequence[int | None]) -> pa.Array:
    return pa.array(values, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(_TIMESTAMP)


def _aligned(delta: DeltaTable | None, key_types: Mapping[str, str], table: str, *,
             before_write: Callable[[], None] = lambda: None) -> DeltaTable | None:
    """The tombstone table, its key columns first widened to the target table's key types (after
    ``before_write``, when there is something to widen)."""
    if delta is None:
        return None
    schema = table_schema(delta)
    wider = {}
    for f in schema:
        want = key_types.get(f.name)
        if want is None:
            continue
        have = delta_type_name(f.type)
        if have == want:
            continue
        if not holds(want, have):
            raise TableError(table, f"primary-key column {f.name!r} is {want} in the table but {have} in its "
                                    "tombstones; only a safe widening can follow")
        wider[f.name] = want
    if not wider:
        return delta
    before_write()
    target = pa.schema([pa.field(f.name, arrow_type(wider[f.name])) if f.name in wider else f for f in schema])
    current = read_all(delta)
    write_deltalake(delta, current.cast(target), mode="overwrite", schema_mode="overwrite",
                    commit_properties=CommitProperties(custom_metadata={
                        "cdc.schema_change": "; ".join(f"widened {k} -> {v}" for k, v in wider.items())}))
    delta.update_incremental()
    return delta
