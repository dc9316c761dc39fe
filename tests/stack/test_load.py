"""The load generator on the real PostgreSQL: it holds its rate and survives losing its connection."""

from __future__ import annotations

import time

import psycopg
import pytest
from harness.postgres import schema as pg_schema
from harness.postgres.load import LoadGenerator
from harness.postgres.workload import WorkloadSpec, run_workload

pytestmark = pytest.mark.stack

SCHEMA = "loadtest"


@pytest.fixture(scope="module")
def schema(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        pg_schema.reset(conn, SCHEMA)
    run_workload(pg_dsn, WorkloadSpec(seed=3, scale=0.05, schema=SCHEMA))
    return SCHEMA


def _load_orders(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {SCHEMA}.orders WHERE id >= 1000000000").fetchone()
    return int(row[0]) if row else 0


def test_holds_the_target_rate_and_counts_what_it_committed(pg_dsn: str, schema: str) -> None:
    before = _load_orders(pg_dsn)
    # A rate the generator reaches beside the other test workers on two cores: at 150 changes/s it
    # committed 73/s there once (a clean-clone make test of c92a7c3): the test measured the machine.
    report = LoadGenerator(pg_dsn, rate=50, duration=4, seed=5, schema=schema).run()
    assert 0.75 * 200 <= report.committed_changes <= 1.1 * 200 + 20, report
    assert report.failed_transactions == report.uncertain_transactions == report.reconnects == 0
    # Each transaction wrote one order; about a tenth also deleted one of the generator's earlier orders.
    written = _load_orders(pg_dsn) - before
    assert 0.8 * report.committed_transactions <= written <= report.committed_transactions


def test_reconnects_after_its_sessions_are_terminated(pg_dsn: str, schema: str) -> None:
    generator = LoadGenerator(pg_dsn, rate=50, duration=6, seed=6, schema=schema,
                              application_name="load-test-reconnect").start()
    time.sleep(2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE application_name = 'load-test-reconnect'").fetchone()[0]  # type: ignore[index]
    report = generator.join(timeout=30)
    assert killed == 1
    assert report.reconnects >= 1 and report.last_error
    assert report.committed_changes >= 0.6 * 300, report  # the rate recovered after the reconnect
