"""The driver placement: a batch's change rows as Arrow tables in this process, each rule run once.

The stored rows of the batch's keys (and their remembered deletes) are read through the writer's
:class:`~ingest.apply.stored.KeyLookup`: delta-rs on the driver, or -- delta-spark, a large table --
a Spark job that sends back only the rows found. Everything else is Arrow compute and DuckDB over
the batch's tables (:mod:`ingest.rules`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from ingest.apply.batch import BatchFacts, Held, MicroBatch, facts_of
from ingest.apply.placement import CurrentPlan, Reduced, VersionsPlan, Withdrawn
from ingest.apply.stored import stored_rows
from ingest.columns import arrow_type
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import TableState
from ingest.commit.writer import ArrowRows, Writer
from ingest.config import TableSpec
from ingest.lake.delta import table_schema
from ingest.lake.location import LakePath
from ingest.lake.lookup import KeyLookup, rows_of_keys
from ingest.model import ColumnSpec
from ingest.rules.history import plan_history
from ingest.rules.moved import COORDINATES, moved_mask
from ingest.rules.plan import PlanCounts, merge_source, plan_merge
from ingest.rules.reduce import Reduction, TruncateMark, nulls_as_unchanged, reduce_changes
from ingest.rules.sql import connect, ident, query
from ingest.rules.withdraw import withdraw

if TYPE_CHECKING:
    from ingest.quality.gate import QualityGate
    from ingest.quality.verdict import QualityReport


class DriverPlacement:
    """A table's batch on the driver (see module docstring).

    Args:
        writer: the table's writer, whose look-up reads the stored rows of a batch's keys
            (:meth:`ingest.commit.writer.Writer.lookup`; default: delta-rs, on the driver).
        path: the target table.
    """

    name: Literal["driver"] = "driver"

    def __init__(self, writer: Writer | None = None, path: LakePath | None = None) -> None:
        self.writer = writer
        self.lookup: KeyLookup = writer.lookup(path) if writer is not None and path is not None else rows_of_keys

    def _lookup_of(self, path: LakePath) -> KeyLookup:
        return self.writer.lookup(path) if self.writer is not None else rows_of_keys

    def assemble(self, decoded: Sequence[pa.RecordBatch], state: TableState, spec: TableSpec,
                 key_columns: tuple[str, ...]) -> MicroBatch[pa.Table]:
        return MicroBatch.from_parts(decoded, state, table=spec.name, select=spec.columns, key_columns=key_columns)

    def facts(self, changes: pa.Table) -> BatchFacts:
        return facts_of(changes)

    def take_foreign_keys(self, changes: pa.Table, key_columns: tuple[str, ...]) -> tuple[pa.Table, pa.Table]:
        if changes.num_rows == 0:
            return changes, changes
        foreign = pc.fill_null(pc.and_(pc.not_equal(changes["_cdc_op"], "t"),
                                       pc.not_equal(changes["_cdc_key_columns"], json.dumps(list(key_columns)))),
                               False)
        if not pc.any(foreign).as_py():
            return changes, changes.slice(0, 0)
        return changes.filter(pc.invert(foreign)), changes.filter(foreign)

    def rows_of_keys(self, changes: pa.Table, keys: pa.Table, columns: list[str]) -> pa.Table:
        rows = changes.filter(pc.not_equal(changes["_cdc_op"], "t")).select(columns)
        key_columns = [k for k in keys.column_names]
        con = connect(rows=rows, wanted=keys.cast(pa.schema([rows.schema.field(k) for k in key_columns])))
        try:
            match = " AND ".join(f"r.{ident(k)} = w.{ident(k)}" for k in key_columns)
            return query(con, f"SELECT r.* FROM rows r WHERE EXISTS (SELECT 1 FROM wanted w WHERE {match})"
                         ).cast(rows.schema)
        finally:
            con.close()

    def layout(self, changes: pa.Table) -> pa.Schema:
        return changes.schema

    def with_rows(self, changes: pa.Table, rows: pa.Table) -> pa.Table:
        return pa.concat_tables([changes, rows.cast(changes.schema)]) if rows.num_rows else changes

    def moved(self, changes: pa.Table) -> pa.Table:
        return changes.filter(moved_mask(changes))

    def incremental_keys(self, changes: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
        reads = pc.and_(pc.equal(changes["_cdc_op"], "r"), pc.equal(changes["_cdc_snapshot"], "incremental"))
        found = changes.filter(pc.fill_null(reads, False)).select(list(key_columns))
        return found.group_by(list(key_columns)).aggregate([]) if found.num_rows else found

    def replaced(self, changes: pa.Table, rows: pa.Table) -> pa.Table:
        if not rows.num_rows:
            return changes
        theirs = set(zip(*(rows[c].to_pylist() for c in COORDINATES), strict=True))
        keep = pa.array([c not in theirs for c in zip(*(changes[c].to_pylist() for c in COORDINATES), strict=True)])
        return pa.concat_tables([changes.filter(keep), rows.cast(changes.schema)])

    def with_key_columns(self, changes: pa.Table, key_columns: tuple[str, ...],
                         types: dict[str, pa.DataType]) -> pa.Table:
        for k in key_columns:
            if k not in changes.column_names:
                changes = changes.append_column(pa.field(k, types[k]), pa.nulls(changes.num_rows, types[k]))
        return changes

    def typed_nulls(self, changes: pa.Table, columns: list[ColumnSpec]) -> pa.Table:
        """Columns null in every schemaless message of the batch, in the type the table gives them."""
        final = {c.name: c.type for c in columns}
        for i, f in enumerate(changes.schema):
            if pa.types.is_null(f.type) and f.name in final:
                changes = changes.set_column(i, f.name, changes.column(i).cast(arrow_type(final[f.name])))
        return changes

    def nulls_as_unchanged(self, changes: pa.Table, key_columns: tuple[str, ...],
                           columns: list[ColumnSpec]) -> pa.Table:
        return nulls_as_unchanged(changes, key_columns, columns)

    def reduce(self, changes: pa.Table, key_columns: tuple[str, ...], columns: list[ColumnSpec], *,
               soft: bool) -> Reduction:
        if not key_columns:  # only truncates (or nothing): there is no key to reduce by
            return _truncates_only(changes)
        return reduce_changes(changes, key_columns, columns, soft=soft)

    def validate(self, gate: QualityGate, reduced: Reduced, changes: pa.Table, state: TableState,
                 key_columns: tuple[str, ...], held: Held, *, batch_id: int,
                 run_id: str) -> tuple[QualityReport, Withdrawn[pa.Table] | None]:
        assert isinstance(reduced, Reduction)
        report = gate.check(reduced.winners, state.columns, batch_id=batch_id, run_id=run_id)
        if not report.held:
            return report, None
        keys = reduced.winners.take(pa.array(sorted(report.held), pa.int64())).select(list(key_columns))
        before = len(held)
        out = withdraw(reduced, changes, report.held)
        held.add_rows(out.rows, "quality", out.reasons, out.expectations, out.row_keys)
        of_keys = self.rows_of_keys(changes, keys, list(key_columns))
        return report, Withdrawn(keys, of_keys.num_rows, len(held) - before)

    def without_keys(self, changes: pa.Table, withdrawn: Withdrawn[pa.Table]) -> pa.Table:
        key_columns = withdrawn.keys.column_names
        con = connect(c=changes, held=withdrawn.keys)
        try:
            match = " AND ".join(f"h.{ident(k)} = c.{ident(k)}" for k in key_columns)
            return query(con, f"SELECT c.* FROM c WHERE c._cdc_op = 't' OR NOT EXISTS "
                              f"(SELECT 1 FROM held h WHERE {match})").cast(changes.schema)
        finally:
            con.close()

    def plan_current(self, reduced: Reduced, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                     state: TableState, remembered: RememberedDeletes, hard: bool,
                     new_truncate: str | None) -> CurrentPlan:
        assert isinstance(reduced, Reduction)
        if not key_columns:
            return CurrentPlan(PlanCounts(), ArrowRows(empty_source(columns)))
        keys = pa.concat_tables([t.select(list(key_columns)) for t in (reduced.winners, reduced.truncated)
                                 if t is not None])
        stored = stored_rows(state.table, key_columns, keys, lookup=self.lookup)
        key_types = {c.name: c.type for c in columns if c.name in key_columns}
        tombs = remembered.read(key_columns, key_types, keys, lookup=self._lookup_of(LakePath.of(remembered.path))) \
            if hard and keys.num_rows else None
        plan = plan_merge(reduced, key_columns=key_columns, columns=columns, stored=stored, tombstones=tombs,
                          old_truncate=state.truncate_position, new_truncate=new_truncate, hard=hard)
        return CurrentPlan(plan.counts, ArrowRows(plan.source), ArrowRows(plan.deletes), stored.num_rows,
                           tombs.num_rows if tombs is not None else 0)

    def plan_versions(self, changes: pa.Table, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                      tracked: list[str] | None, state: TableState) -> VersionsPlan:
        plan = plan_history(changes, key_columns=key_columns, columns=columns, tracked=tracked,
                            watermark=state.truncate_position, truncate_log=state.truncate_log,
                            stored_of=lambda keys: stored_versions(state.table, key_columns, keys, self.lookup))
        return VersionsPlan(plan, ArrowRows(plan.source))

    def release(self) -> None:
        """Nothing is kept on the driver beyond the batch's own tables."""


