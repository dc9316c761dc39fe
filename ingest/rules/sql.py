"""SQL over the batch's Arrow tables, on the driver: DuckDB reads them in place, without copies.

Reduce, tombstone resolution and the merge plan are window functions and joins; written as SQL they
run in DuckDB's vectorized engine over the batch's Arrow buffers, and no row becomes a Python
object. One database per process, a cursor per step (threads hold their own); results come back as
Arrow.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ingest.columns import normalize

_DATABASE: Any = None
_OWNER = 0  # the process that opened it (a forked child opens its own)
_LOCK = threading.Lock()


def _close() -> None:
    global _DATABASE
    if _DATABASE is not None and os.getpid() == _OWNER:
        _DATABASE.close()
    _DATABASE = None


def connect(**tables: pa.Table) -> Any:
    """A connection (UTC) to the process's in-memory DuckDB, with ``tables`` registered under their names.

    One database per process, one cursor per caller: opening a database costs tens of
    milliseconds (several times that with tables applying side by side), a cursor almost nothing.
    What a cursor registers is its own and goes with ``close()``.
    """
    global _DATABASE, _OWNER
    with _LOCK:
        if _DATABASE is None or os.getpid() != _OWNER:
            import duckdb  # 0.2 s to load, paid by the first batch: a run with nothing to do never loads it

            _DATABASE, _OWNER = duckdb.connect(), os.getpid()
            atexit.register(_close)
            _DATABASE.execute("SET threads = 2")
            _DATABASE.execute("SET GLOBAL TimeZone = 'UTC'")  # every cursor's (one SET each cost ~2 ms)
        con = _DATABASE.cursor()
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
