"""SQL over the batch's Arrow tables, on the driver: DuckDB reads them in place, without copies.

Reduce, tombstone resolution and the merge plan are window functions and joins; written as SQL they
run in DuckDB's vectorized engine over the batch's Arrow buffers, and no row becomes a Python
object. One connection per batch (threads hold their own); results come back as Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from ingest.deltaio import normalize


def connect(**tables: pa.Table) -> Any:
    """An in-memory DuckDB connection (UTC) with ``tables`` registered under their names."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET threads = 2")
    for name, table in tables.items():
        con.register(name, table)
    return con


def query(con: Any, sql: str) -> pa.Table:
    """Run ``sql`` and return its result as Arrow (plain string and binary types)."""
    return normalize(con.sql(sql).to_arrow_table())


def ident(name: str) -> str:
    """A quoted identifier (names keep their case, spaces and quotes)."""
    return '"' + name.replace('"', '""') + '"'


def literal(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


def keys_equal(left: str, right: str, key_columns: Sequence[str]) -> str:
    """``left.k = right.k AND ...`` for the primary key (``IS NOT DISTINCT FROM``: keys are never null)."""
    return " AND ".join(f"{left}.{ident(k)} = {right}.{ident(k)}" for k in key_columns)


def key_list(key_columns: Sequence[str], alias: str = "") -> str:
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + ident(k) for k in key_columns)
