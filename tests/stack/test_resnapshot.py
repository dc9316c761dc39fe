"""``ingest resnapshot``: a live incremental snapshot of one table (issue 43, point 3), on both sources.

On the real stack -- PostgreSQL 15 and MariaDB 10.11, each through its Debezium Avro connector with a
signal table; PostgreSQL's connector is asked through its Kafka signal topic, MariaDB's (whose stack
connector takes no signals from Kafka) through its signal table: a table of 3,000 rows is ingested;
200 of its rows are then deleted from the lake behind the engine's back. While a workload updates,
deletes and inserts rows of the table being read (all but the lost ones, which only the snapshot can
bring back), ``ingest resnapshot`` asks the connector to read the table again, and runs apply what
arrives. The table ends equal to its database (``verify --source-db``: no resurrected deletes, no
lost updates, the lost rows back) and the audit counts the snapshot reads. A read that contradicts
the change streamed before it (made to happen below) the runs ask their connector to read again
(``source.kafka.reread_suspect_reads``), through the same channel.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from harness.mariadb import capture as maria_capture
from harness.stack.tools import ensure_gdb

from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError
from ingest.ops.check import run_checks
from ingest.ops.resnapshot import Signal, insert
from ingest.ops.verify_source import verify_source_db
from ingest.records import audit
from ingest.stream.runner import Runner
from ingest.verify.capture import delete_topics, wait_for_capture
from tests.stack.helpers import PREFIX, avro_history, config_file, fresh_schema, stack_config, stale_reads

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "resnap"
ROWS = 3000


@dataclass
class Source:
    """One source database as the test drives it."""

    name: str
    url: str
    ask: list[str]  # ``ingest resnapshot``'s options that say where the signal goes
    asked_through: str  # what its output names as where the signal went
    config: IngestConfig
    connect: Callable[[], Any]  # an autocommit DB-API connection
    captured: Callable[[], bool]  # waits until Debezium has captured what is committed
    topic: str


@contextmanager
def _transaction(conn: Any) -> Iterator[None]:
    if isinstance(conn, psycopg.Connection):
        with conn.transaction():
            yield
    else:
        conn.begin()
        yield
        conn.commit()


def _asking(config: IngestConfig, **kafka: Any) -> IngestConfig:
    """``config`` whose runs ask the connector to read suspect reads again (``kafka``: more settings of
    ``source.kafka``)."""
    spec = config.source.kafka
    assert spec is not None
    settings = {"reread_suspect_reads": True, **kafka}
    return config.model_copy(update={"source": config.source.model_copy(update={
        "kafka": spec.model_copy(update=settings)})})


def _postgres(stack: Any, workdir: Path, unstick: Callable[[], None]) -> Source:
    dsn = stack.pg_dsn()
    topic = f"{PREFIX['avro']}.{SCHEMA}.items"
    fresh_schema(stack, dsn, SCHEMA, [topic],
                 f"CREATE TABLE {SCHEMA}.items (id integer PRIMARY KEY, qty integer NOT NULL, note text)",
                 f"INSERT INTO {SCHEMA}.items SELECT i, i % 7, 'first ' || i FROM generate_series(1, {ROWS}) i")
    # its connector takes signals from Kafka: the runs ask it there to read suspect reads again
    config = _asking(stack_config("avro", workdir, schema=SCHEMA, tables=["items"]))
    return Source("postgresql", dsn, [], "pgavro-signal", config,
                  lambda: psycopg.connect(dsn, autocommit=True),
                  lambda: wait_for_capture(dsn, timeout=120, on_stall=unstick).ok, topic)


def _mariadb(stack: Any, workdir: Path, unstick: Callable[[], None]) -> Source:
    s = stack.settings
    topic = f"mariaavro.{SCHEMA}.items"

    connect = stack.component("mariadb").connect
    with connect() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {SCHEMA}")
        delete_topics(stack.bootstrap_servers(), [topic])
        cur.execute(f"CREATE DATABASE {SCHEMA}")
        cur.execute(f"CREATE TABLE {SCHEMA}.items (id INT PRIMARY KEY, qty INT NOT NULL, note TEXT)")
        cur.execute(f"INSERT INTO {SCHEMA}.items SELECT seq, seq % 7, CONCAT('first ', seq) "
                    f"FROM {SCHEMA}.seq_1_to_{ROWS}")
    assert maria_capture.wait_for_capture(stack, timeout=120).ok
    url = s.mariadb_url(SCHEMA)
    signal_table = f"{s.mariadb_db}.debezium_signal"
    # its connector takes no signals from Kafka: the runs ask it through its signal table, in the
    # database CDC_SIGNAL_DB names (the test sets it)
    config = _asking(stack_config("avro", workdir), signal_table=signal_table)
    config = config.model_copy(update={"tables": (TableSpec(name="items", topic=topic),)})
    return Source("mariadb", url, ["--signal-table", signal_table, "--source-db", url], signal_table, config, connect,
                  lambda: maria_capture.wait_for_capture(stack, timeout=120).ok, topic)


def _workload(connect: Callable[[], Any], stop: threading.Event, counts: dict[str, int]) -> None:
    """Updates, deletes and inserts of the table's keys, in small transactions, until ``stop``."""
    rng = random.Random(43)
    with connect() as conn:
        next_id = ROWS + 1
        while not stop.is_set():
            with _transaction(conn):
                for _ in range(10):
                    key = rng.randrange(1, ROWS + 1)
                    if key % 15 == 0:  # the rows the lake lost: only the snapshot brings them back
                        continue
                    roll = rng.random()
                    if roll < 0.7:
                        conn.cursor().execute(f"UPDATE {SCHEMA}.items SET qty = qty + 1, note = %s WHERE id = %s",
                                              (f"changed {rng.random():.6f}", key))
                        counts["updated"] += 1
                    elif roll < 0.85:
                        conn.cursor().execute(f"DELETE FROM {SCHEMA}.items WHERE id = %s", (key,))
                        counts["deleted"] += 1
                    else:
                        conn.cursor().execute(f"INSERT INTO {SCHEMA}.items VALUES (%s, 1, 'new')", (next_id,))
                        next_id += 1
                        counts["inserted"] += 1
            time.sleep(0.05)


