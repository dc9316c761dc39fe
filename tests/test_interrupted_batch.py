"""Ctrl-C during a batch: pyspark's SIGINT handler cancels every running Spark job, so a delta-spark
MERGE under way ends with Spark's SPARK_JOB_CANCELLED before its commit. That is the run stopping,
not the table failing: the table is reported interrupted, with no error, and nothing was written."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness.demo import prepare_workload

import ingest.stream.callback
from ingest.commit.state import load_state
from ingest.errors import is_cancellation
from ingest.lake.layout import TablePaths
from ingest.stream.callback import AllTablesStopped, ForEachBatch
from ingest.stream.report import RunReport, TableRun
from tests.harness import make_config


class _Captured(Exception):
    """What pyspark raises for a JVM error it knows: its condition, and Spark's message."""

    def __init__(self, condition: str, message: str) -> None:
        super().__init__(message)
        self.condition = condition

    def getCondition(self) -> str:  # pyspark's name
        return self.condition


class _Frame:
    def __init__(self, parts: Any) -> None:
        self.parts = parts

    def toArrow(self) -> Any:
        import pyarrow as pa

        return pa.Table.from_batches([self.parts])


def test_a_cancelled_spark_job_is_told_from_other_failures() -> None:
    cancelled = _Captured("SPARK_JOB_CANCELLED", "Job 12 cancelled part of cancelled job group")
    assert is_cancellation(cancelled)
    try:  # as a writer re-raises it, with the JVM's error as the cause
        raise RuntimeError("MERGE failed") from cancelled
    except RuntimeError as wrapped:
        assert is_cancellation(wrapped)
    assert is_cancellation(RuntimeError("[SPARK_JOB_CANCELLED] Job 3 cancelled because SparkContext was shut down"))
    assert not is_cancellation(_Captured("TASK_WRITE_FAILED", "Task failed while writing rows"))
    assert not is_cancellation(OSError("disk full"))


def test_a_batch_cancelled_by_the_runs_stop_leaves_the_table_interrupted_not_failed(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    config = make_config(tmp_path, value_format="json")
    spec = next(t for t in config.tables if t.name == "customers").model_copy(update={"expectations": None})
    config = config.model_copy(update={"tables": [spec]})
    prepare_workload(config, events=200, seed=3, malformed_fraction=0.0)
    report = RunReport("r1", {spec.name: TableRun(spec.name)})
    handler = ForEachBatch(config, [spec], report, "r1", None, {})
    assert handler.read.source is not None

    def cancelled(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("MERGE failed") from _Captured("SPARK_JOB_CANCELLED", "Job 7 cancelled")

    monkeypatch.setattr(ingest.stream.callback, "apply_batch", cancelled)
    end = handler.read.source.end_offsets(spec.topic)
    frame = _Frame(handler.read.decoder.parts(handler.read.source.read_arrow(spec.topic, dict.fromkeys(end, 0), end)))
    with pytest.raises(AllTablesStopped):  # its only table: the query ends, as the run does
        handler(frame, 0)
        handler.settle()
    handler.close()
    table = report.tables[spec.name]
    assert table.interrupted and table.error is None and report.failed == []
    assert load_state(TablePaths.of(config, spec.name).table).table is None  # nothing was written


@pytest.mark.spark
def test_a_job_that_cancel_all_jobs_ended_is_a_cancellation(spark: Any) -> None:
    """What pyspark's SIGINT handler does (``cancelAllJobs``), done to a real running job."""
    errors: list[BaseException] = []

    def job() -> None:
        try:
            # long enough to be cancelled, and nothing in it can fail first: id * id overflowed at
            # the second partition's first row (ANSI), which then raced the cancellation
            spark.range(0, 10**13, numPartitions=2).selectExpr("sum(id % 3)").collect()
        except Exception as exc:
            errors.append(exc)

    worker = threading.Thread(target=job)
    worker.start()
    deadline = time.monotonic() + 60
    while not spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    spark.sparkContext.cancelAllJobs()
    worker.join(60)
    assert len(errors) == 1 and is_cancellation(errors[0]), errors


def test_a_stop_waits_for_the_micro_batch_being_taken_in_and_lets_later_ones_pass(tmp_path: Path,
                                                                                  monkeypatch: Any) -> None:
    """A continuous run stops its queries between micro-batches (``take_no_more``): stopping them
    cancelled the one under way mid-read, with tracebacks from py4j, Spark and its Python daemon."""
    config = make_config(tmp_path, value_format="json")
    spec = config.tables[0]
    handler = ForEachBatch(config.model_copy(update={"tables": [spec]}), [spec],
                           RunReport("r1", {spec.name: TableRun(spec.name)}), "r1", None, {})
    entered, release, taken = threading.Event(), threading.Event(), []

    def take(frame: Any, batch_id: int) -> None:
        taken.append(batch_id)
        entered.set()
        release.wait(30)

    monkeypatch.setattr(handler, "_take", take)
    under_way = threading.Thread(target=handler, args=(None, 0))
    under_way.start()
    assert entered.wait(30)
    stopping = threading.Thread(target=handler.take_no_more)
    stopping.start()
    stopping.join(0.5)
    assert stopping.is_alive()  # it waits for the micro-batch under way
    release.set()
    stopping.join(30)
    under_way.join(30)
    assert not stopping.is_alive() and not handler.passed
    handler(None, 1)  # Spark's next micro-batch, started before the query stopped
    assert taken == [0] and handler.passed  # untouched: the run discards the checkpoint that claims it
    handler.close()
