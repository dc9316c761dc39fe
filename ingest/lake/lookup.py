"""A Delta table's rows by key, read on the driver.

Every read of stored rows by key on the driver goes through a :class:`KeyLookup`: :func:`rows_of_keys`
reads them with delta-rs; the delta-spark writer gives one that reads a large table on Spark's
executors and sends back only the rows found (:meth:`ingest.commit.delta_spark.DeltaSparkWriter.lookup`).
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from deltalake import DeltaTable

from ingest.lake.delta import key_range, read_all
from ingest.rules.sql import connect, ident, query


class KeyLookup(Protocol):
    """Reads the stored rows whose key is among ``keys``' (``columns`` of them, default all), as
    :func:`rows_of_keys` does."""

    def __call__(self, table: DeltaTable, key_columns: tuple[str, ...], keys: pa.Table,
                 columns: list[str] | None = None) -> pa.Table: ...


def rows_of_keys(table: DeltaTable, key_columns: tuple[str, ...], keys: pa.Table,
                 columns: list[str] | None = None) -> pa.Table:
    """The stored rows whose key is among ``keys``' (``columns`` of them, default all).

    The read is bounded by the range of the first key column (Delta skips the files outside it),
    then narrowed to the keys themselves.
    """
    found = read_all(table, columns=columns, where=key_range(keys, key_columns[0]))
    con = connect(found=found, wanted=keys.select(list(key_columns)))
    try:
        match = " AND ".join(f"f.{ident(k)} = w.{ident(k)}" for k in key_columns)
        return query(con, f"SELECT f.* FROM found f WHERE EXISTS (SELECT 1 FROM wanted w WHERE {match})")
    finally:
        con.close()
