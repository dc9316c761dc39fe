"""Cuts through a whole run: the engine ends the group's tables at one transaction boundary per batch.

The bank's tables are read with a per-table bound that falls inside transactions, on both writers.
A reader who reads the tables' latest versions between two tables' commits sees broken invariants;
a reader of any published cut never does, and the run publishes a cut for most of its batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ingest.cli import app
from ingest.commit.state import load_state
from ingest.cuts import store
from ingest.lake.layout import TablePaths
from ingest.source.topiclog import TopicLog
from ingest.stream import checkpoint
from ingest.stream.queries import query_name
from ingest.stream.runner import Runner
from tests.cuts import bank
from tests.cuts.test_cuts import read_at

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_a_run_publishes_a_cut_per_batch_and_every_cut_holds(tmp_path: Path, spark: Any, writer: str):
    workdir = tmp_path / "bank"
    config = bank.config(workdir, writer=writer, per_table=7)
    source = bank.Bank(seed=11)
    source.snapshot()
    for i in range(30):
        source.touch() if i % 7 == 3 else source.transfer()
    source.produce(TopicLog(config.log_dir))
    seen: list[dict[str, int | None]] = []

    def progress(_table: str, _record: Any, _result: Any) -> None:
        seen.append({t: load_state(TablePaths.of(config, t).table).version for t in ("accounts", "ledger")})

    report = Runner(config, spark=spark).run(progress=progress)
    assert not report.failed
    cuts = store.every(config.tables_root / config.target.cuts_table)
    batches = len(report.tables["accounts"].batches)
    assert batches >= 8  # 65 accounts records, 7 a batch
    assert len(cuts) >= batches - 2, f"{len(cuts)} cuts for {batches} batches"
    assert all(read_at(config, c.versions) == [] for c in cuts)
    assert sum(bool(read_at(config, v)) for v in seen) >= 1, "no read of the latest versions was broken"
    assert cuts[-1].txn == source.txns[-1]
    assert report.cuts is not None and report.cuts.latest == cuts[-1]
    # Every record is applied: the tails left out were read again.
    log = TopicLog(config.log_dir)
    assert [report.tables[t].total("received") for t in ("accounts", "ledger")] == [
        log.end_offsets(bank.ACCOUNTS)[0], log.end_offsets(bank.LEDGER)[0]]

    cli = CliRunner()
    out = cli.invoke(app, ["query", "-c", str(workdir / "config.yaml"), "--consistent", "--format", "json",
                           "SELECT CAST(sum(balance) AS BIGINT) AS total FROM accounts"])
    assert out.exit_code == 0, out.output
    assert '{"total": 500}' in out.stdout and f"at cut #{cuts[-1].cut}" in out.output
    status = cli.invoke(app, ["status", "-c", str(workdir / "config.yaml")])
    assert status.exit_code == 0, status.output
    assert f"cut #{cuts[-1].cut} at transaction {cuts[-1].txn}" in status.output

    # A Spark reader at the cut's versions (the way docs/consistency.md gives) sees the same money.
    total = 0
    for row in spark.read.format("delta").option("versionAsOf", cuts[-1].versions["accounts"]).load(
            (config.tables_root / "accounts").spark_uri).where("NOT coalesce(_cdc_deleted, false)").collect():
        total += row["balance"]
    assert total == 500

    # A deliberate replay without the Spark checkpoint changes no table and publishes no cut.
    replay = Runner(config, spark=spark).run(reset_checkpoints=True, from_beginning=True)
    assert not replay.failed and store.every(config.tables_root / config.target.cuts_table) == cuts
    assert replay.cuts is not None and replay.cuts.published == 0

    # The query read the transaction topic too: its checkpoint says so, and a restart keeps it.
    directory = config.checkpoint_location / query_name(list(config.tables))
    tables = {s.topic: ((lambda p, t=s.name: load_state(TablePaths.of(config, t).table).applied_offset(
        config.table(t).topic, p)), s.name) for s in config.tables}
    assert not checkpoint.inspect(directory, topics=tables).ok
    assert checkpoint.inspect(directory, topics=tables, others=[bank.TRANSACTIONS]).ok
