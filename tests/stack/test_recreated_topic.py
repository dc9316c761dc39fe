"""A table whose topic Kafka deleted and Debezium created again, for real
(docs/operations.md#a-topic-that-ends-before-its-table).

On the real stack (PostgreSQL 15, Debezium's JSON connector, Kafka): a pipeline has applied table
``r``'s 40 inserts. The topic is deleted; Debezium recreates it (broker auto-creation) with the next
changes of the table, at offsets from 0. A run stops ``r`` at its start in one line naming the offsets
and the runbook, instead of taking the topic for caught up. The runbook's rebuild, with a re-read of
the table from the database, makes it equal to PostgreSQL again.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ingest.cli.outcome import Exit
from ingest.verify.capture import delete_topics, wait_for_capture
from tests.harness import ingest_cli
from tests.stack.helpers import PREFIX, config_file, fresh_schema, reread_until_equal, stack_config, topic_ends

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "recreated"
TOPIC = f"{PREFIX['json']}.{SCHEMA}.r"


def test_a_topic_created_again_stops_its_table_until_it_is_rebuilt(stack: Any, pg_dsn: str, tmp_path: Path) -> None:
    fresh_schema(stack, pg_dsn, SCHEMA, [TOPIC], f"CREATE TABLE {SCHEMA}.r (id integer PRIMARY KEY, body text)",
                 f"INSERT INTO {SCHEMA}.r SELECT i, 'r ' || i FROM generate_series(1, 40) i")
    config = stack_config("json", tmp_path / "work", schema=SCHEMA, tables=["r"])
    path = config_file(config, tmp_path / "config.yaml")
    done = ingest_cli("run", "-c", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    (applied,) = topic_ends(stack, TOPIC).values()  # the stack's topics have one partition

    delete_topics(stack.bootstrap_servers(), [TOPIC])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {SCHEMA}.r SET body = 'changed' WHERE id <= 3")
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok
    deadline = time.monotonic() + 120
    while sum(topic_ends(stack, TOPIC).values()) < 3:
        assert time.monotonic() < deadline, "Debezium did not write r's changes into its new topic within 120 s"
        time.sleep(1)
    (end,) = topic_ends(stack, TOPIC).values()
    assert end < applied, (end, applied)

    stopped = ingest_cli("run", "-c", str(path))
    said = stopped.stdout + stopped.stderr
    assert stopped.returncode == Exit.TABLE_FAILED, said[-3000:]
    assert (f"table r stopped: table 'r': topic {TOPIC} ends before the offsets the table applied: partition 0 "
            f"ends at offset {end - 1}, the table applied up to {applied - 1}.") in said, said
    assert "Traceback" not in said

    # the runbook: the new topic is the table's source now; it holds only the changes since, so the
    # table is rebuilt from it and read again from the database
    root = config.tables_root
    removed = subprocess.run(f"rm -rf {root}/r {root}/_cdc_tombstones/r {root}/_cdc_moves/r", shell=True, check=False)
    assert removed.returncode == 0
    reread_until_equal(stack, path, pg_dsn, "r", f"{SCHEMA}.r", TOPIC, 40)
