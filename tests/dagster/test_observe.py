"""Observe mode (issue 46, point 4): a pipeline running as a service, seen by Dagster without Spark.

A real ``ingest run --continuous`` (a subprocess) applies two tables' changes; then, in another
process, the definitions of the same configuration in ``dagster.mode: observe`` record its commits:
the audit sensor turns each committed batch into a materialization of its (external) table whose
figures are the audit row's, a second tick records nothing new, and Spark was never started there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ingest.config import load_config
from ingest.records import audit
from tests.dagster.conftest import produce, write_config

pytestmark = pytest.mark.spark

#: Dagster's view, from a process of its own: the sensor's two ticks, and whether Spark started.
VIEW = """
import json, sys
import dagster as dg
from assets.definitions import build_definitions
from assets.resources import SparkIngestPipeline
from ingest.config import load_config

path = sys.argv[1]
engine = SparkIngestPipeline(config_path=path)
defs = build_definitions(load_config(path), engine)
graph = defs.get_repository_def().asset_graph
out = {"assets": sorted(k.to_user_string() for k in graph.get_all_asset_keys()),
       "materializable": sorted(k.to_user_string() for k in graph.materializable_asset_keys)}
sensor = defs.get_repository_def().get_sensor_def("cdc_audit_sensor")
instance = dg.DagsterInstance.ephemeral()
first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, resources={"ingest_pipeline": engine}))
out["events"] = [{"key": e.asset_key.to_user_string(),
                  "metadata": {k: v.value for k, v in e.metadata.items() if k not in ("offsets", "committed_at")}}
                 for e in first.asset_events]
second = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=first.cursor,
                                                      resources={"ingest_pipeline": engine}))
out["second"] = second.skip_message
out["spark"] = "pyspark" in sys.modules and __import__("pyspark").SparkContext._active_spark_context is not None
print(json.dumps(out))
"""

def test_a_service_run_then_dagsters_view_of_it_without_spark(tmp_path: Path) -> None:
    path, config = write_config(tmp_path / "work", batch=7, value_format="json",
                                tables=[{"name": "notes", "topic": "app.public.notes"},
                                        {"name": "tags", "topic": "app.public.tags"}])
    raw = yaml.safe_load(path.read_text())
    raw["dagster"] = {"mode": "observe"}
    path.write_text(yaml.safe_dump(raw))
    produce(config, "app.public.notes", [("c", {"id": i, "body": f"n{i}"}, 10 + i) for i in range(20)])
    produce(config, "app.public.tags", [("c", {"id": i, "body": "t"}, 10 + i) for i in range(3)])
    service = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "-c", str(path), "--continuous"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ},
                               start_new_session=True)
    audit_path = config.tables_root / config.target.audit_table
    try:
        deadline = time.monotonic() + 300
        while sum(r["received"] for r in audit.read(audit_path).to_pylist()) < 23:
            assert service.poll() is None and time.monotonic() < deadline, "the service did not apply 23 records"
            time.sleep(1)
    finally:
        service.send_signal(signal.SIGINT)
        try:
            service.wait(timeout=120)
        except subprocess.TimeoutExpired:  # fail, but leave no service (and its JVM) running behind
            os.killpg(service.pid, signal.SIGKILL)
            raise

    view = subprocess.run([sys.executable, "-c", VIEW, str(path)], capture_output=True, text=True, timeout=300)
    assert view.returncode == 0, view.stderr[-3000:]
    seen = json.loads(view.stdout.strip().splitlines()[-1])
    assert seen["assets"] == ["cdc/notes", "cdc/tags"] and seen["materializable"] == []  # external: the service's
    committed = [r for r in audit.read(audit_path).to_pylist() if r["status"] == "committed"]
    assert len(seen["events"]) == len(committed) >= 4
    by_version = {(r["table"], r["delta_version"]): r for r in committed}
    for event in seen["events"]:
        row = by_version[(event["key"].split("/")[1], event["metadata"]["delta_version"])]
        assert {k: event["metadata"][k] for k in ("received", "inserted", "batch_id")} == \
            {k: row[k] for k in ("received", "inserted", "batch_id")}
    assert sum(e["metadata"]["inserted"] for e in seen["events"]) == 23
    assert seen["second"] == "no commit since the last tick"  # each commit recorded once
    assert seen["spark"] is False
    assert load_config(path).dagster.mode == "observe"
