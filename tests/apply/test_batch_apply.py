"""Applying decoded batches to Delta tables: ordering, deletes, truncate, TOAST, schema, replay, audit."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError

from ingest.apply.journey import apply_parts
from ingest.commit.state import (
    BATCH_KEY,
    OFFSETS_KEY,
    OpenTables,
    app_id,
    cdc_commits,
    load_state,
    table_app_id,
)
from ingest.config import TableSpec
from ingest.errors import SchemaIncompatibleError
from ingest.lake.delta import MAINTENANCE_KEY, open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.model import UNAVAILABLE, ColumnSpec, ControlRecord
from ingest.records import audit, quarantine
from tests.factories import COLUMNS, change, decoded_rows
from tests.harness import current_writer

pytestmark = pytest.mark.usefixtures("apply_engine")


def paths_in(tmp_path: Path, name: str = "customers") -> TablePaths:
    root = tmp_path / "tables"
    return TablePaths(root / name, root / "_cdc_tombstones" / name, root / "_cdc_audit", root / "_cdc_quarantine")


def live(paths: TablePaths) -> dict[int, dict]:
    table = read_all(open_table(paths.table))
    rows = table.to_pylist()
    return {r["id"]: r for r in rows if not r["_cdc_deleted"]}


def apply(spec, paths, items, *, first_offset=0, batch_id=0, partition=0):
    return apply_parts(spec, paths, decoded_rows(items, first_offset=first_offset, partition=partition),
                       batch_id=batch_id, run_id="test", writer=current_writer())


HARD = TableSpec(name="customers", topic="t")
SOFT = TableSpec(name="customers", topic="t", delete_mode="soft")


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([("c", 1, 10, "a")], {1: "a"}),
        ([("c", 1, 10, "a"), ("u", 1, 20, "b")], {1: "b"}),
        ([("u", 1, 20, "b"), ("c", 1, 10, "a")], {1: "b"}),  # reordered
        ([("c", 1, 10, "a"), ("d", 1, 20, None)], {}),
        ([("d", 1, 20, None), ("c", 1, 10, "a")], {}),  # late insert after delete
        ([("c", 1, 10, "a"), ("d", 1, 20, None), ("c", 1, 30, "again")], {1: "again"}),
        ([("c", 1, 10, "a"), ("c", 1, 10, "a"), ("c", 2, 11, "b")], {1: "a", 2: "b"}),  # duplicates
    ],
)
@pytest.mark.one_writer
@pytest.mark.parametrize("split", [False, True], ids=["one-batch", "batch-per-event"])
def test_op_sequences_converge(tmp_path, ops, expected, split):
    paths = paths_in(tmp_path)
    events = [change(op, key, at, name=name) for op, key, at, name in ops]
    if split:
        for i, e in enumerate(events):
            apply(HARD, paths, [e], first_offset=i, batch_id=i)
    else:
        apply(HARD, paths, events)
    assert {k: v["name"] for k, v in live(paths).items()} == expected


@pytest.mark.one_writer
def test_stale_delete_after_reinsert_does_not_remove_newer_row(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10), change("d", 1, 20), change("c", 1, 30, name="back")])
    rec = apply(HARD, paths, [change("d", 1, 20)], first_offset=3, batch_id=1).record
    assert live(paths)[1]["name"] == "back"
    assert rec.stale == 1 and rec.deleted == 0 and rec.balanced


@pytest.mark.one_writer
def test_delete_is_remembered_across_batches_no_resurrection(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10), change("c", 2, 10)])
    apply(HARD, paths, [change("d", 1, 20)], first_offset=2, batch_id=1)
    rec = apply(HARD, paths, [change("u", 1, 15, name="late")], first_offset=3, batch_id=2).record
    assert set(live(paths)) == {2}
    assert rec.stale == 1


def test_kept_handles_follow_commits_made_elsewhere(tmp_path):
    """A stream keeps each table's handles between batches; what another writer committed meanwhile counts."""
    paths = paths_in(tmp_path)
    opened = OpenTables(paths, "customers")

    def kept(items, *, first_offset, batch_id):
        return apply_parts(HARD, paths, decoded_rows(items, first_offset=first_offset), opened=opened,
                           batch_id=batch_id, run_id="test", writer=current_writer()).record

    kept([change("c", 1, 10), change("c", 2, 10), change("c", 4, 10)], first_offset=0, batch_id=0)
    kept([change("d", 2, 11)], first_offset=3, batch_id=1)  # creates the tombstone table
    kept([change("d", 4, 12)], first_offset=4, batch_id=2)  # both tables now open
    target, remembered = opened.target, opened.tombstones.open({"id": "integer"})
    assert target is not None and remembered is not None
    apply(HARD, paths, [change("d", 1, 20)], first_offset=5, batch_id=3)  # another writer, its own handles
    late = kept([change("u", 1, 15, name="late"), change("c", 3, 30)], first_offset=6, batch_id=4)
    assert set(live(paths)) == {3}  # the kept tombstone table saw the other writer's delete of 1
    assert late.stale == 1 and late.inserted == 1 and late.balanced
    # brought up to date, not opened again
    assert opened.target is target and opened.tombstones.open({"id": "integer"}) is remembered
    assert load_state(paths.table).applied_offset("t", 0) == 7


