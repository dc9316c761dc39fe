"""Key shares: how the executors placement splits a batch so that each share holds whole keys.

Every change, stored row and remembered delete of a key lands in the same share (a hash of its key
columns, cast to the same types: the hash depends on them), so a per-key rule can run on each share
alone. Beside a share's rows, the driver needs the first key column's least and greatest value of
a MERGE source (the bounds that let Delta skip files), read with one aggregate.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from ingest.spark.sql import ident

#: The column that tells a share's winners from its truncated rows (soft mode) in the one frame
#: a share returns.
SIDE: Final = "_cdc_side"


def share_of(key_columns: tuple[str, ...], shares: int) -> Column:
    """The share a row falls in by its key: every change, stored row and remembered delete of a
    key lands in the same one, its key columns being of the same types (the hash depends on them)."""
    return F.pmod(F.hash(*(F.col(ident(k)) for k in key_columns)), F.lit(shares))


def bound_aggregates(column: str, where: Column) -> list[Column]:
    """The least and greatest value of ``column`` among the rows ``where`` holds, as two aggregates
    (``_lo``, ``_hi``) to add to a count's, read back by :func:`bounds_of`."""
    return [F.min(F.when(where, F.col(ident(column)))).alias("_lo"),
            F.max(F.when(where, F.col(ident(column)))).alias("_hi")]


def bounds_of(found: pa.Table, column: str) -> pa.Table:
    """The two rows of a MERGE source's first-key bounds (:class:`~ingest.commit.merge_sql.FrameSource`)
    from an aggregate with :func:`bound_aggregates`."""
    return pa.table({column: pa.concat_arrays([found["_lo"].combine_chunks(), found["_hi"].combine_chunks()])})
