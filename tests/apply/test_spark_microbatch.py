"""A table's micro-batch assembled on the executors equals the driver's ``MicroBatch.from_parts``.

The decoded DataFrame holds, over several partitions: a table's changes the table already applied
(delivered again) and new ones, undecodable messages, a heartbeat, a Kafka tombstone, and another
topic's changes. Assembled on the executors, the table's share must give the same change rows
(every column), tombstones and records that carry no change, the same combined columns, counts and
offset spans.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from ingest.apply.batch import MicroBatch
from ingest.apply.journey import apply_parts
from ingest.apply.placement.executors.assembly import assemble_on_executors
from ingest.commit.state import load_state
from ingest.config import TableSpec
from ingest.decode.parts import write_parts
from ingest.model import ControlRecord
from ingest.spark.session import arrow_frame
from tests.apply.test_spark_reduce import random_parts
from tests.factories import change, decoded_rows
from tests.harness import paths_in

pytestmark = pytest.mark.spark


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]))


def test_the_executors_assemble_the_batch_the_driver_assembles(tmp_path: Any, spark: Any) -> None:
    spec = TableSpec(name="t", topic="t")
    paths = paths_in(tmp_path)
    first = random_parts(1000, keys=24, truncates=False)
    assert apply_parts(spec, paths, first, batch_id=0, run_id="test").record is not None
    state = load_state(paths.table)
    heartbeat = ControlRecord("heartbeat")
    tombstone = ControlRecord("tombstone", key={"id": 3}, key_columns=("id",))
    mine = (first + random_parts(1, keys=30, first_offset=10_000)
            + decoded_rows(["not json", heartbeat, "truncated envelope", tombstone], partition=1, first_offset=20_000))
    others = decoded_rows([change("c", 1, 5), change("u", 1, 6)], topic="other")
    decoded = arrow_frame(spark, pa.Table.from_batches([write_parts(mine + others)])).repartition(3)

    driver = MicroBatch.from_parts(mine, state)
    got = assemble_on_executors(decoded, "t", state, table="t")
    try:
        assert driver.already_applied > 0 and driver.meta.num_rows == 3  # worth comparing
        assert got.columns == driver.columns
        assert (got.received, got.already_applied) == (driver.received, driver.already_applied)
        assert got.offsets == driver.offsets
        changes = got.changes.toArrow()
        assert changes.schema.names == driver.changes.schema.names
        assert _sorted(changes.cast(driver.changes.schema)) == _sorted(driver.changes)
        assert _sorted(got.meta) == _sorted(driver.meta)
        assert driver.tombstones.num_rows == 1 and _sorted(got.tombstones) == _sorted(driver.tombstones)
    finally:
        got.release()
