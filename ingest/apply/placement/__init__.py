"""Where a table's batch is worked on: on the driver with Arrow, or on Spark's executors.

The journey (:mod:`ingest.apply.journey`) runs the same steps in the same order for every table;
a :class:`Placement` does the steps that touch the batch's change rows, wherever those rows are:

* :class:`~ingest.apply.placement.driver.DriverPlacement`: the rows are an Arrow table in this
  process, and each per-key rule (:mod:`ingest.rules`) runs once over the whole batch;
* :class:`~ingest.apply.placement.executors.ExecutorsPlacement`: the rows stay a Spark DataFrame,
  split by a hash of the key into shares, and each rule runs on every share in a Python worker
  (``applyInArrow``); the driver receives counts, schemas and the few rows it must quarantine.

A rule is about one key's changes (plus the batch's truncates and TOAST columns, which every share
is given), so both give the same result; the tests hold them to that. The placement of a table
comes from the configuration (``plan_on``, :meth:`ingest.config.IngestConfig.placement_of`) and is
refused there when its writer cannot write what it plans. What the placement hands on is typed:
:class:`CurrentPlan` and :class:`VersionsPlan` carry their MERGE source as
:data:`~ingest.commit.writer.Rows`, the writer's contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pyarrow as pa

from ingest.apply.batch import BatchFacts, Held, MicroBatch
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import TableState
from ingest.commit.writer import Rows
from ingest.config import PlacementName, TableSpec
from ingest.model import ColumnSpec
from ingest.rules.history import HistoryPlan
from ingest.rules.plan import PlanCounts
from ingest.rules.reduce import TruncateMark

if TYPE_CHECKING:
    from ingest.quality.gate import QualityGate
    from ingest.quality.verdict import QualityReport

R = TypeVar("R")


class Reduced(Protocol):
    """A batch reduced to one change per key (:func:`ingest.rules.reduce.reduce_changes`)."""

    truncate: TruncateMark | None
    superseded: int

    def winners_count(self) -> int:
        """How many winners there are."""
        ...


@dataclass(frozen=True, slots=True)
class Withdrawn(Generic[R]):
    """The keys whose winners the quality gate held, withdrawn with all their changes.

    Attributes:
        keys: those keys (their key columns, distinct).
        changes: the batch's changes of them (truncates aside).
        held: of those, the ones the gate quarantined (the rest stay superseded by a truncate).
    """

    keys: R
    changes: int
    held: int


@dataclass(slots=True)
class CurrentPlan:
    """A current-row (scd1) batch's plan: what it does, counted, and the MERGE's source.

    Attributes:
        source: one row per change to write (:func:`ingest.rules.plan.merge_source`).
        deletes: the deletes to remember (hard mode).
        stored_keys: winners whose key the table stores (none: the rows may be appended).
        remembered_keys: winners whose key has a remembered delete (hard mode; none: the batch's
            deletes may be appended to the remembered ones; ``None``: not counted).
    """

    counts: PlanCounts
    source: Rows
    deletes: Rows | None = None
    stored_keys: int = 0
    remembered_keys: int | None = None


@dataclass(slots=True)
class VersionsPlan:
    """A ``history_mode: scd2`` batch's plan (:func:`ingest.rules.history.plan_history`): its counts
    and truncate fields, and the MERGE's source (versions to write and to drop) wherever it is."""

    plan: HistoryPlan
    source: Rows


class Placement(Protocol[R]):
    """The steps of the journey that touch a batch's change rows (``R``: where they are).

    A placement object serves one table's batch: :meth:`release` lets go of everything it kept.
    """

    @property
    def name(self) -> PlacementName:
        """``driver`` or ``executors``."""
        ...

    def assemble(self, decoded: Any, state: TableState, spec: TableSpec,
                 key_columns: tuple[str, ...]) -> MicroBatch[R]:
        """The table's share of the decode step's output, less what ``state`` says it applied."""
        ...

    def facts(self, changes: R) -> BatchFacts:
        """Whether the changes are flattened, which keys they declare, how many are not truncates."""
        ...

    def take_foreign_keys(self, changes: R, key_columns: tuple[str, ...]) -> tuple[R, pa.Table]:
        """The changes (not truncates) whose declared key is not ``key_columns``: the rest, and those (collected)."""
        ...

    def rows_of_keys(self, changes: R, keys: pa.Table, columns: list[str]) -> pa.Table:
        """``columns`` of the changes (not truncates) whose key is among ``keys``' (collected)."""
        ...

    def layout(self, changes: R) -> pa.Schema:
        """The changes' columns in their Arrow types (the shape rows joining them take)."""
        ...

    def with_rows(self, changes: R, rows: pa.Table) -> R:
        """``changes`` and ``rows`` (in the changes' layout) together."""
        ...

    def moved(self, changes: R) -> pa.Table:
        """A move's changes (:func:`ingest.rules.moved.moved_mask`), collected."""
        ...

    def incremental_keys(self, changes: R, key_columns: tuple[str, ...]) -> pa.Table:
        """The distinct keys of the incremental snapshot reads among the changes (collected)."""
        ...

    def replaced(self, changes: R, rows: pa.Table) -> R:
        """``changes`` with the changes at ``rows``' Kafka coordinates replaced by ``rows`` (in the changes' layout)."""
        ...

    def with_key_columns(self, changes: R, key_columns: tuple[str, ...], types: dict[str, pa.DataType]) -> R:
        """The changes with every key column present (a batch of tombstones only has none), null where added."""
        ...

    def typed_nulls(self, changes: R, columns: list[ColumnSpec]) -> R:
        """Columns null in every schemaless message of the batch, in the type the table gives them."""
        ...

    def nulls_as_unchanged(self, changes: R, key_columns: tuple[str, ...], columns: list[ColumnSpec]) -> R:
        """:func:`ingest.rules.reduce.nulls_as_unchanged` of every change (``ignore_null_updates``)."""
        ...

    def reduce(self, changes: R, key_columns: tuple[str, ...], columns: list[ColumnSpec], *,
               soft: bool) -> Reduced:
        """Each key's latest change (:func:`ingest.rules.reduce.reduce_changes`)."""
        ...

    def validate(self, gate: QualityGate, reduced: Reduced, changes: R, state: TableState,
                 key_columns: tuple[str, ...], held: Held, *, batch_id: int,
                 run_id: str) -> tuple[QualityReport, Withdrawn[R] | None]:
        """Run the gate on the winners; withdraw the ones it holds, with their keys' earlier changes, into ``held``."""
        ...

    def without_keys(self, changes: R, withdrawn: Withdrawn[R]) -> R:
        """The changes less every change of the withdrawn keys (truncates stay)."""
        ...

    def plan_current(self, reduced: Reduced, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                     state: TableState, remembered: RememberedDeletes, hard: bool,
                     new_truncate: str | None) -> CurrentPlan:
        """Classify the winners against the stored rows (:func:`ingest.rules.plan.plan_merge`)."""
        ...

    def plan_versions(self, changes: R, *, key_columns: tuple[str, ...], columns: list[ColumnSpec],
                      tracked: list[str] | None, state: TableState) -> VersionsPlan:
        """Derive the touched keys' versions (:func:`ingest.rules.history.plan_history`)."""
        ...

    def release(self) -> None:
        """Let go of what the placement kept of the batch (persisted frames)."""
        ...
