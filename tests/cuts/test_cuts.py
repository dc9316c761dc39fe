"""Cuts across tables through the journey and the lake: a reader at a cut never sees half a transaction.

The bank (tests/cuts/bank.py) moves money between accounts in transactions that touch both of its
tables. Its tables are applied here in batches that end in the middle of transactions; after each
batch the publisher looks for a newer cut. Every cut must satisfy the bank's invariants, and the
tables' latest versions must be seen to break them in the same run (so the check can fail).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ingest.apply.journey import apply_parts
from ingest.cli import app
from ingest.commit.state import OpenTables, load_state
from ingest.config import IngestConfig
from ingest.cuts import store
from ingest.cuts.publish import Publisher
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.lake.layout import TablePaths
from ingest.read.consistent import ConsistencyError, cut_for, run_consistent
from ingest.read.query import AsOf, run_sql
from ingest.source.topiclog import TopicLog
from tests.cuts import bank
from tests.harness import current_writer

# delta-rs only: the mark travels in the commit info both writers build alike (ingest.commit.writer), and
# tests/cuts/test_run.py runs the whole path on delta-spark too.
pytestmark = [pytest.mark.usefixtures("apply_engine"),
              pytest.mark.parametrize("apply_engine", ["delta-rs"], indirect=True)]


def read_at(config: IngestConfig, versions: dict[str, int | None]) -> list[str]:
    """The bank's invariant violations in a read of both tables at ``versions``."""
    points = [AsOf(version=v, table=t) for t, v in versions.items() if v is not None]
    absent = [t for t, v in versions.items() if v is None]
    accounts = run_sql(config, "SELECT id, balance FROM accounts", points, absent=absent).to_pylist() \
        if "accounts" not in absent else []
    ledger = run_sql(config, "SELECT account, amount FROM ledger", points, absent=absent).to_pylist() \
        if "ledger" not in absent else []
    return bank.violations(accounts, ledger, 5) if accounts else []


class Applier:
    """Applies each table's records from the embedded log, a chosen number at a time."""

    def __init__(self, config: IngestConfig) -> None:
        self.config, self.log = config, TopicLog(config.log_dir)
        self.done = {"accounts": 0, "ledger": 0}
        self.opened = {t: OpenTables(TablePaths.of(config, t), t) for t in self.done}

    def step(self, table: str, count: int) -> None:
        spec = self.config.table(table)
        end = min(self.log.end_offsets(spec.topic).get(0, 0), self.done[table] + count)
        if end <= self.done[table]:
            return
        rows = self.log.read(spec.topic, 0, self.done[table], end)
        parts = BatchDecoder(DecoderSpec("json")).decode(rows)
        result = apply_parts(spec, TablePaths.of(self.config, table), parts, writer=current_writer(),
                             opened=self.opened[table], run_id="test", batch_id=end)
        assert result.record is None or result.record.balanced
        self.done[table] = end

    def versions(self) -> dict[str, int | None]:
        return {t: load_state(TablePaths.of(self.config, t).table).version for t in self.done}


def given_bank(tmp_path: Path, transfers: int, *, touch: bool = False) -> tuple[IngestConfig, bank.Bank]:
    """The bank's pipeline on this test's writer, and its snapshot and ``transfers`` in the topics (then a
    transaction of one table, with ``touch``)."""
    config = bank.config(tmp_path / "bank", writer=current_writer().name)
    source = bank.Bank()
    source.snapshot()
    for _ in range(transfers):
        source.transfer()
    if touch:
        source.touch()
    source.produce(TopicLog(config.log_dir))
    return config, source


