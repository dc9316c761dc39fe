"""bench_latency's split of the slowest rows' latency into stages."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_latency


def test_the_slowest_rows_are_those_with_the_largest_sum_each_stage_apart() -> None:
    # per row: capture, waiting, decode; their sums are 2, 3, 4, 9 and 11
    stages = {"capture": [1.0, 1, 1, 9, 1], "waiting": [1.0, 2, 3, 0, 10], "decode": [0.0, 0, 0, 0, 0]}
    assert bench_latency.slowest_stages(stages, share=0.4) == {"capture": 5, "waiting": 5, "decode": 0}
    assert bench_latency.slowest_stages(stages) == {"capture": 1, "waiting": 10, "decode": 0}  # at least one row
    assert bench_latency.slowest_stages({"capture": [], "waiting": []}) == {"capture": None, "waiting": None}
