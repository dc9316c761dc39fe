"""Both writers append a batch of keys their table does not hold, instead of merging it (issue 11).

A small delta-spark MERGE runs about twenty Spark jobs; an append runs a few. delta-rs's MERGE joins
and plans on DataFusion's threads, which a busy driver pays for in a continuous run's every batch.
The append must write what the MERGE would have written -- the same rows, the same progress markers,
the same audit -- and must give way to the MERGE whenever a stored key, a truncate, a new column or
another writer's commit is involved. The reference table is delta-rs's with its append turned off:
it merges every batch.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pytest

from ingest.apply.journey import apply_parts
from ingest.commit import delta_rs
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.state import load_state
from ingest.config import TableSpec
from ingest.errors import CommitConflictError
from ingest.lake.delta import log_version, open_table, read_all
from ingest.model import ColumnSpec
from ingest.records import audit
from tests.factories import COLUMNS, change, decoded_rows
from tests.harness import paths_in, race_at

HARD = TableSpec(name="t", topic="t")
SOFT = TableSpec(name="t", topic="t", delete_mode="soft")
EMAIL = (*COLUMNS, ColumnSpec("email", "string", True))
#: each writer's names of the rows its MERGE inserts, the files it adds and the rows it writes
_METRICS = {"delta-spark": ("numTargetRowsInserted", "numTargetFilesAdded", "numOutputRows"),
            "delta-rs": ("num_target_rows_inserted", "num_target_files_added", "num_output_rows")}


def _run(engine: Any, paths: Any, spec: TableSpec, batches: list[tuple[int, list[Any]]]) -> list[Any]:
    return [apply_parts(spec, paths, decoded_rows(items, first_offset=first), batch_id=i, run_id="test",
                        writer=engine).record for i, (first, items) in enumerate(batches)]


def _operations(paths: Any) -> list[str]:
    """The table's commit operations, oldest first."""
    return [c["operation"] for c in sorted(open_table(paths.table).history(), key=lambda c: c["version"])]


def _table(paths: Any) -> list[dict[str, Any]]:
    """Every stored row (soft deletes included), by key, less the time it was written."""
    rows = read_all(open_table(paths.table)).drop_columns(["_cdc_ingested_at"]).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _both(tmp_path: Any, engine: Any, spec: TableSpec, batches: list[tuple[int, list[Any]]]):
    """The batches applied by ``engine``, and by delta-rs merging every batch, each into its own table."""
    ds, rs = paths_in(tmp_path / "engine"), paths_in(tmp_path / "merged")
    with patch.object(delta_rs, "may_append", lambda *_args, **_kwargs: False):
        merged = _run(DeltaRsWriter(), rs, spec, batches)
    return ds, _run(engine, ds, spec, batches), rs, merged


@pytest.mark.parametrize("spec", [HARD, SOFT], ids=["hard", "soft"])
def test_a_batch_of_new_keys_is_appended_with_what_the_merge_would_write(tmp_path, apply_engine, spec):
    batches = [(0, [change("c", k, 10 + k, name=f"n{k}") for k in range(3)]),
               # new keys only: two inserts, an update of a key first seen here, a delete of a key never seen
               (3, [change("c", 5, 20, name="five"), change("c", 6, 21), change("u", 6, 22, name="six"),
                    change("d", 9, 23)])]
    ds, ds_records, rs, rs_records = _both(tmp_path, apply_engine, spec, batches)
    assert _operations(ds)[-1] == "WRITE"  # appended, not merged
    assert _table(ds) == _table(rs)  # hard: the delete of 9 writes nothing; soft: a row marked deleted
    last, reference = ds_records[-1], rs_records[-1]
    counts = ("received", "inserted", "updated", "deleted", "stale", "superseded")
    assert [getattr(last, c) for c in counts] == [getattr(reference, c) for c in counts]
    assert last.balanced and last.status == "committed"
    # the audit row's metrics use the writer's MERGE names, and say what delta-rs's MERGE says
    appended, merged = json.loads(last.merge_metrics), json.loads(reference.merge_metrics)
    inserted, files, written = _METRICS[apply_engine.name]
    assert appended[inserted] == merged["num_target_rows_inserted"] > 0
    assert appended[files] >= 1 and written not in appended
    assert load_state(ds.table).applied_offset("t", 0) == 6
    # a replay of the appended batch is recognised as applied: nothing more is written
    again = apply_parts(spec, ds, decoded_rows(batches[1][1], first_offset=3), batch_id=2, run_id="test",
                        writer=apply_engine)
    assert again.record is None and again.already_applied == 4
    assert _table(ds) == _table(rs)


