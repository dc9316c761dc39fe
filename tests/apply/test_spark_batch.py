"""A batch applied with its rows on the executors leaves the table the driver's journey leaves.

Two tables take the same three random batches with delta-spark: one through the driver's journey
(``apply_parts``), one through ``apply_on_executors`` (reduce, stored rows, remembered deletes,
plan, MERGE source and the deletes to remember, all on Spark). The first batch creates the table,
the second meets its rows (and redelivers the first batch's changes, so remembered deletes bury
some), the third brings only new keys (appended, not merged). After each batch both tables, their
remembered deletes, their audit counts and their recorded offsets must be the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from ingest.apply.delta_spark import DeltaSparkEngine
from ingest.apply.microbatch import MicroBatch
from ingest.apply.pipeline import apply_parts
from ingest.apply.spark_batch import apply_on_executors
from ingest.apply.tablestate import load_state
from ingest.audit import AuditRecord
from ingest.config import TableSpec
from ingest.deltaio import open_table, read_all
from ingest.spark import arrow_frame
from tests.apply.test_spark_reduce import random_parts
from tests.harness import paths_in

pytestmark = pytest.mark.spark
COUNTS = ("inserted", "updated", "deleted", "stale", "superseded", "truncates", "toast_unknown")


def _table(path: Any, drop: tuple[str, ...] = ("_cdc_ingested_at",)) -> list[dict[str, Any]]:
    table = open_table(path)
    if table is None:
        return []
    rows = read_all(table)
    rows = rows.select([n for n in rows.column_names if n not in drop])
    return sorted(rows.to_pylist(), key=lambda r: r["id"])


@pytest.mark.parametrize(("mode", "nulls"), [("soft", False), ("hard", False), ("hard", True)],
                         ids=["soft", "hard", "hard-ignore-null-updates"])
def test_the_executors_leave_the_table_the_driver_leaves(tmp_path: Any, spark: Any, mode: str, nulls: bool) -> None:
    spec = TableSpec(name="t", topic="t", delete_mode=mode, ignore_null_updates=nulls)  # type: ignore[arg-type]
    engine = DeltaSparkEngine(spark)
    on_driver, on_executors = paths_in(tmp_path / "driver"), paths_in(tmp_path / "executors")
    batches = [random_parts(7, keys=24, truncates=False),
               random_parts(8, keys=20, first_key=12, first_offset=10_000)
               + random_parts(7, keys=24, truncates=False, offsets_from=20_000),
               random_parts(9, keys=10, first_key=100, first_offset=30_000, truncates=False)]
    for i, parts in enumerate(batches):
        expected = apply_parts(spec, on_driver, parts, batch_id=i, run_id="test", engine=engine).record
        assert expected is not None and expected.balanced
        state = load_state(on_executors.table)
        batch = MicroBatch.from_parts(parts, state)
        record = AuditRecord(table="t", run_id="test", batch_id=i, received=batch.received)
        outcome = apply_on_executors(spec, on_executors, arrow_frame(spark, batch.changes), batch.columns,
                                     state=state, engine=engine, record=record, flattened=batch.flattened,
                                     offsets={tp: span[1] for tp, span in batch.offsets.items()},
                                     declared=batch.key_columns(), shares=3)
        assert outcome.committed
        assert {c: getattr(record, c) for c in COUNTS} == {c: getattr(expected, c) for c in COUNTS}, f"batch {i}"
        assert _table(on_executors.table) == _table(on_driver.table), f"batch {i}"
        assert load_state(on_executors.table).offsets == load_state(on_driver.table).offsets
        if mode == "hard":
            drop = ("_cdc_recorded_at",)
            assert _table(on_executors.tombstones, drop) == _table(on_driver.tombstones, drop), f"batch {i}"
    last = open_table(on_executors.table)
    assert last is not None and last.history(1)[0]["operation"] == "WRITE"  # the new keys were appended
    assert len(_table(on_driver.table)) > 24  # every batch left rows
