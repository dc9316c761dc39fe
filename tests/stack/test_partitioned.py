"""A partitioned PostgreSQL table reaches the lake as one table (docs/getting-started.md#what-you-need).

On the stack the publication is set to ``publish_via_partition_root``: Debezium then writes the
changes of every partition to the partitioned table's topic, and none to a partition's. A row whose
partition key changes moves to another partition: it arrives as a delete and a create, since the
primary key includes the partition key. The engine applies the one topic, and ``verify`` finds the
table equal to a SELECT of the partitioned table, which reads every partition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness import ingest_cli
from tests.stack.helpers import PREFIX, change_count, fresh_schema, json_events, stack_config, write_config

pytestmark = [pytest.mark.stack]


def test_a_partitioned_table_is_one_topic_and_one_table_equal_to_its_source(
        stack: Any, pg_dsn: str, tmp_path: Path) -> None:
    schema = "partitioned"  # a previous run's schema and topics are dropped first
    topics = [f"{prefix}.{schema}.{table}" for prefix in PREFIX.values() for table in ("ev", "ev_jan", "ev_feb")]
    fresh_schema(
        stack, pg_dsn, schema, topics,
        f"CREATE TABLE {schema}.ev (id integer, day date, note text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)",
        f"CREATE TABLE {schema}.ev_jan PARTITION OF {schema}.ev FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')",
        f"CREATE TABLE {schema}.ev_feb PARTITION OF {schema}.ev FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')",
        f"INSERT INTO {schema}.ev VALUES (1, '2024-01-05', 'a'), (2, '2024-02-05', 'b'), (3, '2024-01-07', 'c')",
        f"UPDATE {schema}.ev SET day = '2024-02-10', note = 'moved' WHERE id = 1",  # to the other partition
        f"UPDATE {schema}.ev SET note = 'bb' WHERE id = 2",
        f"DELETE FROM {schema}.ev WHERE id = 3")
    root = f"{PREFIX['json']}.{schema}.ev"
    events = [(e["payload"]["op"], (e["payload"]["before"] or e["payload"]["after"])["id"]) for e in json_events(root)]
    assert events == [("c", 1), ("c", 2), ("c", 3), ("d", 1), ("c", 1), ("u", 2), ("d", 3)]
    for partition in ("ev_jan", "ev_feb"):  # nothing under a partition's name
        assert change_count(f"{PREFIX['json']}.{schema}.{partition}") == 0

    config = write_config(stack_config("json", tmp_path / "work", schema=schema, tables=["ev"]), tmp_path / "c.yaml")
    run = ingest_cli("run", "-c", str(config))
    assert run.returncode == 0, run.stdout + run.stderr
    verify = ingest_cli("verify", "-c", str(config), "--source-db", pg_dsn)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "every table equals its source table" in verify.stdout