def test_a_batch_that_touches_one_stored_key_is_merged(tmp_path, apply_engine):
    batches = [(0, [change("c", k, 10 + k) for k in range(3)]),
               (3, [change("c", 7, 20, name="seven"), change("u", 1, 21, name="one")])]
    ds, _, rs, _ = _both(tmp_path, apply_engine, HARD, batches)
    assert _operations(ds)[-1] == "MERGE"
    assert _table(ds) == _table(rs)


def test_an_append_after_a_column_was_added_writes_every_column_by_name(tmp_path, apply_engine):
    """The table's columns are no longer in the batch's order once a column was added (ALTER TABLE
    appends it after the framework columns): the append must place values by name."""
    batches = [(0, [change("c", k, 10 + k) for k in range(3)]),
               (3, [change("u", 1, 20, columns=EMAIL, extra={"email": "one@x"})]),  # adds the column: a MERGE
               (4, [change("c", 8, 30, name="eight", balance="8.50", columns=EMAIL, extra={"email": "eight@x"})])]
    ds, _, rs, _ = _both(tmp_path, apply_engine, HARD, batches)
    assert _operations(ds)[-1] == "WRITE"
    assert _table(ds) == _table(rs)
    eight = next(r for r in _table(ds) if r["id"] == 8)
    assert (eight["name"], eight["balance"], eight["email"]) == ("eight", Decimal("8.50"), "eight@x")


def test_a_batch_that_adds_a_column_merges_even_with_new_keys_only(tmp_path, apply_engine):
    """delta-spark: the batch's own ALTER TABLE moved the table past the version the plan read, which
    the engine cannot tell from another writer's commit. delta-rs: its MERGE adds the column itself."""
    batches = [(0, [change("c", k, 10 + k) for k in range(3)]),
               (3, [change("c", 8, 30, columns=EMAIL, extra={"email": "eight@x"})])]
    ds, _, rs, _ = _both(tmp_path, apply_engine, HARD, batches)
    assert _operations(ds)[-2:] == (["ADD COLUMNS", "MERGE"] if apply_engine.name == "delta-spark"
                                    else ["WRITE", "MERGE"])
    assert _table(ds) == _table(rs)


def test_a_writer_racing_an_append_gets_a_conflict_and_the_key_is_written_once(tmp_path, apply_engine, monkeypatch):
    """Both writers read the table without key 7 and planned an append of it: the second is refused."""
    paths = paths_in(tmp_path)
    engine = apply_engine
    _run(engine, paths, HARD, [(0, [change("c", k, 10 + k) for k in range(3)])])
    # the other writer appends the same offsets while this one is about to
    race_at(monkeypatch, "before-commit", lambda: apply_parts(
        HARD, paths, decoded_rows([change("c", 7, 20, name="winner")], first_offset=3),
        batch_id=1, run_id="b", writer=engine))
    with pytest.raises(CommitConflictError, match="another writer"):
        apply_parts(HARD, paths, decoded_rows([change("c", 7, 21, name="loser")], first_offset=3),
                    batch_id=1, run_id="c", writer=engine)
    assert _operations(paths)[-1] == "WRITE"  # the winner appended
    live = [(r["id"], r["name"]) for r in _table(paths)]
    assert live == [(0, "x"), (1, "x"), (2, "x"), (7, "winner")]
    assert [r["batch_id"] for r in audit.read(paths.audit).to_pylist()].count(1) == 1


def test_a_commit_between_the_plan_and_the_append_turns_it_into_a_merge(tmp_path, apply_engine, monkeypatch):
    """Another writer commits key 7 after this batch planned an append of it, before its commit starts:
    the table is no longer at the version the plan read, so the batch merges, and its newer change wins."""
    paths = paths_in(tmp_path)
    engine = apply_engine
    _run(engine, paths, HARD, [(0, [change("c", k, 10 + k) for k in range(3)])])
    race = race_at(monkeypatch, "after-tombstones", lambda: apply_parts(
        HARD, paths, decoded_rows([change("c", 7, 20, name="other")], first_offset=3),
        batch_id=1, run_id="b", writer=engine))
    newer = decoded_rows([change("c", 7, 21, name="newer")], first_offset=3, partition=1)
    if engine.name == "delta-rs":
        # Its MERGE runs from the version the plan read, and Delta refuses it past the new row:
        # nothing is written, and the batch applied again plans against that row.
        with pytest.raises(CommitConflictError, match="another writer"):
            apply_parts(HARD, paths, newer, batch_id=1, run_id="c", writer=engine)
        assert [(r["id"], r["name"]) for r in _table(paths)] == [(0, "x"), (1, "x"), (2, "x"), (7, "other")]
    apply_parts(HARD, paths, newer, batch_id=1, run_id="c", writer=engine)
    assert race.ran and _operations(paths)[-2:] == ["WRITE", "MERGE"]
    assert [(r["id"], r["name"]) for r in _table(paths)] == [(0, "x"), (1, "x"), (2, "x"), (7, "newer")]