def _differing_keys(result: Any) -> set[int]:
    """The ids the verification's examples name."""
    examples = [e for t in result.tables for e in ((t.verification and t.verification.examples) or [])]
    return {int(m.group(1)) for e in examples if (m := re.search(r"\(id=(\d+)\)", e))}


def _explain(result: Any, topic: str, path: Path) -> str:
    """The verification's differences, and what the topic holds for the keys that differ: whether
    Debezium emitted a change the table lost, or a snapshot read after a change it does not hold."""
    examples = [e for t in result.tables for e in ((t.verification and t.verification.examples) or [])]
    errors = [t.error for t in result.tables if t.error]
    keys = _differing_keys(result)
    history = avro_history(topic, "id", keys) if keys else {}
    stored: list[dict[str, Any]] = []
    if keys:
        table = DeltaTable(str(path)).to_pyarrow_table()
        columns = ["id", "qty", "note", "_cdc_op", "_cdc_position", "_cdc_partition", "_cdc_offset"]
        wanted = pc.is_in(table["id"], pa.array(sorted(keys), table["id"].type))
        stored = table.filter(wanted).select(columns).to_pylist()
    return "\n".join([*examples, *map(str, errors), *(f"topic, id={k}: {h}" for k, h in sorted(history.items())),
                      *(f"lake: {row}" for row in stored)])


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_a_live_resnapshot_repairs_the_table_while_its_keys_keep_changing(stack: Any, spark: Any, tmp_path: Path,
                                                                          monkeypatch: Any, database: str) -> None:
    restarts: list[float] = []  # when Kafka Connect was restarted for a stalled capture, if it was
    began = time.monotonic()

    def unstick() -> None:
        restarts.append(round(time.monotonic() - began, 1))
        stack.unstick_capture()

    source = (_postgres if database == "postgresql" else _mariadb)(stack, tmp_path / "work", unstick)
    monkeypatch.setenv("CDC_SIGNAL_DB", source.url)  # where MariaDB's runs insert their signals
    config = source.config
    path = config_file(config, tmp_path / "config.yaml")

    first = Runner(config, spark=spark).run()
    assert not first.failed and first.tables["items"].total("received") == ROWS
    # the damage: rows gone from the lake, not from the source
    DeltaTable(str(config.table_path("items"))).delete("id % 15 = 0")
    damaged = verify_source_db(config, source.url, wait=5).tables[0].verification
    assert damaged is not None and damaged.missing == ROWS // 15

    stop, counts = threading.Event(), {"updated": 0, "deleted": 0, "inserted": 0}
    workload = threading.Thread(target=_workload, args=(source.connect, stop, counts), daemon=True)
    workload.start()
    try:
        time.sleep(2)
        asked = _resnapshot(path, "items", *source.ask)
        assert f"{SCHEMA}.items" in asked and source.asked_through in asked
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
        assert source.captured()
        report = Runner(config, spark=spark).run()
        assert not report.failed, {n: t.error for n, t in report.tables.items()}
        reads = _audited(config, "items")
        result = verify_source_db(config, source.url, wait=10, on_stall=unstick)
        if result.ok:
            break
        time.sleep(5)
    assert result.ok, f"Kafka Connect restarted at {restarts} s\n" + _explain(result, source.topic,
                                                                         config.table_path("items"))
    # every row the source held when its chunk was read, less those a change overtook, and the rows read again
    again = _audited(config, "items", "suspect_reads")
    assert ROWS - counts["deleted"] - 300 < reads <= ROWS + counts["inserted"] + again, (reads, counts, again)



