"""bench_latency's split of the slowest rows' latency into stages, and its batch times early and late."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from harness.cpu import busy_seconds, cpu_shares, cpu_ticks
from harness.latency import CommitIndex, compaction_times

from ingest.commit.state import BATCH_KEY

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_latency
from cpu_meter import descendants


def test_the_slowest_rows_are_those_with_the_largest_sum_each_stage_apart() -> None:
    # per row: capture, waiting, decode; their sums are 2, 3, 4, 9 and 11
    stages = {"capture": [1.0, 1, 1, 9, 1], "waiting": [1.0, 2, 3, 0, 10], "decode": [0.0, 0, 0, 0, 0]}
    assert bench_latency.slowest_stages(stages, share=0.4) == {"capture": 5, "waiting": 5, "decode": 0}
    assert bench_latency.slowest_stages(stages) == {"capture": 1, "waiting": 10, "decode": 0}  # at least one row
    assert bench_latency.slowest_stages({"capture": [], "waiting": []}) == {"capture": None, "waiting": None}


def test_batch_times_early_and_late_are_the_medians_of_the_first_and_last_tenth() -> None:
    times = [float(t) for t in range(1, 21)]  # a batch that grows slower with its table
    assert bench_latency.first_and_last(times) == (1.5, 19.5)
    assert bench_latency.first_and_last([3.0, 1.0, 2.0]) == (3.0, 2.0)  # at least one batch each
    assert bench_latency.first_and_last([]) is None


def test_a_baseline_engine_is_an_earlier_commit_its_process_imports_first(tmp_path: Path) -> None:
    """``--baseline``: the engine's process, started in the commit checked out beside, imports its ``ingest``."""
    engine = bench_latency.baseline_engine("HEAD", tmp_path)
    try:
        assert engine.path is not None and (engine.path / "ingest" / "__init__.py").is_file()
        imported = subprocess.run([sys.executable, "-c", "import ingest; print(ingest.__file__)"],
                                  cwd=engine.cwd, capture_output=True, text=True, check=True).stdout.strip()
        assert Path(imported).is_relative_to(engine.path)
        assert bench_latency.THIS_CHECKOUT.cwd is None
    finally:
        bench_latency.remove_engine(engine)
    assert engine.path is not None and not engine.path.exists()


def test_the_interval_is_the_median_time_between_consecutive_batch_starts() -> None:
    """Back to back batches of 0.4 s under a 0.25 s trigger: the interval is the batches', not the trigger's."""
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    starts = [t0 + timedelta(seconds=s) for s in (0.8, 0.0, 0.4, 1.4, 1.1)]  # in any order
    assert bench_latency.median_interval(starts) == 350.0  # gaps 400, 400, 300, 300 ms
    assert bench_latency.median_interval(starts[:1]) is None


def test_the_time_from_a_commit_to_the_next_batchs_start_pairs_each_batch_with_the_version_before() -> None:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    ms = int(t0.timestamp() * 1000)
    commit_times = {4: ms + 100, 5: ms + 400, 7: ms + 900}
    batches = [{"delta_version": 5, "started_at": t0 + timedelta(milliseconds=220)},  # 120 ms after version 4
               {"delta_version": 6, "started_at": t0 + timedelta(milliseconds=550)},  # 150 ms after version 5
               {"delta_version": 4, "started_at": t0},  # version 3 is not an engine commit: left out
               {"delta_version": 8, "started_at": None},  # no start: left out
               {"delta_version": None, "started_at": t0}]  # committed nothing: left out
    assert sorted(bench_latency.commit_to_next_start(batches, commit_times)) == [120.0, 150.0]
    assert bench_latency.intervals([t0 + timedelta(seconds=s) for s in (0.4, 0.0, 1.0)]) == [400.0, 600.0]


