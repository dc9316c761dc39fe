"""A materialization terminated while it drains (docs/dagster.md, "Terminating a run").

``dagster asset materialize`` drains two tables under the project's code location and its
multiprocess executor, each table's step in a process of its own. Once both have committed a batch,
the orchestrating process gets SIGINT, as a run worker does when the run is terminated. Each step's
drain finishes the batch under way and stops, also when the interrupt comes as the drain hands its
rest to Spark; the step succeeds with what it applied (its materialization says the lag left), the
run fails as interrupted, and the next drain applies the rest: every change once, whole batches
only. A step whose drain had applied everything before the interrupt may be stopped by Dagster as it
reports, without a materialization.

A terminal's Ctrl-C sends SIGINT to every process of the command, and Dagster passes it on to the
steps again: each takes that as a second Ctrl-C and stops at once, and may fail without a
materialization. The run still fails as interrupted, and the next drain still applies every change once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.settings import CONFIG_ENV, PROJECT_ROOT
from ingest.config import IngestConfig
from ingest.lake.delta import open_table, read_all
from ingest.records import audit
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce, write_config

CHANGES, BATCH = 4_000, 100
TABLES = ("notes", "tags")


def _committed(config: IngestConfig) -> bool:
    """Whether both tables have a Delta commit (the audit rows come in a run's last commit)."""
    return all(open_table(config.table_path(name)) is not None for name in TABLES)


def _received(audit_path: Path) -> dict[str, list[int]]:
    """Each table's audit rows' received counts, batch by batch."""
    rows = audit.read(audit_path).to_pylist() if open_table(audit_path) is not None else []
    return {table: [r["received"] for r in rows if r["table"] == table] for table in TABLES}


@pytest.mark.parametrize("how", ["terminated", "ctrl-c"])
def test_a_terminated_materialization_commits_whole_batches_and_the_next_applies_the_rest(tmp_path: Path,
                                                                                          how: str) -> None:
    path, config = write_config(tmp_path / "work", batch=BATCH, value_format="json",
                                tables=[{"name": name, "topic": f"app.public.{name}"} for name in TABLES])
    for name in TABLES:
        produce(config, f"app.public.{name}", [("c", {"id": i, "body": f"{name} {i}"}, 10 + i) for i in range(CHANGES)])
    home = tmp_path / "dagster-home"
    home.mkdir()
    env = {**os.environ, CONFIG_ENV: str(path), "DAGSTER_HOME": str(home)}
    audit_path = config.tables_root / config.target.audit_table
    select = ",".join(f"cdc/{name}" for name in TABLES)
    run = subprocess.Popen([sys.executable, "-m", "dagster", "asset", "materialize",
                            "-m", "dagster_project.definitions", "--select", select],
                           cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _committed(config):
            assert run.poll() is None and time.monotonic() < deadline, "both steps did not commit a batch"
            time.sleep(0.2)
        if how == "terminated":
            os.kill(run.pid, signal.SIGINT)  # the orchestrating process alone, as a terminated run's worker
        else:
            os.killpg(run.pid, signal.SIGINT)  # every process of the command, the steps' too
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:  # fail, but leave no Dagster process behind
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()

    assert run.returncode != 0, out[-3000:]
    assert "DagsterExecutionInterruptedError" in out, out[-3000:]
    # No step's traceback before the run's end. A terminal's Ctrl-C reaches Dagster's own helper
    # processes too (watch_orphans.py), which print their KeyboardInterrupt: Dagster's, not a step's.
    # Several of them print at once, their lines interleaved, so a traceback is told by its frames:
    # every frame printed before the run's end must be a helper's.
    frames = re.findall(r'File "([^"]+)"', out.split("RUN_FAILURE")[0])
    assert [f for f in frames if how == "terminated" or not f.endswith("watch_orphans.py")] == [], out[-5000:]
    # The step that started first may have drained its table before the signal; the other stopped early.
    assert min(len(_ids(config, name)) for name in TABLES) < CHANGES
    instance = dg.DagsterInstance.from_config(str(home))
    [record] = instance.get_runs()
    assert record.status == dg.DagsterRunStatus.FAILURE
    if how == "terminated":  # each step took one interrupt: it ended as a success, with what it applied
        stopped = _received(audit_path)
        for name in TABLES:
            assert stopped[name] and all(received == BATCH for received in stopped[name]), stopped
            event = instance.get_latest_materialization_event(dg.AssetKey(["cdc", name]))
            if event is None and sum(stopped[name]) == CHANGES:
                continue  # its drain was over, and Dagster stopped the step as it reported: no lag to check
            assert event is not None and event.asset_materialization is not None, \
                f"step of {name} did not succeed ({sum(stopped[name])} of {CHANGES} applied):\n{out[-6000:]}"
            metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
            assert metadata["lag"] == CHANGES - sum(stopped[name]), metadata
            assert metadata["batches"] == len(stopped[name]), metadata

    # The rest on the driver whatever the machine's load: its first batch's pace could hand it to Spark.
    patient = config.model_copy(update={"source": config.source.model_copy(update={"driver_seconds": 3600})})
    rest = Runner(patient).run()
    assert not rest.failed and rest.on_driver
    done = _received(audit_path)
    for name in TABLES:  # every change once, in whole batches: none lost, none applied twice
        assert sum(done[name]) == CHANGES and all(received == BATCH for received in done[name]), done
        assert _ids(config, name) == list(range(CHANGES))


def _ids(config: IngestConfig, name: str) -> list[int]:
    return sorted(r["id"] for r in read_all(open_table(config.table_path(name))).to_pylist())  # type: ignore[arg-type]
