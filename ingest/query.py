"""SQL for analysts over the live rows of the Delta tables, with DuckDB.

Each configured table (and the audit and quarantine tables) is a DuckDB view over the delta-rs
dataset of its current version (read by polars when it has deletion vectors); target-table views
hold live rows only.
"""

from __future__ import annotations

import gc
from typing import Any

import duckdb
import pyarrow as pa

from ingest.config import IngestConfig
from ingest.deltaio import has_deletion_vectors, normalize, open_table, scan


def connect(config: IngestConfig) -> tuple[duckdb.DuckDBPyConnection, list[Any]]:
    """A DuckDB connection with one view per table; keep the returned datasets alive while querying."""
    con = duckdb.connect()
    keep: list[Any] = []
    root = config.tables_root
    names = [(t.name, True) for t in config.tables]
    names += [(config.target.audit_table, False), (config.target.quarantine_table, False)]
    for name, is_target in names:
        delta = open_table(root / name)
        if delta is None:
            continue
        # deltalake cannot read deletion vectors (delta-spark's tables): polars reads those.
        dataset = scan(delta).collect().to_arrow() if has_deletion_vectors(delta) else delta.to_pyarrow_dataset()
        keep.append(dataset)
        raw = f"__raw_{name}"
        con.register(raw, dataset)
        where = " WHERE NOT coalesce(_cdc_deleted, false)" if is_target else ""
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "{raw}"{where}')
    return con, keep


def run_sql(config: IngestConfig, sql: str) -> pa.Table:
    """Run one SQL statement and return its result as Arrow."""
    con, keep = connect(config)
    try:
        return normalize(con.sql(sql).to_arrow_table())
    finally:
        con.close()
        del keep
        # Let pyarrow's scanner threads finish while the runtime is alive (arrow#34314).
        gc.collect()