def test_batches_that_wrote_a_delta_checkpoint_are_told_from_the_others(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    for name in ("00000000000000000099.checkpoint.parquet", "00000000000000000099.json", "_last_checkpoint",
                 "00000000000000000199.checkpoint.0000000001.0000000002.parquet",
                 "00000000000000000199.checkpoint.0000000002.0000000002.parquet", "00000000000000000200.json"):
        (log / name).touch()
    versions = bench_latency.checkpoint_versions(tmp_path)
    assert versions == {99, 199}
    batches = [{"delta_version": 98, "total_ms": 200}, {"delta_version": 99, "total_ms": 450},
               {"delta_version": 100, "total_ms": 180}, {"delta_version": 199, "total_ms": 350},
               {"delta_version": 197, "total_ms": 240}, {"delta_version": None, "total_ms": 900},
               {"delta_version": 150, "total_ms": 10}]  # no checkpoint's neighbour: left out
    assert bench_latency.marked_batches(batches, versions) == (2, 400.0, 200.0)
    assert bench_latency.marked_batches(batches, versions, near=1) == (2, 400.0, 190.0)
    assert bench_latency.marked_batches(batches, {5}) is None  # none in the window wrote one


def test_batches_under_way_when_the_remembered_deletes_were_packed_are_told_from_the_others(tmp_path: Path) -> None:
    stones = tmp_path / "stones"
    for i in range(3):
        write_deltalake(str(stones), pa.table({"id": [i]}), mode="append")
    DeltaTable(str(stones)).optimize.compact()
    packed = compaction_times(stones)
    assert len(packed) == 1 and compaction_times(tmp_path / "none") == []
    t0 = packed[0]
    batches = [{"delta_version": 7, "started_at": t0 - timedelta(milliseconds=90), "finished_at": t0 + timedelta(
                   milliseconds=10), "total_ms": 100},
               {"delta_version": 8, "started_at": t0 + timedelta(milliseconds=20), "finished_at": t0 + timedelta(
                   milliseconds=90), "total_ms": 70},  # started after it
               {"delta_version": 6, "started_at": t0 - timedelta(milliseconds=200), "finished_at": t0 - timedelta(
                   milliseconds=100), "total_ms": 100},  # ended before it
               {"delta_version": None, "started_at": t0, "finished_at": t0, "total_ms": 5}]  # committed nothing
    assert bench_latency.batches_during(batches, packed) == {7}
    assert bench_latency.marked_batches(batches, {7}) == (1, 100.0, 85.0)


def test_a_commit_index_keeps_each_commits_time_by_version() -> None:
    index = CommitIndex.from_commits([{"version": 3, "timestamp": 1_000, BATCH_KEY: {"offsets": "{}"}},
                                      {"version": 4, "timestamp": 1_250, BATCH_KEY: {"offsets": '{"t:0": [0, 9]}'}}])
    assert index.times == {3: 1_000, 4: 1_250} and index.visible("t", 0, 5) == (4, 1_250)


def _result(**figures: Any) -> Any:
    """A run's result with its latency and batch figures (ms) as given, the rest of no concern."""
    return bench_latency.RateResult(
        tables="one", run=1, poll_ms=50, engine="this checkout", engine_cpus="all", target=500, generators=1,
        achieved=500, per_generator=[500], engine_rate=500, p95=900, rows=1, unmatched=0, drain_seconds=1,
        caught_up=True, failed_transactions=0, trigger_ms=250, batch_ends=None, copied_ends=None, stages={}, tail={},
        spark_steps={}, full_collections={}, **figures)


def test_fresh_compares_p50_with_the_measured_interval_not_the_trigger() -> None:
    result = _result(p50=740, p99=1000, interval_ms=500, batch_p50=440)
    assert result.fresh  # 740 <= 500 + 440, though not within the trigger's 250 + 440
    assert not replace(result, interval_ms=250).fresh
    assert not replace(result, interval_ms=None).fresh


def test_a_tail_is_bounded_when_p99_waited_at_most_one_interval_and_one_batch_more_than_p50() -> None:
    result = _result(p50=470, p99=960, interval_ms=290, batch_p50=240)
    assert result.tail_bounded  # 960 <= 470 + 290 + 240 = 1,000, though 960 / 470 = 2.04
    assert not replace(result, p99=1010).tail_bounded
    assert not replace(result, batch_p50=None).tail_bounded


def test_spark_step_means_are_taken_between_two_scrapes_of_the_engine_metrics() -> None:
    from prometheus_client import generate_latest

    from ingest.metrics import RunMetrics

    metrics = RunMetrics()
    metrics.micro_batch({"triggerExecution": 900, "addBatch": 800})  # before the window: left out
    before = bench_latency.step_totals(generate_latest(metrics.registry).decode())
    for whole, work in ((300, 100), (500, 300)):
        metrics.micro_batch({"triggerExecution": whole, "addBatch": work, "walCommit": 20})
    after = bench_latency.step_totals(generate_latest(metrics.registry).decode())
    assert before == {"triggerExecution": (0.9, 1.0), "addBatch": (0.8, 1.0)}
    means = bench_latency.step_means(before, after)
    assert means.keys() == {"triggerExecution", "addBatch", "walCommit"}
    assert [round(means[s]) for s in ("triggerExecution", "addBatch", "walCommit")] == [400, 200, 20]
    assert bench_latency.step_means(after, after) == {}  # no micro-batch between them
    assert bench_latency.step_means({}, {}) == {}  # an engine that does not serve them


def test_rows_copied_are_read_from_either_writers_merge_metrics() -> None:
    assert bench_latency.copied_rows({"merge_metrics": '{"num_target_rows_copied": 9600, "x": 1}'}) == 9600
    assert bench_latency.copied_rows({"merge_metrics": '{"numTargetRowsCopied": 12}'}) == 12  # delta-spark's
    assert bench_latency.copied_rows({"merge_metrics": '{"num_target_rows_inserted": 5}'}) == 0  # an append
    assert bench_latency.copied_rows({"merge_metrics": None}) == 0


def test_the_machines_cpu_in_the_window_is_taken_from_two_readings_of_proc_stat() -> None:
    # user nice system idle iowait irq softirq steal (guest fields follow and are in user already)
    before = cpu_ticks("cpu  1000 0 500 8000 100 0 50 10 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    after = cpu_ticks("cpu  1600 0 800 8300 100 0 100 110 0 0\n")
    assert before == (9660, 1560, 10)
    # 1,350 ticks in all: 300 idle, the rest busy, 100 of those stolen
    assert cpu_shares(before, after) == (1050 / 1350, 100 / 1350)
    assert cpu_shares(after, after) is None
    total, busy, steal = cpu_ticks()  # this machine's, now
    assert 0 <= steal <= busy <= total and busy_seconds() >= 0


def test_a_core_split_reads_cpu_lists_and_keeps_a_cpu_for_the_rest() -> None:
    assert bench_latency.CoreSplit.of("all").mine == frozenset()
    if len(os.sched_getaffinity(0)) < 2:
        return  # one CPU: no list leaves one to the rest
    assert bench_latency.CoreSplit.of("1").mine == {1}
    assert bench_latency.CoreSplit.of("1-1+1").mine == {1}
    with pytest.raises(SystemExit, match="leave at least one"):
        bench_latency.CoreSplit.of(f"0-{max(os.sched_getaffinity(0))}")


def test_the_engine_and_the_children_it_starts_later_take_its_cpus() -> None:
    split = bench_latency.CoreSplit.of("all" if len(os.sched_getaffinity(0)) < 2 else "1")
    # a parent that starts its child only after it was moved, as the engine starts its JVM
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; time.sleep(1); "
                               "subprocess.run([sys.executable, '-c', 'import time; time.sleep(5)'])"])
    try:
        split.engine(parent.pid)
        deadline = time.monotonic() + 30
        while len(tree := descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(tree) == 2
        want = set(split.mine) or os.sched_getaffinity(0)
        assert [os.sched_getaffinity(pid) for pid in tree] == [want, want]
    finally:
        parent.kill()
        parent.wait()
