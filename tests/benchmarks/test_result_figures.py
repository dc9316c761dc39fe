"""bench_compare's figures for its result file (benchmarks/record.py) come from what it measured:
checked on made-up runs, since the benchmark itself is not run by the suite."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_compare
from cpu_meter import CpuMeter


def _run(seconds: float, batches: list[float]) -> bench_compare.EngineRun:
    return bench_compare.EngineRun(run_s=seconds + 2.0, query_start_s=2.0, batches=batches, firsts=[batches[0]],
                                   failed=0, ok=True, quarantined=0, suites_s=0.0)


def test_the_figures_are_the_ones_the_table_prints() -> None:
    base = bench_compare.Baselines(seconds=20.0, ok=True, batches=[1.0, 1.0])
    run = _run(10.0, [2.0, 4.0, 3.0])
    plain, checked = _run(10.0, [2.0, 2.0, 2.0]), _run(11.0, [2.5, 2.5, 2.5])
    figures = {f.name: (f.value, f.unit) for f in bench_compare.result_figures(
        1000, base, run, CpuMeter(), 512.4, 5.0, plain, {"driver": checked}, True)}
    assert figures["records"] == (1000, "")
    assert figures["engine: wall time (batches)"] == (10.0, "s")
    assert figures["bare script: wall time"] == (20.0, "s")
    assert figures["ratio engine/bare"] == (2.0, "")
    assert figures["ratio counting the query start too"] == (round(20 / 12, 2), "")
    assert figures["engine: batch p50"] == (3.0, "s")
    assert figures["engine: first batch / median batch (per table, worst)"] == (round(2 / 3, 2), "x")
    assert figures["Spark JVM peak RSS"] == (512, "MB")
    assert figures["suites validated on driver: add to the total"] == (10.0, "%")
    assert figures["suites validated on driver: add to the median batch"] == (25.0, "%")
    assert figures["tables equal to the source"] == (True, "")
    assert "engine: CPU in all" not in figures  # no sample taken: nothing to report
