"""The merge plan on Spark's executors, by shares of the key's hash, gives exactly the driver's plan.

A table holds rows from a first batch (inserts, updates, deletes; in hard mode remembered deletes).
A second random batch -- new and held keys, deletes, re-inserts, TOAST placeholders, duplicates,
a truncate now and then -- is planned both ways: the driver's ``reduce_changes`` + ``stored_rows``
+ ``plan_merge`` against ``reduce_on_executors`` + ``stored_on_executors`` + ``plan_on_executors``.
Their counts, classified rows and MERGE source must be the same.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from ingest.apply.batch import MicroBatch
from ingest.apply.journey import apply_parts
from ingest.apply.placement.executors.merge_plan import SparkPlan, plan_on_executors, stored_on_executors
from ingest.apply.placement.executors.reduction import reduce_on_executors
from ingest.apply.stored import stored_rows
from ingest.columns import normalize
from ingest.commit.remembered import RememberedDeletes
from ingest.commit.state import load_state
from ingest.config import TableSpec
from ingest.lake.delta import open_table
from ingest.lake.location import LakePath
from ingest.rules.ordering import later_than_stored
from ingest.rules.plan import MergePlan, plan_merge
from ingest.rules.reduce import reduce_changes
from ingest.spark.session import arrow_frame
from tests.apply.test_spark_reduce import random_parts
from tests.harness import paths_in

pytestmark = pytest.mark.spark


def _rows(table: pa.Table, like: pa.Schema, drop: tuple[str, ...]) -> list[dict[str, Any]]:
    names = [n for n in like.names if n not in drop]
    rows = normalize(table).select(names).cast(pa.schema([like.field(n) for n in names])).to_pylist()
    return sorted(rows, key=lambda r: (r["id"], r["_cdc_position"]))


def _same(driver: MergePlan, got: SparkPlan) -> None:
    assert got.counts == driver.counts
    assert _rows(got.rows.toArrow(), driver.rows.schema, ("_cdc_ord",)) == _rows(
        driver.rows, driver.rows.schema, ("_cdc_ord",))
    source = got.source.toArrow()
    assert source.column_names == driver.source.column_names  # the same TOAST flags, in the same order
    assert _rows(source, driver.source.schema, ("_cdc_ingested_at",)) == _rows(
        driver.source, driver.source.schema, ("_cdc_ingested_at",))
    assert len(set(source["_cdc_ingested_at"].to_pylist())) <= 1  # the batch's one ingestion time
    assert _rows(got.deletes.toArrow(), driver.deletes.schema, ()) == _rows(driver.deletes, driver.deletes.schema, ())


@pytest.mark.parametrize("mode", ["soft", "hard"])
@pytest.mark.parametrize("seed", range(3))
def test_executors_plan_as_the_driver_does(tmp_path: Any, spark: Any, seed: int, mode: str) -> None:
    """Seed 0 sends no truncate in the second batch (its changes meet the stored rows), the others may.
    The second batch also delivers the first batch's changes again, and its own changes leave the
    first keys alone: in hard mode, a key the first batch deleted then meets its remembered delete."""
    spec = TableSpec(name="t", topic="t", delete_mode=mode)  # type: ignore[arg-type]
    paths = paths_in(tmp_path)
    first = apply_parts(spec, paths, random_parts(1000 + seed, keys=24, truncates=False), batch_id=0,
                        run_id="test").record
    assert first is not None and first.balanced
    state = load_state(paths.table)
    again = random_parts(1000 + seed, keys=24, truncates=False, offsets_from=20_000)
    news = random_parts(seed, keys=20, first_key=12, first_offset=10_000, truncates=seed > 0)
    batch = MicroBatch.from_parts(news + again, state)
    key, soft, hard = ("id",), mode == "soft", mode == "hard"
    table = open_table(paths.table)
    new_truncate = None
    driver_red = reduce_changes(batch.changes, key, batch.columns, soft=soft)
    if driver_red.truncate is not None and (state.truncate_position is None or later_than_stored(
            driver_red.truncate.position, state.truncate_position)):
        new_truncate = driver_red.truncate.position
    keys = pa.concat_tables([t.select(list(key)) for t in (driver_red.winners, driver_red.truncated) if t is not None])
    remembered = RememberedDeletes(paths.tombstones, "t")
    tombs = remembered.read(key, {"id": "long"}, keys) if hard else None
    driver = plan_merge(driver_red, key_columns=key, columns=batch.columns, stored=stored_rows(table, key, keys),
                        tombstones=tombs, old_truncate=state.truncate_position, new_truncate=new_truncate, hard=hard)
    counts = driver.counts
    assert counts.inserted and (counts.updated or new_truncate) and (counts.deleted or counts.stale)  # worth it

    reduced = reduce_on_executors(arrow_frame(spark, batch.changes), key, batch.columns, soft=soft, shares=3)
    stored = stored_on_executors(spark, LakePath.of(paths.table), table, key, reduced.tagged)
    got = plan_on_executors(reduced, key_columns=key, columns=batch.columns, stored=stored,
                            tombstones=arrow_frame(spark, tombs) if tombs is not None else None,
                            old_truncate=state.truncate_position, new_truncate=new_truncate, hard=hard, shares=3)
    try:
        _same(driver, got)
    finally:
        got.release()
        reduced.release()
