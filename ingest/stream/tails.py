"""A transaction group's tables, each ending a micro-batch at one transaction boundary.

With ``source.transactions`` and a group of tables (docs/consistency.md), a micro-batch may end in
the middle of a source transaction, and each table's share may end at a different one. So each
group table that the driver plans applies its records up to the newest boundary that every table
of the group has reached (:mod:`ingest.cuts.align`), and leaves the rest out: the *tail*. The next
micro-batch reads the tail again from the source, before its own records. A tail the Delta log
does not know of (a restart forgot it) is found the same way: the records between the table's
applied offsets and the batch's first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from ingest import secrets
from ingest.commit.state import OpenTables, TableState
from ingest.config import IngestConfig, TableSpec
from ingest.cuts.align import Reach, boundary, newest_mark, tail_starts, trim
from ingest.cuts.publish import Publisher
from ingest.decode.columnar import BatchDecoder
from ingest.decode.parts import FRAME, PARTS_DDL, read_parts
from ingest.model import SourceMark
from ingest.source.sources import DecodingSource, source_for
from ingest.stream.caught_up import after_applied

log = logging.getLogger(__name__)


class Tails:
    """What one query's group tables left out of their last micro-batch (see the module)."""

    def __init__(self, config: IngestConfig, cuts: Publisher, source: DecodingSource | None) -> None:
        """``source``: the source, when it decodes as it reads (else a tail is read through Spark)."""
        self.config, self.cuts, self.source = config, cuts, source
        #: available_now runs: where each topic ended when the run began (its last batch leaves no tail)
        self.final_ends: dict[str, dict[int, int]] | None = None
        #: per group topic and partition, the end of the tail the last batch left out
        self._ends: dict[str, dict[int, int]] = {}
        self._warned: set[str] = set()

    def aligned(self, group: list[TableSpec], opened: Mapping[str, OpenTables], frame: DataFrame | None,
                parts: list[Any], decoder: BatchDecoder, stop: Callable[[TableSpec, BaseException], None]
                ) -> list[Any]:
        """The micro-batch's parts with each table of ``group`` ending at one transaction boundary: the
        tail the last batch left out read again, this batch's tail left out.

        Args:
            opened: the tables' Delta handles (their applied offsets and source marks).
            decoder: decodes a tail read again.
            stop: stops a table whose tail cannot be read (the others go on).
        """
        try:
            transactions = self.cuts.transactions()
        except Exception as exc:  # no order to align to: the tables apply what they read (the publisher says why)
            self._warn("align", f"tables not aligned to transactions: {secrets.describe(exc)}")
            return parts
        group = list(group)
        topics = {s.topic for s in group}
        by_topic: dict[str, list[Any]] = {t: [] for t in topics}
        others: list[Any] = []
        for part in parts:
            topic = part.column("_cdc_topic")[0].as_py() if part.num_rows else None
            (by_topic[topic] if topic in topics else others).append(part)
        reaches: dict[str, Reach] = {}
        rows: dict[str, pa.Table] = {}
        stored: dict[str, SourceMark] = {}
        for spec in list(group):
            state = opened[spec.name].state()
            try:
                again = self._again(spec, state, frame, by_topic[spec.topic], decoder)
            except Exception as exc:
                # Without its tail, the table's records would leave a hole in its offsets: it stops
                # (a transient error is tried again, catching up from its Delta log), the others go on.
                stop(spec, exc)
                by_topic[spec.topic] = []
                group.remove(spec)
                continue
            by_topic[spec.topic] = again + by_topic[spec.topic]
            stored[spec.name] = state.mark
            rows[spec.name] = _frame_rows(by_topic[spec.topic])
            reaches[spec.name] = Reach(self.cuts.collection(spec), state.mark,
                                       newest_mark(rows[spec.name], state.mark))
        reach = boundary(transactions, reaches)
        # A tail grows while another table of the group lags (each is read up to its own bound): up to a
        # micro-batch of it is read again, beyond that the table goes on without waiting.
        bound = self.config.source.max_records_per_batch
        for spec in group:
            starts = tail_starts(rows[spec.name], stored[spec.name], transactions, reach)
            final = (self.final_ends or {}).get(spec.topic)
            if final is not None:  # an available_now run's last batch of a partition: nothing reads it again
                ends = _ends(rows[spec.name])
                starts = {p: o for p, o in starts.items() if ends.get(p, 0) < final.get(p, 0)}
            kept, left_out = trim(by_topic[spec.topic], starts)
            if left_out > bound:
                self._warn(spec.name, f"table {spec.name}: a transaction larger than a micro-batch ({left_out} "
                                      f"records) is applied in parts; the next cut waits for its last part")
                continue
            by_topic[spec.topic] = kept
            if starts:
                self._ends[spec.topic] = _ends(rows[spec.name])
            else:
                self._ends.pop(spec.topic, None)
        return others + [p for t in sorted(topics) for p in by_topic[t]]

    def _again(self, spec: TableSpec, state: TableState, frame: DataFrame | None, mine: list[Any],
               decoder: BatchDecoder) -> list[Any]:
        """The records between the table's Delta offsets and this batch's first: the tail the last batch
        left out (or one a restart forgot), read from the source again and decoded."""
        upto = {**self._ends.get(spec.topic, {}), **_offsets(_frame_rows(mine), "min")}
        start = {p: after_applied(state.applied_offset(spec.topic, p)) for p in upto}
        gap_end = {p: o for p, o in upto.items() if o > start[p]}
        if not gap_end:
            return []
        floor = source_for(self.config).start_offsets(spec.topic)  # what retention has kept
        lo = {p: max(start[p], floor.get(p, 0)) for p in gap_end}
        if self.source is not None:
            return list(decoder.decode(self.source.read_arrow(spec.topic, lo, gap_end)))
        assert frame is not None, "a tail is read through Spark only within a micro-batch"
        gap = source_for(self.config).read_range(frame.sparkSession, spec.topic, lo, gap_end)
        return read_parts(gap.mapInArrow(decoder, PARTS_DDL).toArrow().column("part").to_pylist())

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", text)


def _frame_rows(parts: list[Any]) -> pa.Table:
    """The framework columns the alignment reads, of every row of ``parts``."""
    names = ["_cdc_partition", "_cdc_offset", "_cdc_position", "_cdc_txn", "_cdc_txn_order"]
    tables = [pa.Table.from_batches([part]).select(names) for part in parts if part.num_rows]
    return pa.concat_tables(tables) if tables else pa.table({n: pa.array([], FRAME.field(n).type) for n in names})


def _ends(rows: pa.Table) -> dict[int, int]:
    """Per partition, the offset after the last of ``rows``."""
    return {p: o + 1 for p, o in _offsets(rows, "max").items()}


def _offsets(rows: pa.Table, how: str) -> dict[int, int]:
    """Per partition, the first (``how``: ``min``) or last (``max``) offset of ``rows``."""
    if not rows.num_rows:
        return {}
    grouped = pa.table({"p": rows["_cdc_partition"], "o": rows["_cdc_offset"]}).group_by(
        "p", use_threads=False).aggregate([("o", how)])
    return dict(zip(grouped["p"].to_pylist(), grouped[f"o_{how}"].to_pylist(), strict=True))