@pytest.mark.one_writer
def test_a_kept_state_reads_only_the_commits_since_the_last_batch(tmp_path, monkeypatch):
    """A continuous run reads its table's state before every batch: the newest CDC commit is looked
    for among the commits since the last read, another writer's and maintenance's included."""
    paths = paths_in(tmp_path)
    opened = OpenTables(paths, "customers")
    for first, key in ((0, 1), (1, 2)):
        apply_parts(HARD, paths, decoded_rows([change("c", key, 10 + key)], first_offset=first), opened=opened,
                    batch_id=first, run_id="test", writer=current_writer())
    apply(HARD, paths, [change("c", 3, 13)], first_offset=2, batch_id=2)  # another writer, its own handles
    open_table(paths.table).optimize.compact(commit_properties=CommitProperties(
        custom_metadata={MAINTENANCE_KEY: "pack"}))  # newer than any CDC commit
    fresh = load_state(paths.table).applied_offset("t", 0)
    asked: list[int | None] = []
    history = DeltaTable.history
    monkeypatch.setattr(DeltaTable, "history", lambda self, limit=None: asked.append(limit) or history(self, limit))
    state = opened.state()
    # read before the last batch's commit: that commit, the other writer's and the compaction, not 50
    assert asked == [3]
    assert state.applied_offset("t", 0) == 2 == fresh
    assert opened.state().newest == state.newest and asked == [3]  # nothing new: nothing read


@pytest.mark.one_writer
def test_a_state_read_from_a_table_opened_afresh_searches_a_whole_page(tmp_path, monkeypatch):
    """When the kept handle cannot follow the log, the table is opened again: what was known of the
    old handle's log says nothing of the new one's."""
    paths = paths_in(tmp_path)
    opened = OpenTables(paths, "customers")
    for first, key in ((0, 1), (1, 2)):
        apply_parts(HARD, paths, decoded_rows([change("c", key, 10 + key)], first_offset=first), opened=opened,
                    batch_id=first, run_id="test", writer=current_writer())

    def lost(self: DeltaTable) -> None:
        raise DeltaError("the log moved")

    asked: list[int | None] = []
    history = DeltaTable.history
    monkeypatch.setattr(DeltaTable, "update_incremental", lost)
    monkeypatch.setattr(DeltaTable, "history", lambda self, limit=None: asked.append(limit) or history(self, limit))
    kept = opened.target
    state = opened.state()
    assert opened.target is not kept and asked == [50] and state.applied_offset("t", 0) == 1


