"""Discovery against the real broker: Kafka's topic list, its internal topics left out, odd topics refused,
and a whole PostgreSQL schema ingested by pattern with delta-spark -- a table created while the run goes
on included -- then compared with PostgreSQL itself."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from ingest import secrets
from ingest.config import DiscoverySpec
from ingest.errors import ConfigError
from ingest.source.discovery import with_discovered
from ingest.source.kafka_admin import admin_config
from ingest.source.sources import KafkaSource, source_for
from tests.stack.helpers import stack_config

pytestmark = pytest.mark.stack

_TABLES = {
    "accounts": "id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2)",
    "events": "id bigint PRIMARY KEY, kind text, happened_at timestamptz NOT NULL",
    "line_items": "order_id int, line int, qty smallint, PRIMARY KEY (order_id, line)",
}
_LATE = ("refunds", "id int PRIMARY KEY, amount numeric(10,2), reason text")


def _create(conn: psycopg.Connection, schema: str, table: str, columns: str) -> None:
    conn.execute(sql.SQL("CREATE TABLE {}.{} (" + columns + ")").format(  # type: ignore[operator]
        sql.Identifier(schema), sql.Identifier(table)))


def test_kafka_topics_are_discovered_and_a_transaction_topic_is_refused(stack: Any, tmp_path: Path) -> None:
    config = stack_config("json", tmp_path / "work")
    spec = config.source.kafka
    assert spec is not None
    prefix = f"disc{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}.public.alpha", f"{prefix}.public.beta-2", f"{prefix}.transaction"]
    admin = AdminClient(admin_config(spec, secrets.lookup(spec.credentials_env, config.secrets_path)))
    for future in admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names]).values():
        future.result(timeout=30)
    try:
        source = source_for(config)
        assert isinstance(source, KafkaSource)
        topics = source.topics()
        assert set(names) <= set(topics) and not any(t.startswith("__") for t in topics)

        tables = config.model_copy(update={"tables": (), "discover": DiscoverySpec(
            topic_pattern=rf"{prefix}\.public\.[^.]+", defaults={"delete_mode": "soft"})})
        found = with_discovered(tables, source).tables
        assert [(t.name, t.topic, t.delete_mode) for t in found] == [
            ("public_alpha", names[0], "soft"), ("public_beta_2", names[1], "soft")]

        wide = tables.model_copy(update={"discover": DiscoverySpec(topic_pattern=rf"{prefix}\..+")})
        with pytest.raises(ConfigError, match=rf"'{prefix}\.transaction' matches discover\.topic_pattern"):
            with_discovered(wide, source)
    finally:
        for future in admin.delete_topics(names).values():
            future.result(timeout=30)


@pytest.mark.spark
def test_a_whole_schema_is_discovered_ingested_while_running_and_equals_postgres(
        stack: Any, spark: Any, pg_dsn: str, tmp_path: Path) -> None:
    from ingest.lake.delta import has_deletion_vectors, open_table, read_all
    from ingest.ops.verify_source import verify_source_db
    from ingest.stream.runner import Runner
    from ingest.verify.capture import wait_for_capture

    schema = f"disc{uuid.uuid4().hex[:8]}"  # fresh topics, whatever ran on this stack before
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for table, columns in _TABLES.items():
            _create(conn, schema, table, columns)
        q = sql.Identifier(schema)
        conn.execute(sql.SQL("INSERT INTO {}.accounts SELECT i, 'owner ' || i, i * 1.25 FROM generate_series(1, 40) i")
                     .format(q))
        conn.execute(sql.SQL("INSERT INTO {}.events SELECT i, 'k' || (i % 3), now() FROM generate_series(1, 60) i")
                     .format(q))
        conn.execute(sql.SQL("INSERT INTO {}.line_items SELECT i / 4, i % 4, i FROM generate_series(4, 50) i")
                     .format(q))
        conn.execute(sql.SQL("UPDATE {}.accounts SET balance = balance * 2 WHERE id % 5 = 0").format(q))
        conn.execute(sql.SQL("DELETE FROM {}.events WHERE id % 7 = 0").format(q))
        conn.execute(sql.SQL("DELETE FROM {}.line_items WHERE line = 2").format(q))

    base = stack_config("json", tmp_path / "work", tables=[])
    # The discovered tables are applied by delta-spark (issue 13, point 5: Kafka with either engine;
    # the other stack tests apply with delta-rs, tests/test_discovery.py mixes both on the embedded log).
    config = base.model_copy(update={"discover": DiscoverySpec(
        topic_pattern=rf"pgjson\.{schema}\.[^.]+", table_name="{table}", refresh_seconds=2,
        defaults={"engine": "delta-spark"})})
    assert config.tables == ()
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok  # the first three topics exist
    reports: list[Any] = []
    engine = Runner(config, spark=spark)
    runner = threading.Thread(target=lambda: reports.append(engine.run(mode="continuous", stop_after=300)))
    runner.start()
    deadline = time.monotonic() + 120
    while not all((config.table_path(t) / "_delta_log").exists() for t in _TABLES) and time.monotonic() < deadline:
        time.sleep(1)
    # A table created while the run goes on: its topic appears later and is picked up without a restart.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _create(conn, schema, *_LATE)
        conn.execute(sql.SQL("INSERT INTO {}.refunds SELECT i, i * 0.5, 'late' FROM generate_series(1, 12) i")
                     .format(sql.Identifier(schema)))
        conn.execute(sql.SQL("DELETE FROM {}.refunds WHERE id = 3").format(sql.Identifier(schema)))

    def late_rows() -> int:
        # delta-spark makes _delta_log before the table's first commit: open_table is None until then.
        table = open_table(config.table_path(_LATE[0]))
        return read_all(table).num_rows if table is not None else 0

    while late_rows() != 11 and time.monotonic() < deadline + 90:  # 12 inserted, one deleted
        time.sleep(1)
    engine.stop()
    runner.join(timeout=120)
    (report,) = reports
    assert not report.failed, {t: r.error for t, r in report.tables.items() if r.error}
    assert sorted(report.tables) == sorted([*_TABLES, _LATE[0]])

    found = with_discovered(config)
    assert sorted(t.name for t in found.tables) == sorted([*_TABLES, _LATE[0]])
    verdict = verify_source_db(found, pg_dsn, wait=120, on_stall=stack.unstick_capture)
    assert verdict.ok, [(c.table, c.error, c.verification) for c in verdict.tables]
    by_table = {c.table: c.verification for c in verdict.tables}
    assert [by_table[t].actual_rows for t in ("accounts", "events", "line_items", "refunds")] == [40, 52, 35, 11]
    assert all(has_deletion_vectors(open_table(config.table_path(t))) for t in [*_TABLES, _LATE[0]])
