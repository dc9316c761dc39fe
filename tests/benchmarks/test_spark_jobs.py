"""benchmarks/spark_jobs.py: a Spark event log's jobs grouped by kind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import spark_jobs


def _job(job_id: int, description: str | None, submitted: int, completed: int, tasks: int) -> list[dict]:
    props = {"callSite.short": f"save at delta_spark.py:{job_id}"}
    if description is not None:
        props["spark.job.description"] = description
    return [{"Event": "SparkListenerJobStart", "Job ID": job_id, "Submission Time": submitted,
             "Stage Infos": [{"Stage ID": job_id, "Number of Tasks": tasks}], "Properties": props},
            {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": completed,
             "Job Result": {"Result": "JobSucceeded"}}]


def _write_log(directory: Path, events: list[dict]) -> None:
    # As Spark 4 writes it: a directory eventlog_v2_<app>, holding events_1_<app>.zstd
    app = directory / "eventlog_v2_local-1"
    app.mkdir(parents=True)
    with pa.output_stream(str(app / "events_1_local-1.zstd"), compression="zstd") as out:
        out.write("\n".join(json.dumps(e) for e in events).encode() + b"\n")


def test_jobs_are_grouped_by_description_without_numbers_costliest_first(tmp_path: Path) -> None:
    events = [{"Event": "SparkListenerApplicationStart"},
              *_job(0, "Delta: Compute snapshot for version: 3", 1000, 1500, 2),
              *_job(1, "Delta: Compute snapshot for version: 4", 2000, 2250, 2),
              *_job(2, "Writing Deletion Vectors - Rewriting 2 files", 3000, 6000, 4),
              *_job(3, "q_1\nid = 1\nrunId = 2\nbatch = 7", 7000, 7100, 2),
              *_job(4, None, 8000, 8400, 1),
              _job(5, "still running", 9000, 0, 1)[0]]
    _write_log(tmp_path, events)
    kinds = spark_jobs.job_kinds(tmp_path)
    assert [(k.kind, k.jobs, k.tasks, round(k.seconds, 2)) for k in kinds] == [
        ("Writing Deletion Vectors - Rewriting N files", 1, 4, 3.0),
        ("Delta: Compute snapshot for version: N", 2, 4, 0.75),
        ("save at delta_spark.py:N", 1, 1, 0.4),
        ("streaming micro-batch (read and decode)", 1, 2, 0.1),
    ]


def test_a_directory_without_an_event_log_is_a_clear_error(tmp_path: Path) -> None:


    with pytest.raises(SystemExit, match="no Spark event log"):
        spark_jobs.job_kinds(tmp_path)


def test_a_spark_setting_is_key_equals_value() -> None:
    import argparse

    assert spark_jobs.setting(" spark.sql.adaptive.enabled = false") == ("spark.sql.adaptive.enabled", "false")
    assert spark_jobs.setting("spark.driver.extraJavaOptions=-Da=b") == ("spark.driver.extraJavaOptions", "-Da=b")
    for bad in ("spark.sql.adaptive.enabled", "=false"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            spark_jobs.setting(bad)
