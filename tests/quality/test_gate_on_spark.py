"""The quality gate on a Spark DataFrame (``quality.validate_on``): the same verdict as on the driver.

GX names a failing row by its index on pandas and by the table's primary key on Spark; both must
lead back to the same winners, with the same counts, statuses and reasons. The same holds when the
winners are a DataFrame already (``check_frame``, ``target.plan_on: executors``): only the rows held
come back, and they are the rows the driver's gate holds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.config import TableSpec
from ingest.errors import QualityGateError
from ingest.quality import QualityGate, load_suite
from ingest.spark.session import arrow_frame
from ingest.stream.runner import Runner
from tests.quality.helpers import make_config, write_suite

SUITE = [
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "name", "regex": "^[a-z]+$"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "balance", "min_value": 0, "max_value": 100}},
    {"type": "expect_column_pair_values_a_to_be_greater_than_b",
     "kwargs": {"column_A": "balance", "column_B": "fee", "or_equal": True}},
    {"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": ["name", "region"]}},
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1, "max_value": 3},
     "meta": {"policy": "warn"}},
    {"type": "expect_table_columns_to_match_set",
     "kwargs": {"column_set": ["region", "id", "name", "balance", "fee"], "exact_match": True}},
]


def winners(rows: list[tuple], key: list[str]) -> pa.Table:
    """A reduced batch as the pipeline hands it to the gate: one row per key, deletes included."""
    ops, ids, regions, names, balances, fees = zip(*rows, strict=True)
    return pa.table({
        "_cdc_op": pa.array(ops), "_cdc_key_columns": pa.array([json.dumps(key)] * len(rows)),
        "region": pa.array(regions, pa.string()), "id": pa.array(ids, pa.int32()), "name": pa.array(names),
        "balance": pa.array([Decimal(b) if b is not None else None for b in balances], pa.decimal128(10, 2)),
        "fee": pa.array(fees, pa.float64()),
    })


def both_gates(tmp_path: Path, spark, policy: str = "quarantine", suite: list[dict] = SUITE
               ) -> tuple[QualityGate, QualityGate]:
    write_suite(tmp_path / "suites", "people", suite)
    spec = TableSpec(name="people", topic="t", expectations="people", quality_policy=policy)
    loaded = load_suite(tmp_path / "suites", "people")
    return QualityGate(spec, loaded), QualityGate(spec, loaded, spark=spark)


def verdict(gate: QualityGate, batch: pa.Table):
    report = gate.check(batch, None, batch_id=0, run_id="r")
    return (report.status, report.evaluated, report.failed, report.failures, report.rows_validated,
            {pos: (h.expectations, h.reasons) for pos, h in sorted(report.held.items())})


def held_rows(gate: QualityGate, batch: pa.Table, spark=None) -> tuple:
    """The verdict with each held row by its values: ``check`` of ``batch``, or ``check_frame`` of
    it as a DataFrame when ``spark`` is given (whose rows held are the only ones returned)."""
    if spark is None:
        report, rows = gate.check(batch, None, batch_id=0, run_id="r"), batch
    else:
        keys = tuple(json.loads(batch["_cdc_key_columns"][0].as_py()))
        report, rows = gate.check_frame(arrow_frame(spark, batch), None, keys, batch_id=0, run_id="r")
        # nothing but the held rows came back, unless the batch was few enough to validate on the driver
        assert rows.num_rows == len(report.held) or not report.held or rows.num_rows <= gate.driver_rows
    held = sorted((json.dumps(rows.slice(pos, 1).to_pylist()[0], default=str), h.expectations, h.reasons)
                  for pos, h in report.held.items())
    return report.status, report.evaluated, report.failed, report.failures, report.rows_validated, held


@pytest.mark.parametrize("key", [["id"], ["region", "id"]], ids=["one key column", "two key columns"])
def test_a_spark_gate_holds_the_same_rows_for_the_same_reasons_as_the_driver_gate(tmp_path, spark, key):
    batch = winners([("c", 1, "eu", "ann", "10.00", 1.0),
                     ("u", 2, "eu", "Bob", "20.00", 1.0),      # regex
                     ("d", 3, "eu", None, None, None),          # a delete: not validated
                     ("c", 4, "us", "cy", "500.00", 1.0),       # between
                     ("c", 4, "eu", "dee", "5.00", 9.0),        # pair; id 4 twice: unique fails
                     ("c", 6, "us", "cy", "7.00", 1.0)],        # compound (name, region) with id 4's
                    key)
    driver, on_spark = both_gates(tmp_path, spark)
    assert driver.spark is None and on_spark.spark is spark
    expected = verdict(driver, batch)
    # rows of the batch (the delete, row 2, is not validated): Bob, both rows of id 4, cy of us
    assert expected[0] == "quarantined" and sorted(expected[5]) == [1, 3, 4, 5]
    assert verdict(on_spark, batch) == expected
    assert held_rows(on_spark, batch, spark) == held_rows(driver, batch)


def test_a_whole_batch_failure_and_the_fail_policy_are_the_same_on_spark(tmp_path, spark):
    batch = winners([("c", n, "eu", "ann" + "x" * n, "1.00", 1.0) for n in range(1, 5)], ["id"])
    driver, on_spark = both_gates(tmp_path, spark, suite=[
        SUITE[5], {"type": "expect_column_values_to_be_between", "kwargs": {"column": "id", "max_value": 3},
                   "meta": {"policy": "quarantine"}}])
    assert verdict(on_spark, batch) == verdict(driver, batch)  # 4 rows: the row count warns; id 4 held
    assert held_rows(on_spark, batch, spark) == held_rows(driver, batch)
    whole_driver, whole_spark = both_gates(tmp_path / "whole", spark, suite=[
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"max_value": 3}, "meta": {"policy": "quarantine"}}])
    expected = held_rows(whole_driver, batch)
    assert expected[0] == "quarantined" and len(expected[5]) == 4  # every row of the batch is held
    assert held_rows(whole_spark, batch, spark) == expected
    strict_driver, strict_spark = both_gates(tmp_path / "fail", spark, policy="fail", suite=SUITE[1:2])
    bad = winners([("c", 1, "eu", "Ann", "1.00", 1.0)], ["id"])
    messages = []
    for gate in (strict_driver, strict_spark):
        with pytest.raises(QualityGateError) as caught:
            gate.check(bad, None, batch_id=3, run_id="r")
        messages.append(str(caught.value))
    with pytest.raises(QualityGateError) as caught:
        strict_spark.check_frame(arrow_frame(spark, bad), None, ("id",), batch_id=3, run_id="r")
    messages.append(str(caught.value))
    assert messages[0] == messages[1] == messages[2] and "(id=1) name='Ann'" in messages[1]


@pytest.mark.parametrize("zone", [UTC, None], ids=["timestamp", "timestamp without time zone"])
def test_rows_keyed_by_a_timestamp_are_named_on_spark_as_on_the_driver(tmp_path, spark, zone):
    """pyspark returns a timestamp key without its time zone, in local time: the gate still finds the row."""
    at = [datetime(2026, 1, 1, 12, n, tzinfo=zone) for n in range(3)]
    batch = pa.table({"_cdc_op": ["c", "c", "u"], "_cdc_key_columns": [json.dumps(["at"])] * 3,
                      "at": pa.array(at, pa.timestamp("us", tz="UTC" if zone else None)),
                      "name": ["ann", "Bob", "cy"]})
    driver, on_spark = both_gates(tmp_path, spark, suite=SUITE[1:2])
    expected = verdict(driver, batch)
    assert list(expected[5]) == [1]  # Bob's row, not the whole batch
    assert verdict(on_spark, batch) == expected


def test_a_batch_of_few_rows_on_the_executors_is_validated_on_the_driver_with_the_same_verdict(tmp_path, spark):
    """``quality.driver_rows``: winners on Spark that are few are collected in one job and validated
    with pandas (GX's Spark engine runs jobs per expectation); a batch past the bound stays on Spark."""
    batch = winners([("c", 1, "eu", "ann", "10.00", 1.0), ("u", 2, "eu", "Bob", "20.00", 1.0),
                     ("d", 3, "eu", None, None, None), ("c", 4, "us", "cy", "500.00", 1.0),
                     ("c", 4, "eu", "dee", "5.00", 9.0), ("c", 6, "us", "cy", "7.00", 1.0)], ["id"])
    driver, on_spark = both_gates(tmp_path, spark)
    expected = held_rows(driver, batch)
    tracker = spark.sparkContext.statusTracker()
    jobs, sides = {}, []
    real = QualityGate._validate

    def spied(gate, frame, keys, *, on_spark):
        sides.append(on_spark)
        return real(gate, frame, keys, on_spark=on_spark)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(QualityGate, "_validate", spied)
        for bound in (5, 4):  # the batch validates 5 rows (its delete is not validated)
            gate = QualityGate(on_spark.spec, on_spark.suite, spark=spark, driver_rows=bound)
            before = max(tracker.getJobIdsForGroup() or [0])
            assert held_rows(gate, batch, spark) == expected
            jobs[bound] = max(tracker.getJobIdsForGroup() or [0]) - before
    assert sides == [False, True]
    assert jobs[5] < jobs[4]  # fewer Spark jobs on the driver's side


@pytest.mark.parametrize(("validate_on", "master", "on_spark"), [
    ("auto", "spark://cluster:7077", {"on_delta_spark"}), ("auto", "local[2]", set()),
    ("driver", "spark://cluster:7077", set()), ("spark", "local[2]", {"on_delta_spark", "on_delta_rs"}),
    ("auto", "local[2] executors", {"on_delta_spark"})])  # its batches are on the executors: validated there
def test_the_engine_hands_its_session_to_the_gates_validate_on_picks(tmp_path, spark, validate_on, master,
                                                                      on_spark):
    tables = [{"name": "on_" + engine.replace("-", "_"), "topic": f"t{n}", "engine": engine, "expectations": "people"}
              for n, engine in enumerate(("delta-spark", "delta-rs"))]
    config = make_config(tmp_path, tables=tables)
    master, _, plan_on = master.partition(" ")
    config = config.model_copy(update={"quality": config.quality.model_copy(update={"validate_on": validate_on}),
                                       "spark": config.spark.model_copy(update={"master": master}),
                                       "target": config.target.model_copy(update={"plan_on": plan_on or "driver"})})
    write_suite(config.expectations_dir, "people", SUITE[1:2])
    gates = Runner(config, spark=spark).quality_gates(config.tables)
    assert {name for name, gate in gates.items() if gate.spark is spark} == on_spark
    assert {name for name, gate in gates.items() if gate.spark is None} == {"on_delta_spark", "on_delta_rs"} - on_spark
    # auto leaves few rows to the driver (quality.driver_rows); spark validates every batch there
    small = config.quality.driver_rows if validate_on == "auto" else 0
    assert all(gate.driver_rows == small for gate in gates.values() if gate.spark is spark)
