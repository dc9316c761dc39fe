"""The runbook "Adding a table to a running deployment" (docs/operations.md), step by step, for real.

On the real stack (PostgreSQL 15, Debezium's JSON connector, Kafka): a pipeline runs table ``a``.
Table ``b`` has been captured for a while, but its topic's retention has already dropped the first
changes (here by Kafka's own ``deleteRecords``, what retention does when it expires a segment), so
the rows inserted then are in the database and in no topic. Added to the configuration, ``b``
starts from what the topic still holds, and the run says, in one line, which offsets are gone and
what to do; ``ingest verify --source-db`` shows the missing rows; ``ingest resnapshot b`` has
Debezium read the table again, and the next runs make it equal to PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from ingest.verify.capture import wait_for_capture
from tests.harness import ingest_cli
from tests.stack.helpers import PREFIX, config_file, fresh_schema, reread_until_equal, stack_config, topic_ends

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "addtbl"
TOPICS = {t: f"{PREFIX['json']}.{SCHEMA}.{t}" for t in ("a", "b")}



def test_adding_a_table_whose_topic_lost_its_beginning(stack: Any, pg_dsn: str, tmp_path: Path) -> None:
    fresh_schema(stack, pg_dsn, SCHEMA, list(TOPICS.values()), *[
        statement for t in TOPICS for statement in (
            f"CREATE TABLE {SCHEMA}.{t} (id integer PRIMARY KEY, body text)",
            f"INSERT INTO {SCHEMA}.{t} SELECT i, '{t} ' || i FROM generate_series(1, 40) i")])
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers()})
    ends = topic_ends(stack, TOPICS["b"])
    assert ends, "Debezium has not created b's topic"
    cut = [TopicPartition(TOPICS["b"], p, end) for p, end in ends.items()]
    for future in admin.delete_records(cut).values():  # retention: b's first 40 inserts are gone
        future.result(30)

    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # changes after the cut are still in the topic
        conn.execute(f"UPDATE {SCHEMA}.b SET body = 'changed' WHERE id <= 5")
        conn.execute(f"INSERT INTO {SCHEMA}.b VALUES (41, 'b 41')")
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok

    path = tmp_path / "config.yaml"
    running = stack_config("json", tmp_path / "work", schema=SCHEMA, tables=["a"])
    config_file(running, path)
    done = ingest_cli("run", "-c", str(path))
    assert done.returncode == 0, done.stderr[-2000:]

    # Step 1-2: the table goes into the configuration, and the run starts again.
    added = stack_config("json", tmp_path / "work", schema=SCHEMA, tables=["a", "b"])
    config_file(added, path)
    done = ingest_cli("run", "-c", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    warning = [line for line in done.stderr.splitlines() if "table b:" in line]
    assert len(warning) == 1 and "(retention)" in warning[0] and "ingest resnapshot b" in warning[0], done.stderr
    assert "Traceback" not in done.stderr

    # Step 3: verify shows what is missing: b holds only the rows changed after the cut.
    verify = ingest_cli("verify", "-c", str(path), "--source-db", pg_dsn, "-t", "b", "--wait", "60")
    assert verify.returncode == 1 and "b" in verify.stdout, verify.stdout + verify.stderr

    # Steps 4-5: re-read the table from the database while the deployment runs; once Debezium has read
    # b's 41 rows again into its topic, the next run applies them and verify says equal.
    reread_until_equal(stack, path, pg_dsn, "b", f"{SCHEMA}.b", TOPICS["b"], 41)
