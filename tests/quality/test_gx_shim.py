"""GX's speed-ups in the gate change no result: the configuration shim and the two-pass result format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from ingest.config import TableSpec
from ingest.quality import QualityGate, gx_shim, load_suite
from ingest.quality.gate import _GX_LOCK, RESULT_FORMAT

SUITES = Path(__file__).resolve().parents[2] / "expectations"


def orders(rows: int, *, bad: bool) -> pd.DataFrame:
    """Rows of the demo's ``orders`` columns; ``bad`` breaks three map expectations on a few rows."""
    rng = np.random.default_rng(7)
    price = rng.integers(100, 9000, rows) / 100
    qty = rng.integers(1, 20, rows)
    frame = pd.DataFrame({
        "id": np.arange(rows, dtype="int64"), "customer_id": rng.integers(1, 400, rows),
        "product_id": rng.integers(1, 80, rows), "quantity": qty, "unit_price": price, "amount": price * qty,
        "status": rng.choice(["pending", "paid", "shipped", "cancelled"], rows), "note": [None] * rows,
    })
    if bad:
        frame.loc[[3, 40], "quantity"] = -2
        frame.loc[[5], "status"] = "lost"
        frame.loc[[8, 9], "amount"] = 0.0
    return frame


def document(result: Any) -> dict[str, Any]:
    """A validation result as JSON, without what differs per run (run ids, times)."""
    doc = json.loads(json.dumps(result.to_json_dict(), default=str))
    doc.pop("meta", None)
    return doc


@pytest.fixture(scope="module")
def gate() -> QualityGate:
    spec = TableSpec(name="shim_orders", topic="orders", expectations="orders")
    return QualityGate(spec, load_suite(SUITES, "orders"))


def validate(gate: QualityGate, frame: pd.DataFrame, result_format: dict[str, Any], *, shim: bool) -> Any:
    with _GX_LOCK:
        batch = gate._definition(on_spark=False).get_batch(batch_parameters={"dataframe": frame})
        if not shim:
            return batch.validate(gate.suite.gx_suite, result_format=result_format)
        with gx_shim.memoized_configurations():
            return batch.validate(gate.suite.gx_suite, result_format=result_format)


def test_shim_is_checked_against_the_installed_gx():
    # An upgraded GX turns the shim off; this fails until the comparisons below are re-run and it is re-checked.
    assert gx_shim.active(), f"GX is not {gx_shim.CHECKED_VERSION}: re-check ingest/quality/gx_shim.py"


@pytest.mark.parametrize("bad", [False, True], ids=["clean", "violations"])
def test_shim_changes_no_result(gate, bad):
    from great_expectations.expectations.expectation import Expectation

    original = Expectation.__dict__["configuration"]
    frame = orders(3000, bad=bad)
    plain = validate(gate, frame, RESULT_FORMAT, shim=False)
    shimmed = validate(gate, frame, RESULT_FORMAT, shim=True)
    assert document(shimmed) == document(plain)
    assert plain.success is (not bad)
    assert Expectation.__dict__["configuration"] is original  # the block leaves GX as it found it


def test_second_pass_gives_failing_expectations_their_complete_result(gate):
    frame = orders(3000, bad=True)
    complete = validate(gate, frame, RESULT_FORMAT, shim=False)
    with _GX_LOCK, gx_shim.memoized_configurations():
        validator = gate._validator(frame, on_spark=False)
        two_pass = validator.validate_expectation_suite(gate.suite.gx_suite)
        gate._name_failing_rows(validator, two_pass, (), on_spark=False)
    failing = {r.expectation_config.id: r for r in complete.results if not r.success}
    assert len(failing) == 3
    for r in two_pass.results:
        if r.expectation_config.id in failing:
            assert r.to_json_dict() == failing[r.expectation_config.id].to_json_dict()
        else:
            assert r.success and "unexpected_index_list" not in r.result
    rows = {r.expectation_config.kwargs.get("column", "pair"): r.result["unexpected_index_list"]
            for r in two_pass.results if not r.success}
    assert rows == {"quantity": [3, 40], "status": [5], "pair": [8, 9]}


def test_remembered_metric_ids_equal_gx_own_and_tell_look_alike_values_apart():
    from great_expectations.core.id_dict import IDDict

    original = IDDict.__dict__["to_id"]
    cases = [
        IDDict({"column": "amount", "mostly": 1, "batch_id": "b"}),
        IDDict({"column": "amount", "mostly": 1.0, "batch_id": "b"}),  # 1 == 1.0 == True: each its own id
        IDDict({"column": "amount", "mostly": True, "batch_id": "b"}),
        IDDict({"column": "amount", "min_value": 0.0, "batch_id": "b"}),
        IDDict({"column": "amount", "min_value": -0.0, "batch_id": "b"}),
        IDDict({"column_list": ["a", "b"], "value_set": ("x", None), "nested": {"k": [1, {"z": 2.5}]}}),
        IDDict({"column": "status", "value_set": {"paid", "lost"}, "batch_id": "b"}),  # a set: not remembered
        IDDict({"column": "quantity"}),
        IDDict({}),
    ]
    expected = [(original(d), original(d, id_keys=["column"] if "column" in d else None),
                 original(d, id_ignore_keys=["batch_id"])) for d in cases]
    with _GX_LOCK, gx_shim.memoized_configurations():
        assert IDDict.__dict__["to_id"] is not original
        for _ in range(2):  # the second round answers from memory
            got = [(d.to_id(), d.to_id(id_keys=iter(["column"]) if "column" in d else None),
                    d.to_id(id_ignore_keys=["batch_id"])) for d in cases]
            assert got == expected
    assert IDDict.__dict__["to_id"] is original  # the block leaves GX as it found it
    ids = [e[0] for e in expected[:5]]
    assert len(set(ids)) == 5  # GX itself tells them apart, so a shared memory entry would be caught above
