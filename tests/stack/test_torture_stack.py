"""``ingest torture --stack``, the CI version: one fault of each kind, then the verdict, and the verdict failing.

Six faults (an ingest SIGKILL at a named point, a broker, a Connect, a registry, a PostgreSQL and a
MariaDB restart) in a seeded order while the load generators write 100 changes/s to PostgreSQL and
50 to MariaDB and ``ingest run --continuous`` ingests both databases' ``shoptort`` (Avro, registry
through nginx basic auth). Then the checks must find every table equal to its database, no
duplicate key, every audit row balanced and every topic record received once. Afterwards a row
deleted and a key duplicated behind the engine's back must make the same checks fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from harness.stack_proofs.check import check_stack
from harness.stack_proofs.faults import KINDS
from harness.stack_proofs.torture import StackTorture, StackTortureResult, StackTortureSpec

from ingest.config import load_config

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def tortured(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[StackTortureResult, list[str], Path]:
    workdir = tmp_path_factory.mktemp("torture-stack") / "run"
    lines: list[str] = []
    spec = StackTortureSpec(workdir=workdir, seed=3, faults=len(KINDS), rate=100.0, schema="shoptort", scale=0.1,
                            pause=(3.0, 8.0), named_fraction=1.0, wait=240.0)
    result = StackTorture(spec, say=lines.append, stack=stack).run()
    return result, lines, workdir


def test_every_kind_of_fault_and_nothing_diverged(tortured: tuple[StackTortureResult, list[str], Path]) -> None:
    result, lines, _ = tortured
    assert result.by_kind() == {k: 1 for k in KINDS}
    assert [line.split(":")[0] for line in lines if line.startswith("fault ")] == [
        f"fault {n:>3}/{len(KINDS)} at {f.at:>6.0f} s" for n, f in enumerate(result.faults, 1)]
    assert result.ok, "\n".join(lines + (result.check.problems if result.check else []) + [result.failure or ""])
    check = result.check
    assert check is not None and check.divergent_rows == check.duplicate_keys == check.unbalanced_audit_rows == 0
    assert check.records == check.received > 5_000
    assert check.source_rows == check.delta_rows > 0 and check.quarantined == 0
    assert check.audit_rows == check.commits > 0
    assert result.final_exit == 0 and result.load is not None and result.load.committed_changes > 3_000
    # MariaDB: its tables compared with MariaDB, under its own load and a restart
    assert result.mariadb_load is not None and result.mariadb_load.committed_changes > 1_000
    assert check.mariadb_verification is not None and check.mariadb_verification.ok
    assert {t.table for t in check.mariadb_verification.tables} == {"mariadb_customers", "mariadb_orders",
                                                                     "mariadb_order_items"}
    # Broker, registry and database restarts are ridden out by the continuous run itself: no ingest
    # process ended on its own (the watch would restart it, hiding the outage from the verdict).
    assert result.watch is not None and result.watch.unexpected_exits == [], result.watch
    # The one ingest kill was armed at a named point: killed once from outside, once there (or from
    # outside again if the point was not reached in time).
    assert sum(result.kills.values()) == 2 and result.kills["outside"] >= 1


def test_the_checks_fail_on_a_lost_row_and_a_duplicate_key(tortured: tuple[StackTortureResult, list[str], Path],
                                                          pg_dsn: str, stack: Any) -> None:
    _, _, workdir = tortured
    config = load_config(workdir / "engine" / "config.yaml")
    items = DeltaTable(str(config.table_path("order_items")))
    rows = items.to_pyarrow_table()
    victim = rows.slice(0, 1)
    items.delete(f"order_id = {victim['order_id'][0].as_py()} AND line_no = {victim['line_no'][0].as_py()}")
    orders_path = str(config.table_path("orders"))
    some = DeltaTable(orders_path).to_pyarrow_table()
    twin = some.filter(pc.equal(some["id"], some["id"][0]))
    write_deltalake(orders_path, twin, mode="append")
    check = check_stack(config, pg_dsn, wait=60, mariadb_url=stack.settings.mariadb_url("shoptort"))
    assert not check.ok
    assert check.duplicate_keys == 1 and check.divergent_rows >= 2  # one missing item, one unexpected order row
    assert any("order_items" in p and "missing" in p for p in check.problems), check.problems
    assert any("duplicate key" in p for p in check.problems), check.problems