@pytest.mark.one_writer
def test_truncate_removes_older_rows_and_blocks_older_events(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10), change("c", 2, 11)])
    rec = apply(HARD, paths, [change("t", 0, 20), change("c", 3, 30)], first_offset=2, batch_id=1).record
    assert set(live(paths)) == {3}
    assert rec.truncates == 1 and rec.inserted == 1 and rec.rows_truncated == 2 and rec.balanced
    late = apply(HARD, paths, [change("u", 2, 15)], first_offset=4, batch_id=2).record
    assert set(live(paths)) == {3} and late.stale == 1


@pytest.mark.one_writer
def test_toast_placeholder_keeps_stored_value(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10, notes="8 KB of text")])
    upd = change("u", 1, 20, name="renamed", unavailable=frozenset({"notes"}))
    upd.after["notes"] = UNAVAILABLE
    apply(HARD, paths, [upd], first_offset=1, batch_id=1)
    row = live(paths)[1]
    assert row["name"] == "renamed" and row["notes"] == "8 KB of text"


def test_added_column_is_added_with_nulls_for_old_rows(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10)])
    cols = (*COLUMNS, ColumnSpec("tier", "string"))
    rec = apply(HARD, paths, [change("c", 2, 20, columns=cols, extra={"tier": "gold"})], first_offset=1,
                batch_id=1).record
    rows = live(paths)
    assert rows[1]["tier"] is None and rows[2]["tier"] == "gold"
    assert "added tier string" in rec.schema_change


def test_safe_widening_is_applied(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10)])
    wide = tuple(ColumnSpec(c.name, "decimal(20,4)") if c.name == "balance" else c for c in COLUMNS)
    apply(HARD, paths, [change("c", 2, 20, columns=wide, balance="12345678901.2345")], first_offset=1, batch_id=1)
    rows = live(paths)
    assert rows[2]["balance"] == Decimal("12345678901.2345") and rows[1]["balance"] == Decimal("1.0000")


def test_incompatible_type_change_stops_table_without_commit(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10)])
    version = open_table(paths.table).version()
    bad = tuple(ColumnSpec(c.name, "long") if c.name == "name" else c for c in COLUMNS)
    with pytest.raises(SchemaIncompatibleError, match=r"'name'.*string to long"):
        apply(HARD, paths, [change("c", 2, 20, columns=bad, name=None)], first_offset=1, batch_id=1)
    assert open_table(paths.table).version() == version


def test_replay_of_applied_range_changes_nothing(tmp_path):
    paths = paths_in(tmp_path)
    items = [change("c", 1, 10), change("u", 1, 20, name="b"), change("d", 2, 5)]
    apply(HARD, paths, items)
    table = open_table(paths.table)
    version, files = table.version(), sorted(table.file_uris())
    result = apply(HARD, paths, items, batch_id=7)
    table = open_table(paths.table)
    assert result.record is None and result.already_applied == 3
    assert table.version() == version and sorted(table.file_uris()) == files


def test_progress_and_audit_live_in_the_commit(tmp_path, apply_engine):
    paths = paths_in(tmp_path)
    rec = apply(HARD, paths, [change("c", 1, 10), change("c", 2, 11)], first_offset=40, partition=2).record
    rec2 = apply(HARD, paths, [change("u", 1, 12)], first_offset=0, partition=0, batch_id=1).record
    table = open_table(paths.table)
    (commit,) = [c for c in cdc_commits(table) if c["version"] == rec.delta_version]
    assert commit[BATCH_KEY]["inserted"] == 2 and commit[BATCH_KEY]["received"] == 2
    (second,) = [c for c in cdc_commits(table) if c["version"] == rec2.delta_version]
    assert second[OFFSETS_KEY] == {"t:0": 0, "t:2": 41}  # carried forward, both partitions
    state = load_state(paths.table)
    assert state.applied_offset("t", 2) == 41 and state.applied_offset("t", 0) == 0
    if apply_engine.name == "delta-rs":  # one app transaction per partition
        assert table.transaction_version(app_id("t", 2)) == 41 and table.transaction_version(app_id("t", 0)) == 0
        assert table.transaction_version(table_app_id("customers")) is None
    else:  # delta-spark: one per table, counting its commits
        assert table.transaction_version(table_app_id("customers")) == 2
        assert table.transaction_version(app_id("t", 2)) is None


