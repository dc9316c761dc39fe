"""Two writers on one table: the second fails at once (lock), and a race past the lock cannot corrupt it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.apply.journey import apply_parts
from ingest.commit.state import load_state
from ingest.config import IngestConfig, TableSpec, load_config
from ingest.errors import CommitConflictError, TableLockedError
from ingest.lake import locks
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.stream.runner import Runner
from tests.factories import change, decoded_rows, hold_lock_in_another_process
from tests.harness import race_at


def _config(tmp_path: Path) -> IngestConfig:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"workdir": str(tmp_path), "tables": [
        {"name": "orders", "topic": "shop.orders"}, {"name": "customers", "topic": "shop.customers"}]}))
    return load_config(path)


def test_a_second_run_on_a_locked_table_fails_at_once_naming_table_and_holder(tmp_path: Path) -> None:
    config = _config(tmp_path)
    holder = hold_lock_in_another_process(config.tables_root, "orders")
    try:
        started = time.monotonic()
        with pytest.raises(TableLockedError) as caught:
            Runner(config).run()  # no Spark session is started before the lock check
        assert time.monotonic() - started < 5
        message = str(caught.value)
        assert "'orders'" in message and f"pid {holder.pid}" in message and "one `ingest run`" in message
        # Locks taken before the refusal are released: customers is free again.
        locks.TableLock(config.tables_root, "customers").acquire().release()
    finally:
        holder.kill()
        holder.wait()


def test_the_cli_reports_the_locked_table_and_exits_4(tmp_path: Path) -> None:
    config = _config(tmp_path)
    holder = hold_lock_in_another_process(config.tables_root, "customers")
    try:
        result = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(tmp_path / "config.yaml")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 4  # a table failed: another writer holds it
        assert "table 'customers'" in result.stderr and f"pid {holder.pid}" in result.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = hold_lock_in_another_process(tmp_path, "orders")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    locks.TableLock(tmp_path, "orders").acquire().release()  # the kernel released it


def test_the_same_process_cannot_take_a_table_twice(tmp_path: Path) -> None:
    first = locks.TableLock(tmp_path, "orders").acquire()
    try:
        with pytest.raises(TableLockedError, match=f"pid {os.getpid()}"):
            locks.TableLock(tmp_path, "orders").acquire()
    finally:
        first.release()
    locks.TableLock(tmp_path, "orders").acquire().release()


def _paths(tmp_path: Path) -> TablePaths:
    root = tmp_path / "tables"
    return TablePaths(root / "t", root / "_cdc_tombstones" / "t", root / "_cdc_audit", root / "_cdc_quarantine")


def test_a_writer_racing_past_the_lock_gets_a_conflict_and_the_table_stays_consistent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apply_engine: Any) -> None:
    """Optimistic concurrency, on both engines: the loser commits nothing; the winner's batch is intact.

    delta-rs: the loser's MERGE commit fails. delta-spark: the loser planned the same version of the
    table's app transaction, so Delta skips its MERGE, and the engine reports it.
    """
    spec = TableSpec(name="t", topic="t")
    paths = _paths(tmp_path)
    apply_parts(spec, paths, decoded_rows([change("c", k, 10 + k) for k in range(5)]), batch_id=0, run_id="a",
                writer=apply_engine)
    # the other writer commits the same offsets while this one is about to
    race_at(monkeypatch, "before-commit", lambda: apply_parts(
        spec, paths, decoded_rows([change("u", 1, 50, name="winner")], first_offset=5),
        batch_id=1, run_id="b", writer=apply_engine))
    with pytest.raises(CommitConflictError, match="another writer"):
        apply_parts(spec, paths, decoded_rows([change("u", 1, 40, name="loser"), change("c", 9, 41)],
                                              first_offset=5), batch_id=1, run_id="c", writer=apply_engine)
    table = open_table(paths.table)
    rows = {r["id"]: r["name"] for r in read_all(table).to_pylist() if not r["_cdc_deleted"]}
    assert rows == {0: "x", 1: "winner", 2: "x", 3: "x", 4: "x"}
    assert load_state(paths.table).applied_offset("t", 0) == 5


def test_concurrent_runs_on_different_tables_share_audit_and_quarantine_safely(tmp_path: Path) -> None:
    """The shared tables are written under a blocking inter-process lock: both processes' rows arrive."""
    script = textwrap.dedent(f"""
        import sys
        from datetime import datetime, UTC
        from pathlib import Path
        from ingest.records import audit
        from ingest.records.audit import AuditRecord
        name = sys.argv[1]
        for i in range(15):
            audit.append(Path({str(tmp_path / "_cdc_audit")!r}), [AuditRecord(table=name, run_id=name, batch_id=i)])
    """)
    children = [subprocess.Popen([sys.executable, "-c", script, name]) for name in ("left", "right")]
    assert all(c.wait(timeout=120) == 0 for c in children)
    from ingest.records import audit

    rows = audit.read(tmp_path / "_cdc_audit").to_pylist()
    assert sorted((r["table"], r["batch_id"]) for r in rows) == sorted(
        (n, i) for n in ("left", "right") for i in range(15))


@pytest.mark.spark
def test_the_lock_is_released_after_a_run(tmp_path: Path, spark: Any) -> None:
    config = _config(tmp_path)
    Runner(config, spark=spark).run()
    Runner(config, spark=spark).run()  # would raise TableLockedError if the first run kept its locks
    locks.TableLock(config.tables_root, "orders").acquire().release()
