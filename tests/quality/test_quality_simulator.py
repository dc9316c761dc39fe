"""The simulator's quality violations: real source values the demo suites reject, recorded in the truth."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from harness.simulator import WorkloadSpec, generate
from harness.simulator.rows import QUALITY_VIOLATIONS

from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.source.topiclog import TopicLog


def make(tmp_path, name, **spec):
    root = tmp_path / name
    return generate(WorkloadSpec(events=3000, seed=5, **spec), TopicLog(root / "topics"),
                    EmbeddedSchemaRegistry(root / "schemas"), root / "truth")


def test_violations_are_spread_counted_and_part_of_the_source_state(tmp_path):
    truth = make(tmp_path, "a", quality_violation_fraction=0.03)
    counts = truth.counts
    total = sum(c["quality_violations"] for c in counts.values())
    streamed = sum(c["creates"] + c["updates"] for c in counts.values())
    assert abs(total - 0.03 * streamed) <= 1
    for table, kinds in QUALITY_VIOLATIONS.items():
        assert counts[table]["quality_violations"] == sum(counts[table][f"violation_{k}"] for k in kinds) > 0
    # The truth holds what the source holds, violations included.
    orders = truth.tables["orders"]
    assert pc.sum(pc.less(orders["quantity"], 0)).as_py() + pc.sum(pc.equal(orders["status"], "lost")).as_py() > 0
    assert pc.sum(pc.match_substring(truth.tables["customers"]["email"], " at ")).as_py() > 0


def test_same_seed_same_violations_and_none_by_default(tmp_path):
    assert make(tmp_path, "a", quality_violation_fraction=0.03).counts == make(
        tmp_path, "b", quality_violation_fraction=0.03).counts
    plain = make(tmp_path, "c")
    assert all(c["quality_violations"] == 0 for c in plain.counts.values())
    assert pc.sum(pc.match_substring(plain.tables["customers"]["email"], " at ")).as_py() == 0


def test_fraction_is_validated():
    with pytest.raises(ValueError, match="quality_violation_fraction"):
        WorkloadSpec(quality_violation_fraction=1.5).validate()