def test_batch_with_nothing_to_change_still_records_progress(tmp_path):
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10)])
    rec = apply(HARD, paths, [ControlRecord("heartbeat"), change("c", 1, 10)], first_offset=1, batch_id=1).record
    assert rec.skipped == 1 and rec.stale == 1 and rec.balanced
    assert load_state(paths.table).applied_offset("t", 0) == 2


def test_undecodable_messages_are_quarantined_and_balance_holds(tmp_path):
    paths = paths_in(tmp_path)
    items = [change("c", 1, 10), "avro: unknown schema id 99", ControlRecord("tombstone"), change("u", 1, 20)]
    rec = apply(HARD, paths, items).record
    assert rec.received == 4 and rec.quarantined == 1 and rec.skipped == 1 and rec.superseded == 1
    assert rec.inserted == 1 and rec.balanced
    held = quarantine.read(paths.quarantine).to_pylist()
    assert held[0]["reason"] == "avro: unknown schema id 99" and held[0]["raw_value"] == b"garbage"
    assert held[0]["offset"] == 1
    rows = audit.read(paths.audit).to_pylist()
    assert rows[0]["balanced"] and rows[0]["quarantined"] == 1


@pytest.mark.one_writer
def test_soft_delete_mode_keeps_flagged_rows(tmp_path):
    paths = paths_in(tmp_path)
    apply(SOFT, paths, [change("c", 1, 10, name="a"), change("c", 2, 10)])
    apply(SOFT, paths, [change("d", 1, 20), change("u", 1, 15, name="late")], first_offset=2, batch_id=1)
    rows = {r["id"]: r for r in read_all(open_table(paths.table)).to_pylist()}
    assert rows[1]["_cdc_deleted"] is True and rows[1]["name"] == "a"
    assert rows[2]["_cdc_deleted"] is False


def test_audit_is_restored_from_commit_info(tmp_path):
    paths = paths_in(tmp_path)
    rec = apply(HARD, paths, [change("c", 1, 10)]).record
    import shutil

    shutil.rmtree(paths.audit)
    assert audit.reconcile(paths.audit, "customers", paths.table) == 1
    (row,) = audit.read(paths.audit).to_pylist()
    assert row["delta_version"] == rec.delta_version and row["inserted"] == 1 and row["balanced"]


@pytest.mark.one_writer
def test_toast_not_filled_from_a_redelivered_older_image(tmp_path):
    """A stale duplicate in the same batch as a placeholder must not overwrite the newer stored value."""
    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10, notes="first"), change("u", 1, 20, notes="newest")])
    placeholder = change("u", 1, 30, name="renamed", unavailable=frozenset({"notes"}))
    placeholder.after["notes"] = UNAVAILABLE
    redelivered = change("u", 1, 20, notes="first")  # older than the stored row
    apply(HARD, paths, [placeholder, redelivered], first_offset=2, batch_id=1)
    row = live(paths)[1]
    assert row["name"] == "renamed" and row["notes"] == "newest"


def test_commit_refuses_to_move_progress_backwards(tmp_path):
    from ingest.apply.batch import MicroBatch
    from ingest.apply.journey import refuse_to_move_backwards
    from ingest.commit.state import TableState, load_state
    from ingest.errors import OffsetsConflictError

    paths = paths_in(tmp_path)
    apply(HARD, paths, [change("c", 1, 10)], first_offset=5)
    # A batch assembled against an older view of the table (another writer moved it meanwhile).
    stale_view = TableState(None, None, None, None)
    batch = MicroBatch.from_parts(decoded_rows([change("u", 1, 20)], first_offset=3), stale_view)
    with pytest.raises(OffsetsConflictError, match=r"t\[0\] is already applied up to offset 5"):
        refuse_to_move_backwards(HARD.name, batch, load_state(paths.table))
