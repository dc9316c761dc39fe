"""The reduce on Spark's executors, by shares of the key's hash, gives exactly the driver's reduce.

The driver's ``reduce_changes`` is the reference: random batches -- updates, deletes and re-inserts
of a few keys, exact duplicates delivered on other partitions, truncates, unchanged-TOAST
placeholders -- reduced both ways, in both delete modes, must have the same winners (every column),
the same truncated rows, the same latest truncate and the same counts.
"""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from ingest.apply.batch import MicroBatch
from ingest.apply.placement.executors.reduction import SparkReduction, reduce_on_executors
from ingest.columns import normalize
from ingest.commit.state import TableState
from ingest.model import UNAVAILABLE, ChangeEvent
from ingest.rules.reduce import Reduction, nulls_as_unchanged, reduce_changes
from ingest.spark.session import arrow_frame
from tests.factories import change, decoded_rows

pytestmark = pytest.mark.spark
NOTHING_APPLIED = TableState(None, None, None, None)


def random_parts(seed: int, *, events: int = 60, keys: int = 16, first_offset: int = 0,
                 truncates: bool = True, offsets_from: int | None = None, first_key: int = 0) -> list[pa.RecordBatch]:
    """The decode step's parts of a random batch of ``events`` changes of ``keys`` keys (from
    ``first_key``): inserts,
    snapshot reads, updates (some with an unchanged-TOAST placeholder) and deletes, a truncate now
    and then in the first half, exact duplicates on other partitions, delivered out of order.
    Positions and Kafka offsets start at ``first_offset``; ``offsets_from`` moves the offsets alone
    (the same changes delivered again later)."""
    rng = random.Random(seed)
    items: list[tuple[ChangeEvent, int]] = []
    for at in range(1, events + 1):
        roll = rng.random()
        if truncates and roll < 0.05 and at < events // 2:  # truncates in the first half: later changes survive them
            event = change("t", 0, first_offset + at)
        else:
            op = rng.choice(["c", "u", "u", "u", "d", "r"])
            toast = op in ("u", "c") and rng.random() < 0.4
            event = change(op, first_key + rng.randrange(keys), first_offset + at, name=f"n{at}",
                           notes=f"long {at}" if rng.random() < 0.7 else None,
                           unavailable=frozenset({"notes"}) if toast else frozenset())
            if toast:
                event.after["notes"] = UNAVAILABLE  # type: ignore[index]
        items.append((event, rng.randrange(3)))
        if rng.random() < 0.1:  # an exact duplicate, delivered again on another partition
            items.append((event, rng.randrange(3)))
    rng.shuffle(items)  # delivered out of order
    parts = []
    for offset, (event, partition) in enumerate(items):
        start = first_offset if offsets_from is None else offsets_from
        parts += decoded_rows([event], partition=partition, first_offset=start + offset)
    return parts


def _batch(seed: int) -> MicroBatch:
    return MicroBatch.from_parts(random_parts(seed), NOTHING_APPLIED)


def driver_reduction(reduction: SparkReduction) -> Reduction:
    """``reduction`` with its rows on the driver, to compare."""
    truncated = normalize(reduction.truncated.toArrow()) if reduction.truncated is not None else None
    return Reduction(winners=normalize(reduction.winners.toArrow()), toast_columns=reduction.toast_columns,
                     truncate=reduction.truncate, truncates=reduction.truncates, superseded=reduction.superseded,
                     truncated=truncated)


def _rows(table: pa.Table | None, like: pa.Schema) -> list[dict[str, Any]]:
    if table is None:
        return []
    names = [n for n in like.names if n != "_cdc_ord"]
    rows = table.select(names).cast(pa.schema([like.field(n) for n in names])).to_pylist()
    return sorted(rows, key=lambda r: (r["id"], r["_cdc_position"]))


def _same(driver: Reduction, spark: Reduction) -> None:
    assert _rows(spark.winners, driver.winners.schema) == _rows(driver.winners, driver.winners.schema)
    if driver.truncated is None or spark.truncated is None:
        assert (driver.truncated is None or driver.truncated.num_rows == 0) and (
            spark.truncated is None or spark.truncated.num_rows == 0)
    else:
        assert _rows(spark.truncated, driver.truncated.schema) == _rows(driver.truncated, driver.truncated.schema)
    assert spark.toast_columns == driver.toast_columns
    assert spark.truncate == driver.truncate
    assert (spark.truncates, spark.superseded) == (driver.truncates, driver.superseded)


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("seed", range(4))
def test_executors_reduce_as_the_driver_does(spark: Any, seed: int, soft: bool) -> None:
    batch = _batch(seed)
    driver = reduce_changes(batch.changes, ("id",), batch.columns, soft=soft)
    assert driver.winners.num_rows > 1 and driver.superseded > 0  # the batch is worth comparing
    reduced = reduce_on_executors(arrow_frame(spark, batch.changes), ("id",), batch.columns, soft=soft, shares=3)
    try:
        _same(driver, driver_reduction(reduced))
    finally:
        reduced.release()