def stored_versions(table: DeltaTable | None, key_columns: tuple[str, ...], keys: pa.Table,
                    lookup: KeyLookup) -> pa.Table | None:
    """Every stored version of ``keys`` (all columns; ``None``: the table stores no versions)."""
    names = {f.name for f in table_schema(table)} if table is not None else set()
    if table is None or any(k not in names for k in key_columns):
        return None
    return lookup(table, key_columns, keys)


def _truncates_only(changes: pa.Table) -> Reduction:
    marks = changes.filter(pc.equal(changes["_cdc_op"], "t")).sort_by([("_cdc_position", "descending")])
    truncate = None
    if marks.num_rows:
        top = marks.slice(0, 1).to_pylist()[0]
        truncate = TruncateMark(top["_cdc_position"], top["_cdc_partition"], top["_cdc_offset"])
    return Reduction(winners=changes.slice(0, 0), truncate=truncate, truncates=marks.num_rows,
                     superseded=max(0, marks.num_rows - 1))


def empty_source(columns: list[ColumnSpec]) -> pa.Table:
    """A MERGE source of no rows in the table's columns."""
    return merge_source(_EMPTY_LIVE, columns, [], None)


_EMPTY_LIVE = pa.schema([("_cdc_truncated", pa.bool_()), ("_cdc_op", pa.string()), ("_cdc_position", pa.string()),
                         ("_cdc_source_ts", pa.timestamp("us", tz="UTC")), ("_cdc_topic", pa.string()),
                         ("_cdc_partition", pa.int32()), ("_cdc_offset", pa.int64()),
                         ("_cdc_unknown_columns", pa.list_(pa.string()))]).empty_table()
