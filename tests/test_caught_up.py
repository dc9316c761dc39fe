"""A run with nothing to do ends without Spark or Great Expectations, and only then.

The tables' Delta logs are compared with the source's end offsets (:mod:`ingest.stream.caught_up`);
the run that finds work, or is asked to replay, takes the whole start as before.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.commit.state import load_state
from ingest.config import IngestConfig, load_config
from ingest.lake import locks
from ingest.source.catalog import catalog_for
from ingest.stream.caught_up import pending, retention_gap, warn_retention_gap
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "app.public.notes"


@pytest.fixture
def config(tmp_path: Path) -> tuple[Path, IngestConfig]:
    """One table ``notes`` with a quality suite, so a run that starts it would import Great Expectations."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "notes.json").write_text(json.dumps({"name": "notes", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]}))
    raw = {"workdir": str(tmp_path / "work"), "source": {"value_format": "json", "max_records_per_batch": 100},
           "quality": {"expectations_dir": str(suites)},
           "tables": [{"name": "notes", "topic": TOPIC, "expectations": "notes"}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def _changes(first: int, count: int) -> list[tuple[str, dict[str, Any], int]]:
    return [("c", {"id": i, "body": f"note {i}"}, 100 + i) for i in range(first, first + count)]


#: Runs ``ingest run`` in-process and reports what it started: whether Spark's session exists, whether
#: Great Expectations was imported, and which heavy libraries the run loaded.
_PROBE = """
import json, sys
from typer.testing import CliRunner
from ingest.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
loaded = sorted(m for m in ("pyspark", "great_expectations", "pandas", "duckdb") if m in sys.modules)
import pyspark.sql
print(json.dumps({"code": result.exit_code, "output": result.output,
                  "spark": pyspark.sql.SparkSession.getActiveSession() is not None,
                  "gx": "great_expectations" in sys.modules, "loaded": loaded}))
"""


def _run(path: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _PROBE, "run", "-c", str(path), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.spark
def test_a_caught_up_run_starts_neither_spark_nor_great_expectations(config: tuple[Path, IngestConfig]) -> None:
    path, cfg = config
    produce(cfg, TOPIC, _changes(0, 6))
    first = _run(path)  # six records: the driver applies them alone, the suite validated by GX
    assert first["code"] == 0 and not first["spark"] and first["gx"], first["output"]
    assert pending(cfg, list(cfg.tables)) == {"notes": 0}

    again = _run(path)
    assert again["code"] == 0 and not again["spark"] and not again["gx"], again["output"]
    assert first["loaded"] == ["duckdb", "great_expectations", "pandas", "pyspark"], first["loaded"]
    assert again["loaded"] == []  # not even imported: the streaming part loads when a table has work
    assert "Spark was not started" in again["output"]
    assert "│ notes │ 0 " in again["output"]  # the same table as any run, with nothing done

    forced = _run(path, "--full-start")  # the benchmark's switch: the whole start, nothing applied
    assert forced["code"] == 0 and forced["spark"] and "Spark was not started" not in forced["output"]


@pytest.mark.spark
def test_a_record_past_the_delta_log_is_work_and_is_applied(config: tuple[Path, IngestConfig], spark: Any) -> None:
    _, cfg = config
    produce(cfg, TOPIC, _changes(0, 4))
    assert pending(cfg, list(cfg.tables)) == {"notes": 4}
    assert not Runner(cfg, spark=spark).run().failed
    produce(cfg, TOPIC, _changes(4, 3))
    assert pending(cfg, list(cfg.tables)) == {"notes": 3}
    report = Runner(cfg, spark=spark).run()
    assert not report.caught_up and report.tables["notes"].total("inserted") == 3
    assert pending(cfg, list(cfg.tables)) == {"notes": 0}
    assert Runner(cfg, spark=spark).run().caught_up


def test_records_retention_dropped_before_any_run_read_them_are_no_work(config: tuple[Path, IngestConfig],
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    _, cfg = config

    class Retained:
        """A Kafka topic whose partition 0 ends at 10 and holds nothing any more (retention)."""

        def describe(self) -> str:
            return "a topic after retention"

        def topics(self) -> list[str]:
            return [TOPIC]

        def end_offsets(self, topic: str) -> dict[int, int]:
            return {0: 10, 1: 5}

        def start_offsets(self, topic: str) -> dict[int, int]:
            return {0: 10, 1: 2}

    assert pending(cfg, list(cfg.tables), Retained()) == {"notes": 3}  # partition 1 still holds 2..4

    # A table added after retention dropped its topic's beginning would miss rows with nothing to
    # show it: the run says which offsets are gone, and what to do, before it starts.
    spec, state = cfg.tables[0], load_state(cfg.table_path("notes"))
    assert retention_gap(spec, state, Retained()) == {0: (0, 9), 1: (0, 1)}
    with caplog.at_level(logging.WARNING, logger="ingest.stream.caught_up"):
        warn_retention_gap(spec, state, Retained())
    assert len(caplog.records) == 1 and "partition 0 offsets 0..9" in caplog.text
    assert "ingest resnapshot notes" in caplog.text
    produce(cfg, TOPIC, _changes(0, 4))  # the embedded log keeps every record: nothing is ever gone
    assert set(catalog_for(cfg).start_offsets(TOPIC)) == {0, 1}
    assert retention_gap(spec, state, catalog_for(cfg)) == {}


def test_a_table_whose_topic_does_not_exist_is_no_work_and_says_so(config: tuple[Path, IngestConfig],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A misspelled topic ended a run with "every table was caught up" and not a word more."""
    _, cfg = config
    with caplog.at_level(logging.WARNING, logger="ingest.stream.caught_up"):
        assert pending(cfg, list(cfg.tables)) == {"notes": 0}
    assert len(caplog.records) == 1 and f"table notes: topic {TOPIC} does not exist" in caplog.text
    caplog.clear()
    produce(cfg, TOPIC, _changes(0, 1))
    with caplog.at_level(logging.WARNING, logger="ingest.stream.caught_up"):
        assert pending(cfg, list(cfg.tables)) == {"notes": 1}
    assert not caplog.records


def test_a_run_that_starts_spark_says_which_topics_do_not_exist(tmp_path: Path, spark: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A continuous run (or a replay) on a misspelled topic waited without a word."""
    tables = [{"name": "notes", "topic": TOPIC}, {"name": "typo", "topic": "app.nots"}]
    cfg = IngestConfig.model_validate({"workdir": str(tmp_path), "source": {"value_format": "json"}, "tables": tables})
    produce(cfg, TOPIC, _changes(0, 1))
    with caplog.at_level(logging.WARNING, logger="ingest.stream.caught_up"):
        Runner(cfg, spark=spark).run(reset_checkpoints=True)
    assert [r.getMessage().split(",")[0] for r in caplog.records] == ["table typo: topic app.nots does not exist"]


def test_a_caught_up_table_another_run_holds_is_still_refused(config: tuple[Path, IngestConfig]) -> None:
    path, cfg = config
    held = locks.acquire_all(cfg.tables_root, ["notes"], lease_seconds=cfg.target.storage.lease_seconds)
    try:
        done = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(path)], capture_output=True,
                              text=True, cwd=ROOT, timeout=300, check=False)
    finally:
        locks.release_all(held)
    assert done.returncode == 4 and "holds" in done.stderr, done.stderr[-2000:]