def nulls_on_executors(spark: Any, batch: MicroBatch[pa.Table]) -> Any:
    """The batch's changes as a DataFrame, ``ignore_null_updates`` applied as the executors placement applies it."""
    from ingest.apply.placement.executors import ExecutorsPlacement

    return ExecutorsPlacement(spark, None).nulls_as_unchanged(  # type: ignore[arg-type]
        arrow_frame(spark, batch.changes), ("id",), batch.columns)


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("seed", [11, 12])
def test_executors_take_null_updates_as_unchanged_as_the_driver_does(spark: Any, seed: int, soft: bool) -> None:
    batch = _batch(seed)
    changes = nulls_as_unchanged(batch.changes, ("id",), batch.columns)
    driver = reduce_changes(changes, ("id",), batch.columns, soft=soft)
    plain = reduce_changes(batch.changes, ("id",), batch.columns, soft=soft)
    like = driver.winners.schema
    assert _rows(plain.winners, like) != _rows(driver.winners, like)  # the rule changes this batch's winners
    reduced = reduce_on_executors(nulls_on_executors(spark, batch), ("id",), batch.columns, soft=soft, shares=3)
    try:
        _same(driver, driver_reduction(reduced))
    finally:
        reduced.release()


def test_a_batch_whose_truncate_supersedes_every_change(spark: Any) -> None:
    parts = decoded_rows([change("c", 1, 10, name="gone"), change("u", 2, 11), change("t", 0, 20)])
    batch = MicroBatch.from_parts(parts, NOTHING_APPLIED)
    for soft in (False, True):
        driver = reduce_changes(batch.changes, ("id",), batch.columns, soft=soft)
        reduced = reduce_on_executors(arrow_frame(spark, batch.changes), ("id",), batch.columns, soft=soft, shares=2)
        try:
            got = driver_reduction(reduced)
            _same(driver, got)
            assert got.winners.num_rows == 0 and got.superseded == 2
            assert soft == (got.truncated is not None and sorted(got.truncated["id"].to_pylist()) == [1, 2])
        finally:
            reduced.release()


def test_shares_without_a_toast_placeholder_still_fill_like_the_batch(spark: Any) -> None:
    first = change("c", 1, 10, notes="long text")
    second = change("u", 1, 20, name="y", notes=None, unavailable=frozenset({"notes"}))
    second.after["notes"] = UNAVAILABLE  # type: ignore[index]
    others = [change("u", k, 30 + k) for k in range(2, 12)]  # keys in every share, none with a placeholder
    batch = MicroBatch.from_parts(decoded_rows([first, second, *others]), NOTHING_APPLIED)
    driver = reduce_changes(batch.changes, ("id",), batch.columns)
    reduced = reduce_on_executors(arrow_frame(spark, batch.changes), ("id",), batch.columns, shares=4)
    try:
        got = driver_reduction(reduced)
        _same(driver, got)
        assert got.toast_columns == ["notes"] and "_cdc_fill_0" in got.winners.column_names
    finally:
        reduced.release()


def test_null_updates_fill_in_every_share_like_the_batch(spark: Any) -> None:
    first = change("c", 1, 10, notes="long text")
    second = change("u", 1, 20, name="y", notes=None)  # ignore_null_updates: notes did not change
    others = [change("u", k, 30 + k, notes="set") for k in range(2, 12)]  # no null in the other shares
    batch = MicroBatch.from_parts(decoded_rows([first, second, *others]), NOTHING_APPLIED)
    driver = reduce_changes(nulls_as_unchanged(batch.changes, ("id",), batch.columns), ("id",), batch.columns)
    reduced = reduce_on_executors(nulls_on_executors(spark, batch), ("id",), batch.columns, shares=4)
    try:
        got = driver_reduction(reduced)
        _same(driver, got)
        assert got.toast_columns == ["notes"]
        assert [r["notes"] for r in got.winners.to_pylist() if r["id"] == 1] == ["long text"]
    finally:
        reduced.release()