def test_every_cut_holds_whole_transactions_while_the_latest_versions_do_not(tmp_path: Path):
    # the last transaction touches one table: the other's version stays exact for it
    config, source = given_bank(tmp_path, 12, touch=True)
    applier, publisher = Applier(config), Publisher(config, "test")
    broken_latest = 0
    # Each table in steps that end inside transactions, or at the same boundary (accounts: 5 snapshot
    # reads, then 2 changes a transfer; ledger: 2 a transfer).
    for accounts_step, ledger_step in [(3, 0), (4, 3), (2, 1), (3, 2), (1, 3), (4, 2), (5, 2), (2, 5), (99, 99)]:
        applier.step("accounts", accounts_step)
        broken_latest += bool(read_at(config, applier.versions()))
        applier.step("ledger", ledger_step)
        broken_latest += bool(read_at(config, applier.versions()))
        publisher.attempt()
    cuts = store.every(config.tables_root / config.target.cuts_table)
    assert broken_latest >= 3, "the latest versions never broke the invariants: the check could not fail"
    assert len(cuts) >= 2  # the batches of both tables end at transaction 2, and at the end
    for cut in cuts:
        assert read_at(config, cut.versions) == [], f"cut #{cut.cut} at {cut.txn}"
    assert [c.cut for c in cuts] == list(range(1, len(cuts) + 1))
    assert cuts[-1].txn == source.txns[-1] and cuts[-1].versions == applier.versions()
    # A reader at the latest cut, and at an earlier one by its transaction, number or time.
    rows, cut = run_consistent(config, "SELECT sum(balance) AS total FROM accounts")
    assert cut == cuts[-1] and rows.to_pylist() == [{"total": 500}]
    first = cuts[0]
    assert first.commit_ts is not None and first.position is not None
    for point in (first.txn, "#1", first.commit_ts.isoformat(), first.position):
        assert cut_for(config, point) == first, point
    with pytest.raises(ConsistencyError, match="no cut at or before it; the first is #1"):
        cut_for(config, "2001-01-01T00:00:00Z")


def test_publishing_again_or_replaying_changes_no_cut(tmp_path: Path):
    config, source = given_bank(tmp_path, 4)
    applier = Applier(config)
    applier.step("accounts", 99)
    applier.step("ledger", 99)
    first = Publisher(config, "one").attempt()
    assert first.published == 1 and first.latest is not None and first.latest.txn == source.txns[-1]
    # A second run, and a replay of every record from offset 0: nothing is applied, nothing published.
    again = Applier(config)
    again.step("accounts", 99)
    again.step("ledger", 99)
    assert again.versions() == applier.versions()
    second = Publisher(config, "two").attempt()
    assert second.published == 0 and second.latest == first.latest
    assert len(store.every(config.tables_root / config.target.cuts_table)) == 1


def test_changes_without_transaction_metadata_cannot_be_read_consistently(tmp_path: Path):
    config = bank.config(tmp_path / "bank", writer=current_writer().name)
    source = bank.Bank()
    source.snapshot()
    source.transfer()
    # the connector without provide.transaction.metadata: no transaction block
    source.records[bank.ACCOUNTS] = [r.__class__(r.partition, r.key, r.value.replace(b'"transaction": {', b'"x": {'),
                                                 r.timestamp_ms) for r in source.records[bank.ACCOUNTS]]
    source.produce(TopicLog(config.log_dir))
    applier = Applier(config)
    applier.step("accounts", 99)
    applier.step("ledger", 99)
    outcome = Publisher(config).attempt()
    assert outcome.latest is None
    assert "2 of its streamed changes carry no transaction block" in (outcome.error or "")
    result = CliRunner().invoke(app, ["query", "-c", str(tmp_path / "bank" / "config.yaml"), "--consistent",
                                      "SELECT count(*) FROM accounts"])
    assert result.exit_code == 2, result.output
    assert "no cut published yet for bank.transaction" in result.output
    assert "Traceback" not in result.output


def test_a_configuration_without_a_group_refuses_consistent_reads(tmp_path: Path):
    config = bank.config(tmp_path / "bank", group=False)
    with pytest.raises(ConsistencyError, match=r"set source\.transactions\.topic"):
        cut_for(config)


def test_a_group_table_must_come_from_the_connector(tmp_path: Path):
    from ingest.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("source: {transactions: {topic: bank.transaction}}\n"
                    "tables: [{name: a, topic: other.public.a}]\n")
    with pytest.raises(Exception, match=r"not from the connector that writes 'bank\.transaction'"):
        load_config(path)




def test_a_stopped_table_stops_new_cuts_and_says_why(tmp_path: Path):
    config, _source = given_bank(tmp_path, 1)
    applier = Applier(config)
    applier.step("accounts", 99)
    applier.step("ledger", 99)
    stopped = Publisher(config).attempt({"ledger": "QualityGateError: amount out of range"})
    assert stopped.latest is None and stopped.published == 0
    assert stopped.waiting == {"ledger": "stopped: QualityGateError: amount out of range"}
    assert "waiting for ledger: stopped: QualityGateError" in stopped.describe()
    assert Publisher(config).attempt().published == 1  # running again, it publishes
