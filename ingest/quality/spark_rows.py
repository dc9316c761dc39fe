"""The rows the quality gate hands GX's Spark execution engine, and the rows it gets back.

On Spark (``quality.validate_on``) the gate validates a DataFrame: built from the winners' Arrow
table when the batch is on the driver (:func:`build_spark_frame`), or a projection of the winners'
DataFrame when the batch stays on the executors (:func:`frame_of_winners`). In the latter case the
only rows that come back to the driver are those GX names as failing (:func:`rows_named`): they
are described, quarantined and withdrawn there.

A Spark row has no index, so GX names a failing row by the table's primary key columns
(``unexpected_index_column_names``); :func:`rows_of_keys` maps those back to positions.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest.columns import arrow_type, normalize
from ingest.spark.sql import ident

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def build_spark_frame(spark: Any, rows: pa.Table, columns: dict[str, str]) -> Any:
    """The Spark DataFrame GX validates: one row per winner, the columns in their Delta types (a
    column the batch lacks is all null), timestamps without time zone kept as such."""
    # pyspark: only for a gate that validates on Spark
    from ingest.spark.session import arrow_frame

    arrays = {name: rows[name] if name in rows.column_names else pa.nulls(rows.num_rows, arrow_type(type_name))
              for name, type_name in columns.items()}
    if not arrays:  # a suite of table-level expectations only: rows without columns
        return arrow_frame(spark, pa.table({"_": pa.nulls(rows.num_rows, pa.bool_())})).select()
    return arrow_frame(spark, pa.table(arrays))


def frame_of_winners(live: DataFrame, columns: dict[str, str]) -> DataFrame:
    """:func:`build_spark_frame` of winners that are a DataFrame already (``live``: without deletes)."""
    # pyspark: only for a gate that validates on Spark
    from pyspark.sql import functions as F

    from ingest.spark.session import spark_type

    present = set(live.columns)
    return live.select(*(F.col(ident(name)) if name in present else F.lit(None).cast(spark_type(type_name)).alias(name)
                         for name, type_name in columns.items()))


def rows_named(live: DataFrame, key_columns: tuple[str, ...], result: Any) -> pa.Table:
    """The rows of ``live`` whose key a failing expectation of GX's ``result`` names (every column,
    collected: few, and bound for quarantine)."""
    # pyspark: only for a gate that validates on Spark
    from pyspark.sql import functions as F

    named = {tuple(entry.get(k) for k in key_columns)
             for r in result.results if not r.success
             for entry in ((r.result or {}).get("unexpected_index_list") or []) if isinstance(entry, dict)}
    if not named or not key_columns:
        return normalize(live.limit(0).toArrow())
    schema = live.select(*(F.col(ident(k)) for k in key_columns)).schema
    keys = live.sparkSession.createDataFrame(sorted(named, key=repr), schema)
    found = live.join(F.broadcast(keys), list(key_columns), "left_semi")
    return normalize(found.select(*(F.col(ident(c)) for c in live.columns)).toArrow())


def positions_by_key(rows: pa.Table, keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[int]]:
    """Validated row positions by their key values, as Spark returns them to Python."""
    out: dict[tuple[Any, ...], list[int]] = {}
    for pos, values in enumerate(zip(*(rows[k].to_pylist() for k in keys), strict=True)):
        out.setdefault(tuple(as_spark_returns(v) for v in values), []).append(pos)
    return out


def as_spark_returns(value: Any) -> Any:
    """``value`` as pyspark hands it back: a timestamp with a time zone becomes a naive one in this
    process's local time (Arrow gives it aware); a timestamp without one stays as it is."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    return value


def rows_of_keys(named: list[Any], keys: tuple[str, ...], by_key: dict[tuple[Any, ...], list[int]],
                  rows: pa.Table) -> list[int]:
    """The positions of the rows GX named by key (``[{key: value, ..., column: value}, ...]``).

    Rows that share a key (only an engine fault makes them: the gate's suites check it) are told
    apart by the expectation's own columns, which GX returns beside the key. A key not found (a value
    Spark returned in another form) names no row: the failure then holds the whole batch, as a map
    expectation that named no rows does.
    """
    positions: set[int] = set()
    for entry in named:
        found = by_key.get(tuple(entry.get(k) for k in keys)) if isinstance(entry, dict) else None
        if found is None:
            return []
        if len(found) > 1:
            columns = [c for c in entry if c not in keys and c in rows.column_names]
            candidates = {p: rows.slice(p, 1).to_pylist()[0] for p in found}
            same = [p for p, row in candidates.items() if all(as_spark_returns(row[c]) == entry[c] for c in columns)]
            found = same or found
        positions.update(found)
    return sorted(positions)
