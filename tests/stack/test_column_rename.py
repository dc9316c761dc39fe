"""The runbooks "A column renamed or dropped at the source" and "A column added with a default"
(docs/operations.md), for real.

On the real stack (PostgreSQL 15, Debezium's JSON connector): a table is ingested, then one of its
columns is dropped, another renamed and a third added with a default. The run goes on without
stopping: the new name becomes a new column, and the rows changed since then carry it, while the
others keep the old column's value; the added column is null in the rows that did not change, and
the run says so, naming the default Debezium's schema gives (``ingest verify --source-db`` shows
those rows). ``ingest resnapshot`` reads every row again, after which the table equals PostgreSQL,
the old columns hold nothing but nulls and the added one its default.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pytest

from ingest.lake.delta import open_table, read_all
from ingest.stream.runner import Runner
from ingest.verify.capture import wait_for_capture
from tests.harness import ingest_cli
from tests.stack.helpers import PREFIX, config_file, fresh_schema, stack_config

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "colren"
TOPIC = f"{PREFIX['json']}.{SCHEMA}.t"
ROWS = 30



def test_a_renamed_a_dropped_and_a_defaulted_column(stack: Any, pg_dsn: str, spark: Any, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    fresh_schema(stack, pg_dsn, SCHEMA, [TOPIC],
                 f"CREATE TABLE {SCHEMA}.t (id integer PRIMARY KEY, a text, b integer, c text)",
                 f"INSERT INTO {SCHEMA}.t SELECT i, 'a' || i, i, 'c' || i FROM generate_series(1, {ROWS}) i")
    config = stack_config("json", tmp_path / "work", schema=SCHEMA, tables=["t"])
    path = config_file(config, tmp_path / "config.yaml")
    assert not Runner(config, spark=spark).run().failed

    # Step 1: the source drops c, renames a and adds d with a default; some rows change afterwards.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {SCHEMA}.t DROP COLUMN c")
        conn.execute(f"ALTER TABLE {SCHEMA}.t RENAME COLUMN a TO a2")
        conn.execute(f"ALTER TABLE {SCHEMA}.t ADD COLUMN d text DEFAULT 'it''s d'")
        conn.execute(f"UPDATE {SCHEMA}.t SET b = b + 100 WHERE id <= 5")
        conn.execute(f"INSERT INTO {SCHEMA}.t (id, a2, b) VALUES ({ROWS + 1}, 'new', 0)")
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok

    # Step 2: the run goes on; a2 and d are new columns, filled only where a row changed since,
    # and the run names d's default.
    with caplog.at_level("WARNING", logger="ingest.apply.journey"):
        report = Runner(config, spark=spark).run()
    assert not report.failed, report.tables["t"].error
    warned = [r.getMessage() for r in caplog.records if r.name == "ingest.apply.journey"]
    assert len(warned) == 1 and warned[0].startswith("table 't': new column 'd' (source default 'it''s d'): "), \
        warned
    rows = {r["id"]: r for r in read_all(open_table(config.table_path("t"))).to_pylist()}  # type: ignore[arg-type]
    assert {"a", "a2", "c", "d"} <= set(rows[1])
    assert rows[1]["a2"] == "a1" and rows[1]["a"] is None and rows[1]["c"] is None and rows[1]["b"] == 101
    assert rows[1]["d"] == "it's d" and rows[ROWS + 1]["d"] == "it's d"
    assert rows[10]["a2"] is None and rows[10]["a"] == "a10" and rows[10]["c"] == "c10" and rows[10]["d"] is None
    verify = ingest_cli("verify", "-c", str(path), "--source-db", pg_dsn, "--wait", "60")
    assert verify.returncode == 1, verify.stdout + verify.stderr

    # Step 3: read every row again; the table then equals the source.
    asked = ingest_cli("resnapshot", "t", "-c", str(path))
    assert asked.returncode == 0, asked.stdout + asked.stderr
    for _ in range(12):  # nothing ingests between runs: a snapshot still arriving is the next run's
        time.sleep(5)
        assert not Runner(config, spark=spark).run().failed
        verify = ingest_cli("verify", "-c", str(path), "--source-db", pg_dsn, "--wait", "10")
        if verify.returncode == 0:
            break
    assert verify.returncode == 0, verify.stdout + verify.stderr
    table = read_all(open_table(config.table_path("t")))  # type: ignore[arg-type]
    live = table.filter(pc.invert(pc.fill_null(table["_cdc_deleted"], False))) if "_cdc_deleted" in \
        table.column_names else table
    assert live.num_rows == ROWS + 1
    assert live["a"].null_count == live.num_rows and live["c"].null_count == live.num_rows
    assert live["a2"].null_count == 0 and set(live["d"].to_pylist()) == {"it's d"}
