"""Replaying quarantined messages: after a fix, idempotent, ordered, without moving the stream's offsets."""

from __future__ import annotations

import pytest

from ingest.commit.state import load_state
from ingest.errors import QualityGateError
from ingest.lake.delta import open_table, read_all
from ingest.ops.replay import REPLAY_BATCH, replay_quarantine
from ingest.read.query import history
from ingest.records import audit, quarantine
from tests.quality.helpers import ACCOUNTS_SUITE, TOPIC, accounts_paths, ingest, live, pending, write_suite

# Replays commit with the table's engine: the cases whose commit differs run on both (issue 11); the
# others (selection, re-checks, in-batch ordering) are the same driver code whatever the engine.
both_engines = pytest.mark.usefixtures("apply_engine")

EMAIL = "expect_column_values_to_match_regex(email)"


def fix_suite(config, regex="^[^@]+(?:@| at )[^@ ]+$"):
    """The 'fix': the suite accepts ' at ' e-mails (a file change reloads the suite)."""
    suite = [dict(e) for e in ACCOUNTS_SUITE]
    suite[2] = {**suite[2], "kwargs": {"column": "email", "regex": regex}}
    write_suite(config.expectations_dir, "accounts", suite)


@both_engines
def test_replay_after_a_fix_applies_and_a_second_replay_is_a_no_op(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1), src.message("c", 2, email="b at x.io"), src.message("c", 3)], 0)
    assert set(live(config)) == {1, 3} and len(pending(config)) == 1
    offsets = load_state(accounts_paths(config).table).applied_offset(TOPIC, 0)
    assert offsets == 2

    still = replay_quarantine(config, "accounts")  # not fixed yet: re-checked, still held, nothing committed
    assert still.selected == 1 and still.replayed == 0 and still.record is None
    assert [reason for _, reason in still.still_held] == [f"{EMAIL}: observed email='b at x.io'"]

    fix_suite(config)
    version = open_table(accounts_paths(config).table).version()
    report = replay_quarantine(config, "accounts")
    assert report.replayed == 1 and report.record.inserted == 1 and report.record.balanced
    assert live(config)[2]["email"] == "b at x.io" and pending(config) == []
    table = open_table(accounts_paths(config).table)
    assert table.version() == version + 1
    # the stream's progress did not move
    assert load_state(accounts_paths(config).table).applied_offset(TOPIC, 0) == offsets
    (stamped,) = quarantine.read(accounts_paths(config).quarantine).to_pylist()
    assert stamped["replayed_at"] is not None and stamped["replay_version"] == table.version()
    replays = [r for r in audit.read(accounts_paths(config).audit).to_pylist() if r["batch_id"] == REPLAY_BATCH]
    assert len(replays) == 1 and replays[0]["status"] == "replayed" and replays[0]["balanced"]
    # `ingest history` tells the replay's commit from the stream's (it listed it as kind "cdc")
    assert [c.kind for c in history(config, "accounts")[:2]] == ["replay", "cdc"]

    again = replay_quarantine(config, "accounts")
    assert again.selected == 0 and open_table(accounts_paths(config).table).version() == version + 1


@both_engines
def test_a_stale_quarantined_change_never_overwrites_newer_data(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1, email="first@x.io")], 0)
    ingest(config, [src.message("u", 1, email="bad at x.io")], 1)  # held
    ingest(config, [src.message("u", 1, email="newest@x.io")], 2)  # newer, applied
    fix_suite(config)
    report = replay_quarantine(config, "accounts")
    assert report.replayed == 1 and report.record.stale == 1 and report.record.updated == 0
    assert live(config)[1]["email"] == "newest@x.io"


@both_engines
def test_replay_does_not_resurrect_a_deleted_key(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1, qty=500)], 0)  # qty out of range: held
    ingest(config, [src.message("c", 2), src.message("d", 1)], 1)
    report = replay_quarantine(config, "accounts", recheck=False)  # bypass the suite on purpose
    assert report.replayed == 1 and report.record.stale == 1 and set(live(config)) == {2}


def test_replay_without_recheck_applies_the_held_key_history_in_order(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1, status="ok"), src.message("u", 1, status="gold", qty=7)], 0)
    assert len(pending(config)) == 2 and live(config) == {}
    report = replay_quarantine(config, "accounts", recheck=False)
    assert report.replayed == 2 and report.record.inserted == 1 and report.record.superseded == 1
    assert live(config)[1]["status"] == "gold" and live(config)[1]["qty"] == 7


def test_replay_can_pick_messages_and_keeps_undecodable_ones_held(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1, status="x"), src.message("c", 2, status="y"), src.garbage()], 0)
    assert len(pending(config)) == 3
    report = replay_quarantine(config, "accounts", ids=[(TOPIC, 0, 1)], recheck=False)
    assert report.selected == 1 and report.replayed == 1 and set(live(config)) == {2}
    decode = replay_quarantine(config, "accounts", stage="decode")
    assert decode.selected == 1 and decode.replayed == 0 and decode.still_held[0][0][3] == "decode"
    assert {(r["offset"], r["stage"]) for r in pending(config)} == {(0, "quality"), (2, "decode")}


def test_a_recheck_under_fail_policy_raises_and_applies_nothing(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1, email="bad at x.io")], 0)
    write_suite(config.expectations_dir, "accounts",
                [{**ACCOUNTS_SUITE[2], "meta": {"policy": "fail"}}])
    with pytest.raises(QualityGateError, match=r"bad at x\.io"):
        replay_quarantine(config, "accounts")
    assert len(pending(config)) == 1 and live(config) == {}


@both_engines
def test_a_replayed_change_lands_in_its_place_in_a_scd2_history(tmp_path):
    """scd2 (issue 12): a change the gate held, replayed after the fix, becomes the version it was,
    between its neighbours -- where scd1 can only call it stale."""
    from datetime import UTC, datetime

    from tests.quality.helpers import Accounts, make_config

    config = make_config(tmp_path, tables=[{"name": "accounts", "topic": TOPIC, "expectations": "accounts",
                                            "quality_policy": "quarantine", "history_mode": "scd2"}])
    write_suite(config.expectations_dir, "accounts", ACCOUNTS_SUITE)
    src = Accounts()
    ingest(config, [src.message("c", 1, email="first@x.io", at=2000)], 0)
    ingest(config, [src.message("u", 1, email="b at x.io", at=3000)], 1)  # held
    ingest(config, [src.message("u", 1, email="newest@x.io", at=4000)], 2)
    fix_suite(config)
    offsets = load_state(accounts_paths(config).table).applied_offset(TOPIC, 0)
    report = replay_quarantine(config, "accounts")
    assert report.replayed == 1 and report.record.inserted == 1 and report.record.balanced

    def at(lsn: int) -> datetime:  # Accounts' source time: a fixed instant plus the LSN in microseconds
        return datetime.fromtimestamp((1_717_400_000_000_000 + lsn) // 1000 / 1000, UTC)

    rows = sorted(read_all(open_table(accounts_paths(config).table)).to_pylist(),
                  key=lambda r: r["_cdc_valid_from"])
    assert [(r["email"], r["_cdc_valid_from"], r["_cdc_valid_to"], r["_cdc_is_current"]) for r in rows] == [
        ("first@x.io", at(2000), at(3000), False), ("b at x.io", at(3000), at(4000), False),
        ("newest@x.io", at(4000), None, True)]
    assert load_state(accounts_paths(config).table).applied_offset(TOPIC, 0) == offsets