def test_a_batch_that_only_deletes_keys_never_seen_records_its_progress_and_writes_no_row(tmp_path, apply_engine):
    batches = [(0, [change("c", k, 10 + k) for k in range(3)]), (3, [change("d", 42, 20), change("d", 43, 21)])]
    ds, ds_records, rs, _ = _both(tmp_path, apply_engine, HARD, batches)
    assert _table(ds) == _table(rs) and [r["id"] for r in _table(ds)] == [0, 1, 2]
    assert ds_records[-1].balanced and load_state(ds.table).applied_offset("t", 0) == 4


def test_the_change_feed_shows_an_appended_batch_as_its_inserts(tmp_path, apply_engine):
    """Delta's feed reports an append's rows as inserts, as it would the MERGE's: analysts see the same."""
    batches = [(0, [change("c", k, 10 + k) for k in range(3)]),
               (3, [change("c", 5, 20, name="five"), change("c", 6, 21, name="six"), change("d", 9, 22)])]
    ds, *_ = _both(tmp_path, apply_engine, HARD, batches)
    version = open_table(ds.table).version()
    assert _operations(ds)[-1] == "WRITE"
    if apply_engine.name == "delta-rs":  # delta-rs reads the feed itself
        feed = pa.table(open_table(ds.table).load_cdf(starting_version=version).read_all()).to_pylist()
    else:
        feed = [r.asDict() for r in apply_engine.spark.read.format("delta").option("readChangeFeed", "true")
                .option("startingVersion", version).load(str(ds.table)).collect()]
    assert sorted((r["id"], r["name"], r["_change_type"], r["_commit_version"]) for r in feed) == [
        (5, "five", "insert", version), (6, "six", "insert", version)]


def test_the_log_version_is_read_past_a_handle_left_behind(tmp_path):
    """delta-rs's append needs the log's newest version without moving its handle (its MERGE reads it
    from the handle's version): the inner call it is read with is still there, and sees past the handle."""
    paths = paths_in(tmp_path)
    _run(DeltaRsWriter(), paths, HARD, [(0, [change("c", 1, 10)])])
    behind = open_table(paths.table)
    _run(DeltaRsWriter(), paths, HARD, [(1, [change("c", 2, 11)])])
    assert behind.version() + 1 == log_version(behind) == open_table(paths.table).version()


def test_delta_rs_reads_the_log_version_only_for_a_batch_it_may_append(tmp_path, monkeypatch):
    """The newest version is a listing of the table's log: a batch that touches a stored key merges
    without it."""
    paths, reads = paths_in(tmp_path), []
    monkeypatch.setattr(delta_rs, "log_version", lambda table: reads.append(table.version()) or log_version(table))
    _run(DeltaRsWriter(), paths, HARD, [(0, [change("c", k, 10 + k) for k in range(3)]),  # creates the table
                                        (3, [change("u", 1, 20, name="one")]),  # a stored key: merges
                                        (4, [change("c", 7, 21)])])  # a new key: appends
    assert _operations(paths)[1:] == ["MERGE", "WRITE"]
    assert reads == [1]  # once, for the append, at the version the merge left


def test_deletes_of_keys_without_a_remembered_delete_are_appended_and_a_repeated_one_merged(tmp_path):
    """A key deleted, inserted again and deleted again keeps one remembered delete, the newest."""
    paths = paths_in(tmp_path)
    _run(DeltaRsWriter(), paths, HARD, [(0, [change("c", k, 10 + k) for k in range(3)]),
                                        (3, [change("d", 2, 20)]),  # creates the remembered deletes
                                        (4, [change("d", 1, 21)]),
                                        (5, [change("c", 1, 30, name="again")]),
                                        (6, [change("d", 1, 40)])])
    tombstones = open_table(paths.tombstones)
    operations = [c["operation"] for c in sorted(tombstones.history(), key=lambda c: c["version"])]
    assert operations[1:] == ["WRITE", "MERGE"]  # key 1 first remembered by an append, then merged
    rows = read_all(tombstones, columns=["id", "_cdc_position"]).sort_by("id").to_pylist()
    assert [r["id"] for r in rows] == [1, 2]
    assert rows[0]["_cdc_position"] > rows[1]["_cdc_position"]  # key 1's second delete, the newest
    assert [r["id"] for r in _table(paths)] == [0]
