"""``ingest resnapshot``: a live incremental snapshot of one table (issue 43, point 3).

On the real stack (PostgreSQL 15, Debezium's Avro connector with its Kafka signal channel): a table
of 3,000 rows is ingested; 200 of its rows are then deleted from the lake behind the engine's back.
While a workload updates, deletes and inserts rows of the table being read (all but the lost ones,
which only the snapshot can bring back), ``ingest resnapshot`` asks the connector to read the table
again, and runs apply what arrives. The table ends equal to PostgreSQL (``verify --source-db``: no
resurrected deletes, no lost updates, the lost rows back) and the audit counts the snapshot reads.
MariaDB is not in this stack yet.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from ingest.records import audit
from ingest.stream.runner import Runner
from ingest.verify.capture import wait_for_capture
from ingest.verify.source_db import verify_source_db
from tests.stack.helpers import PREFIX, config_file, fresh_schema, stack_config

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "resnap"
TOPIC = f"{PREFIX['avro']}.{SCHEMA}.items"
ROWS = 3000


def _workload(dsn: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Updates, deletes and inserts of the table's keys, in small transactions, until ``stop``."""
    rng = random.Random(43)
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_id = ROWS + 1
        while not stop.is_set():
            with conn.transaction():
                for _ in range(10):
                    key = rng.randrange(1, ROWS + 1)
                    if key % 15 == 0:  # the rows the lake lost: only the snapshot brings them back
                        continue
                    roll = rng.random()
                    if roll < 0.7:
                        conn.execute(f"UPDATE {SCHEMA}.items SET qty = qty + 1, note = %s WHERE id = %s",
                                     (f"changed {rng.random():.6f}", key))
                        counts["updated"] += 1
                    elif roll < 0.85:
                        conn.execute(f"DELETE FROM {SCHEMA}.items WHERE id = %s", (key,))
                        counts["deleted"] += 1
                    else:
                        conn.execute(f"INSERT INTO {SCHEMA}.items VALUES (%s, 1, 'new')", (next_id,))
                        next_id += 1
                        counts["inserted"] += 1
            time.sleep(0.05)


def test_a_live_resnapshot_repairs_the_table_while_its_keys_keep_changing(stack: Any, pg_dsn: str, spark: Any,
                                                                          tmp_path: Path) -> None:
    fresh_schema(stack, pg_dsn, SCHEMA, [TOPIC],
                 f"CREATE TABLE {SCHEMA}.items (id integer PRIMARY KEY, qty integer NOT NULL, note text)",
                 f"INSERT INTO {SCHEMA}.items SELECT i, i % 7, 'first ' || i FROM generate_series(1, {ROWS}) i")
    config = stack_config("avro", tmp_path / "work", schema=SCHEMA, tables=["items"])
    path = config_file(config, tmp_path / "config.yaml")

    first = Runner(config, spark=spark).run()
    assert not first.failed and first.tables["items"].total("received") == ROWS
    # the damage: rows gone from the lake, not from the source
    DeltaTable(str(config.table_path("items"))).delete("id % 15 = 0")
    assert verify_source_db(config, pg_dsn, wait=60).tables[0].verification.missing == ROWS // 15  # type: ignore[union-attr]

    stop, counts = threading.Event(), {"updated": 0, "deleted": 0, "inserted": 0}
    workload = threading.Thread(target=_workload, args=(pg_dsn, stop, counts), daemon=True)
    workload.start()
    try:
        time.sleep(2)
        asked = subprocess.run([sys.executable, "-m", "ingest.cli", "resnapshot", "items", "-c", str(path)],
                               capture_output=True, text=True, timeout=120)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert f"{SCHEMA}.items" in asked.stdout and "pgavro-signal" in asked.stdout
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the snapshot's chunks interleave with the changes
            report = Runner(config, spark=spark).run()
            assert not report.failed, {n: t.error for n, t in report.tables.items()}
    finally:
        stop.set()
        workload.join(timeout=30)
    assert counts["updated"] > 100 and counts["deleted"] > 10, counts

    reads = 0
    for _ in range(24):  # until the snapshot has read every chunk
        assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok
        report = Runner(config, spark=spark).run()
        assert not report.failed, {n: t.error for n, t in report.tables.items()}
        rows = audit.read(config.tables_root / config.target.audit_table, table="items")
        reads = int(pc.sum(rows["snapshot_reads"]).as_py() or 0)
        result = verify_source_db(config, pg_dsn, wait=60, on_stall=stack.unstick_capture)
        if result.ok:
            break
        time.sleep(5)
    assert result.ok, [(t.table, t.verification and t.verification.examples, t.error) for t in result.tables]
    # every row the source held when its chunk was read, less those a change overtook
    assert ROWS - counts["deleted"] - 300 < reads <= ROWS + counts["inserted"], (reads, counts)