def _resnapshot(path: Path, table: str, *ask: str) -> str:
    """``ingest resnapshot`` as a user runs it; its output."""
    asked = subprocess.run([sys.executable, "-m", "ingest.cli", "resnapshot", table, "-c", str(path), *ask],
                           capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    return asked.stdout


def _audited(config: IngestConfig, table: str, column: str = "snapshot_reads") -> int:
    """A count the audit kept for ``table`` (default: its snapshot reads), over all its batches."""
    rows = audit.read(config.tables_root / config.target.audit_table, table=table)
    return int(pc.sum(rows[column]).as_py() or 0)


def _until(what: str, done: Callable[[], bool], seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(0.5)


def _read_before_visible(gdb: str, dsn: str, schema: str, topic: str, path: Path, key: int, release: Path, *,
                         delete: bool = False) -> None:
    """Update row ``key`` (or delete it) and hold its backend in the moment its commit is in the WAL but
    not visible, while ``ingest resnapshot`` reads the row's chunk; returns once the chunk's read is in
    the topic."""
    held = psycopg.connect(dsn)
    held.execute(f"DELETE FROM {schema}.t WHERE id = {key}" if delete
                 else f"UPDATE {schema}.t SET note = 'changed' WHERE id = {key}")
    holder = subprocess.Popen(
        [gdb, "-p", str(held.info.backend_pid), "-batch", "-ex", "break ProcArrayEndTransaction", "-ex", "continue",
         "-ex", f"shell while [ ! -e {release} ]; do sleep 0.1; done", "-ex", "detach"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    committer = threading.Thread(target=held.commit)
    try:
        assert holder.stdout is not None
        for line in holder.stdout:  # the breakpoint is set; gdb lets the backend run on to it
            if line.startswith("Breakpoint 1 at"):
                break
        time.sleep(1)
        committer.start()

        def history() -> list[dict[str, Any]]:
            return avro_history(topic, "id", {key})[key]

        _until("Debezium to stream the held change", lambda: history()[-1]["op"] == ("d" if delete else "u"))
        with psycopg.connect(dsn, autocommit=True) as other:  # committed in the WAL, not visible yet
            assert other.execute(f"SELECT note FROM {schema}.t WHERE id = {key}").fetchone() == (f"first {key}",)
        _resnapshot(path, "t")
        _until("the chunk's read", lambda: history()[-1]["op"] == "r")
    finally:
        release.touch()
        if committer.is_alive():
            committer.join(timeout=60)
        holder.wait(timeout=60)
        held.close()
    assert stale_reads({key: history()}) == {key}, history()


def test_a_chunk_read_before_a_commit_is_visible_is_read_again(stack: Any, spark: Any, tmp_path: Path,
                                                               caplog: Any) -> None:
    """The limit docs/operations.md states for PostgreSQL, made to happen: a commit is in the WAL (and
    Debezium streams it) a moment before other sessions can see it. gdb holds a committing backend in
    that moment (at ProcArrayEndTransaction, which makes a transaction visible) while a re-snapshot
    reads the row's chunk: Debezium emits the row as it was before the update, after the update.

    The engine names the read (it contradicts the update before it). By default it logs the command
    that reads the row again; the lake keeps the older row, ``verify --source-db`` names it, and that
    command (``--where``) repairs it. With ``reread_suspect_reads`` the run asks the connector itself,
    and the next runs end equal to PostgreSQL. A read held so after a delete brings back a row that
    reading again cannot remove (PostgreSQL no longer holds it): the run applies it as the delete."""
    gdb = ensure_gdb(print)
    dsn, schema = stack.pg_dsn(), "resnap_visible"
    topic = f"{PREFIX['avro']}.{schema}.t"
    fresh_schema(stack, dsn, schema, [topic], f"CREATE TABLE {schema}.t (id integer PRIMARY KEY, note text)",
                 f"INSERT INTO {schema}.t SELECT i, 'first ' || i FROM generate_series(1, 10) i")
    config = stack_config("avro", tmp_path / "work", schema=schema, tables=["t"])
    path = config_file(config, tmp_path / "config.yaml")
    assert not Runner(config, spark=spark).run().failed

    # By hand: the run names the row and says how to read it again.
    _read_before_visible(gdb, dsn, schema, topic, path, 5, tmp_path / "release-5")
    assert wait_for_capture(dsn, timeout=120).ok
    with caplog.at_level("WARNING", logger="ingest.stream.rereads"):
        assert not Runner(config, spark=spark).run().failed
    assert 'to read them again: ingest resnapshot t --where "id IN (5)"' in caplog.text, caplog.text
    assert _audited(config, "t", "suspect_reads") == 1
    stale = verify_source_db(config, dsn, wait=10).tables[0].verification
    assert stale is not None and (stale.different, stale.missing, stale.unexpected) == (1, 0, 0), stale
    assert "(id=5)" in " ".join(stale.examples), stale.examples
    _resnapshot(path, "t", "--where", "id IN (5)")  # the command the run gave
    reads_before = _audited(config, "t")

    def repaired(config: IngestConfig) -> Callable[[], bool]:
        def check() -> bool:
            assert not Runner(config, spark=spark).run().failed
            return verify_source_db(config, dsn, wait=10).ok
        return check

    _until("the second re-snapshot to repair the row", repaired(config))
    assert _audited(config, "t") == reads_before + 1  # that row alone was read again
    assert _audited(config, "t", "suspect_reads") == 1  # a read after a read is not suspect

    # By the engine: the run that applies the stale read asks for the row again.
    asking = _asking(config)
    (ready,) = run_checks(asking, only=lambda name: name == "signals")  # ingest check: where the run will ask
    assert ready.ok and "signal topic pgavro-signal" in ready.detail, ready
    _read_before_visible(gdb, dsn, schema, topic, path, 6, tmp_path / "release-6")
    assert wait_for_capture(dsn, timeout=120).ok
    reads_before = _audited(config, "t")
    caplog.clear()
    with caplog.at_level("WARNING", logger="ingest.stream.rereads"):
        _until("the engine's re-read to repair the row", repaired(asking))
    assert "asked the connector to read id IN (6) again" in caplog.text, caplog.text
    assert _audited(config, "t", "suspect_reads") == 2
    assert _audited(config, "t") == reads_before + 10 + 1  # the table's 10 rows, then row 6 again

    # A read after a delete: reading the row again reads nothing, so the read is applied as the delete.
    _read_before_visible(gdb, dsn, schema, topic, path, 7, tmp_path / "release-7", delete=True)
    assert wait_for_capture(dsn, timeout=120).ok
    caplog.clear()
    with caplog.at_level("WARNING", logger="ingest.stream.rereads"):
        assert not Runner(asking, spark=spark).run().failed
    assert "1 of the reads follow a delete and are applied as it" in caplog.text, caplog.text
    assert _audited(config, "t", "suspect_reads") == 3
    assert verify_source_db(config, dsn, wait=10).ok  # row 7 is gone from the lake, as from PostgreSQL


#: A composite key whose text the condition must quote (an apostrophe, a 4-byte character) and a date.
TAMPERED = ((3, "o'hare", "2026-01-03"), (7, "k\u00f8ge \U0001F686", "2026-01-07"))


def _composite(stack: Any, database: str, db: str, monkeypatch: Any) -> tuple[str, str, list[str], str]:
    """Table ``t`` keyed by ``(id, region, day)`` with ten rows, two of them :data:`TAMPERED`; its topic,
    its database's URL, ``ingest resnapshot``'s options and what the ask is sent through."""
    regions = {key[0]: key[1] for key in TAMPERED}
    rows = [(i, regions.get(i, f"r{i}"), f"2026-01-{i:02d}", f"first {i}") for i in range(1, 11)]
    if database == "postgresql":
        dsn, topic = stack.pg_dsn(), f"{PREFIX['avro']}.{db}.t"
        fresh_schema(stack, dsn, db, [topic],
                     f"CREATE TABLE {db}.t (id integer, region text, day date, note text, "
                     "PRIMARY KEY (id, region, day))")
        with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {db}.t VALUES (%s, %s, %s, %s)", rows)
        assert wait_for_capture(dsn, timeout=120, on_stall=stack.unstick_capture).ok
        return topic, dsn, [], "pgavro-signal"
    s, signals, topic = stack.settings, f"{stack.settings.mariadb_db}.debezium_signal", f"mariaavro.{db}.t"
    with stack.component("mariadb").connect() as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        delete_topics(stack.bootstrap_servers(), [topic])
        cur.execute(f"CREATE DATABASE {db}")
        cur.execute(f"CREATE TABLE {db}.t (id INT, region VARCHAR(20) CHARACTER SET utf8mb4, day DATE, note TEXT, "
                    "PRIMARY KEY (id, region, day))")
        cur.executemany(f"INSERT INTO {db}.t VALUES (%s, %s, %s, %s)", rows)
    assert maria_capture.wait_for_capture(stack, timeout=120).ok
    url = s.mariadb_url(db)
    monkeypatch.setenv("CDC_SIGNAL_DB", url)  # where the runs insert their signal
    return topic, url, ["--signal-table", signals, "--source-db", url], signals


@pytest.mark.parametrize("database", ["postgresql", "mariadb"])
def test_rows_changed_behind_the_engines_back_are_read_again_by_their_composite_keys(
        stack: Any, spark: Any, tmp_path: Path, monkeypatch: Any, caplog: Any, database: str) -> None:
    """A row changed in the lake behind the engine's back is the other kind of suspect read: a
    re-snapshot's read of it contradicts the streamed row the lake holds. The runs ask the connector
    to read such rows again by a condition on their whole key, which the database itself evaluates:
    here a key of an integer, text that needs quoting and a date, on both databases, each through its
    channel (PostgreSQL's connector its Kafka signal topic; MariaDB's, which takes no signals from Kafka,
    its signal table in the database ``CDC_SIGNAL_DB`` names). The table's ten rows are read, then
    exactly the two tampered ones again."""
    db = "resnap_tamper"
    topic, url, ask, asked_through = _composite(stack, database, db, monkeypatch)
    config = _asking(stack_config("avro", tmp_path / "work"),
                     **({"signal_table": ask[1]} if database == "mariadb" else {}))
    config = config.model_copy(update={"tables": (TableSpec(name="t", topic=topic),)})
    path = config_file(config, tmp_path / "config.yaml")
    (ready,) = run_checks(config, only=lambda name: name == "signals")  # ingest check: where the run will ask
    assert ready.ok and asked_through in ready.detail, ready
    assert not Runner(config, spark=spark).run().failed
    DeltaTable(str(config.table_path("t"))).update(updates={"note": "'tampered'"},
                                                   predicate=" OR ".join(f"id = {k[0]}" for k in TAMPERED))
    assert not verify_source_db(config, url, wait=10).ok
    _resnapshot(path, "t", *ask)

    def read_again() -> bool:
        assert not Runner(config, spark=spark).run().failed
        return _audited(config, "t") > 10

    with caplog.at_level("WARNING", logger="ingest.stream.rereads"):
        _until("the runs to apply the snapshot and the rows read again", read_again)
    assert "asked the connector to read (id, region, day) IN ((" in caplog.text, caplog.text
    assert f"again ({asked_through}" in caplog.text, caplog.text
    assert (_audited(config, "t"), _audited(config, "t", "suspect_reads")) == (12, 2)
    assert verify_source_db(config, url, wait=10).ok


def test_postgresql_takes_a_signal_row_as_written(stack: Any) -> None:
    """PostgreSQL's signal-table insert (MariaDB's is the run above), into a table no connector reads."""
    from ingest.verify import pg_source  # psycopg's module: as the resnapshot command loads it

    row = ("an-id", "execute-snapshot", '{"data-collections": ["public.t"], "type": "incremental"}')
    with pg_source.connect(stack.pg_dsn()) as conn:
        conn.execute("CREATE TEMP TABLE signals (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data text)")
        pg_source.insert_signal(conn, "pg_temp.signals", row)
        assert conn.execute("SELECT id, type, data FROM pg_temp.signals").fetchall() == [row]
    signal = Signal("pgavro", "pgavro-signal", ("public.t",), ("t",))
    with pytest.raises(ConfigError, match=r'^signal table public.no_such_signals: relation "public.no_such_signals"'):
        insert(pg_source, stack.pg_dsn(), "public.no_such_signals", [signal])
