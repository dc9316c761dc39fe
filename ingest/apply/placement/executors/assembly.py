"""One table's micro-batch assembled on Spark's executors: :class:`~ingest.apply.batch.MicroBatch`
with its change rows left in Spark.

The decode step leaves a DataFrame of parts (one Arrow IPC stream per row, :data:`~ingest.decode.parts.PARTS_DDL`).
The driver's :meth:`MicroBatch.from_parts <ingest.apply.batch.MicroBatch.from_parts>` reads them all.
Here:

1. one small job brings back what the driver needs to know of the table's parts: their kinds,
   schemas (with the columns they declare), Kafka partitions and the primary-key columns their
   changes name, and the parts that hold no changes (tombstones, controls, undecodable messages)
   whole; the driver combines the columns and reads the table's applied offsets for those
   partitions;
2. the executors turn the table's change parts into rows of the combined columns (the same
   ``with_source_names``, ``unify_parts`` as the driver), each marked as already applied or not;
3. one aggregate over those rows gives the counts and offset spans; the parts collected in step 1
   -- few, and quarantined or counted on the driver -- are the only rows the driver holds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ingest.apply.batch import (
    MicroBatch,
    add_spans,
    combine_columns,
    concat_frames,
    declared_columns,
    part_key_columns,
    refuse_unavailable,
    unify_parts,
    with_source_names,
)
from ingest.commit.state import TableState
from ingest.config import ColumnSelection
from ingest.decode.parts import FRAME, part_kind, read_parts

#: Marks a change row the table has already applied (dropped before the reduce, counted).
_DONE = "_cdc_done"
#: What the driver learns of each of the table's parts in one job: its kind, schema, Kafka partitions
#: and the key columns its changes name; and, unless it holds changes, the part itself.
_SUMMARY = pa.schema([("kind", pa.string()), ("schema", pa.binary()), ("partitions", pa.list_(pa.int32())),
                      ("keys", pa.list_(pa.string())), ("part", pa.binary())])


def _parts_of(blobs: pa.Array) -> Iterator[pa.RecordBatch]:
    for blob in blobs.to_pylist():
        yield from read_parts([blob])


def assemble_on_executors(decoded: DataFrame, topic: str, state: TableState, *, table: str = "",
                          select: ColumnSelection | None = None,
                          key_columns: tuple[str, ...] = ()) -> MicroBatch[DataFrame]:
    """The ``topic``'s share of ``decoded`` as :meth:`MicroBatch.from_parts
    <ingest.apply.batch.MicroBatch.from_parts>` would assemble it (see module docstring).

    Raises:
        TableError, RegistryUnavailableError, SchemaIncompatibleError: as ``from_parts`` does.
    """

    def summarize(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out: dict[str, list[object]] = {name: [] for name in _SUMMARY.names}
        for batch in batches:
            for blob in batch.column(0).to_pylist():
                for i, part in enumerate(read_parts([blob])):
                    if part.num_rows == 0 or part.column("_cdc_topic")[0].as_py() != topic:
                        continue
                    kind = part_kind(part.schema)
                    out["kind"].append(kind)
                    out["schema"].append(part.schema.serialize().to_pybytes())
                    out["partitions"].append(pc.unique(part.column("_cdc_partition")).to_pylist())
                    changes = kind == "changes"
                    out["keys"].append(part_key_columns(pa.Table.from_batches([part])) if changes else [])
                    # tombstones and metadata are few: the blob comes back whole, once
                    out["part"].append(blob if i == 0 and not changes else None)
        yield pa.RecordBatch.from_pydict(out, schema=_SUMMARY)

    summary = decoded.mapInArrow(summarize, from_arrow_schema(_SUMMARY)).toArrow().to_pylist()
    partitions = sorted({p for s in summary for p in s["partitions"]})
    applied = {p: state.applied_offset(topic, p) for p in partitions}
    known = pa.array(list(applied), pa.int32())
    limits = pa.array(list(applied.values()), pa.int64())
    declared = []
    for s in summary:
        if s["kind"] != "changes":
            continue
        named = with_source_names(pa.ipc.read_schema(pa.py_buffer(s["schema"])).empty_table(), table_name=table)
        columns = declared_columns(named)
        if select is not None:
            keys = {*key_columns, *(state.key_columns or ()), *s["keys"]}
            columns = [c for c in columns if select.keeps(c.name, keys)]
        declared.append(columns)
    columns = combine_columns(declared)
    shape = unify_parts([], columns).schema
    out_schema = shape.append(pa.field(_DONE, pa.bool_()))

    def done(rows: pa.Table) -> pa.Array:
        """Whether each row's offset is one its partition has applied already (``_not_applied``'s rule)."""
        at = pc.index_in(rows["_cdc_partition"], value_set=known)
        return pc.fill_null(pc.less_equal(rows["_cdc_offset"], pc.take(limits, at)), False)

    def unify(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part in _parts_of(batch.column(0)):
                if part.num_rows == 0 or part_kind(part.schema) != "changes" or \
                        part.column("_cdc_topic")[0].as_py() != topic:
                    continue
                named = with_source_names(pa.Table.from_batches([part]), table_name=table)
                rows = unify_parts([named], columns)
                yield from rows.append_column(_DONE, done(rows)).to_batches()

    rows = decoded.mapInArrow(unify, from_arrow_schema(out_schema, prefer_timestamp_ntz=True)).persist()
    counted = rows.groupBy("_cdc_topic", "_cdc_partition").agg(
        F.count(F.when(F.col(_DONE), True)).alias("done"), F.count(F.when(~F.col(_DONE), True)).alias("kept"),
        F.min(F.when(~F.col(_DONE), F.col("_cdc_offset"))).alias("lo"),
        F.max(F.when(~F.col(_DONE), F.col("_cdc_offset"))).alias("hi")).toArrow().to_pylist()
    already = sum(c["done"] for c in counted)
    received = sum(c["kept"] for c in counted)
    offsets = {(c["_cdc_topic"], c["_cdc_partition"]): [c["lo"], c["hi"]] for c in counted if c["kept"]}

    tombstones, meta = [], []
    for part in read_parts([s["part"] for s in summary if s["part"] is not None]):
        named = with_source_names(pa.Table.from_batches([part]), table_name=table)
        kept = named.filter(pc.invert(done(named))) if part.num_rows else named
        already += named.num_rows - kept.num_rows
        received += kept.num_rows
        if kept.num_rows:
            add_spans(kept, offsets)
        if kept.num_rows == 0:
            continue
        if part_kind(part.schema) == "tombstones":
            tombstones.append(kept)
        else:
            meta.append(kept.select(list(FRAME.names)))
    refuse_unavailable(meta)
    return MicroBatch(changes=rows.where(~F.col(_DONE)).drop(_DONE), tombstones=concat_frames(tombstones),
                      meta=pa.concat_tables(meta) if meta else FRAME.empty_table(), columns=columns,
                      received=received, already_applied=already, offsets=offsets, release=rows.unpersist)

