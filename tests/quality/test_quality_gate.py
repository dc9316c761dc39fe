"""The quality gate in process_batch: warn, quarantine and fail, overrides, row identity, audit balance."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from ingest.apply.journey import apply_parts
from ingest.commit.state import load_state
from ingest.config import TableSpec
from ingest.errors import QualityGateError, SuiteMismatchError, TableError
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.model import ColumnSpec
from ingest.quality import QualityGate, ResultStore, load_suite
from ingest.records import audit, quarantine
from tests.factories import COLUMNS, change, decoded_rows, source_bytes
from tests.harness import current_writer
from tests.quality.helpers import write_suite

# Policies decide what reaches the commit: they must hold whichever engine commits.
pytestmark = pytest.mark.usefixtures("apply_engine")

NAME_RE = "expect_column_values_to_match_regex(name)"
BALANCE = "expect_column_values_to_be_between(balance)"
PEOPLE = [
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "name", "regex": "^[a-z]+$"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "balance", "min_value": 0, "max_value": 100}},
]


def paths_in(tmp_path: Path, name: str = "customers") -> TablePaths:
    root = tmp_path / "tables"
    return TablePaths(root / name, root / "_cdc_tombstones" / name, root / "_cdc_audit", root / "_cdc_quarantine",
                      tmp_path / "quality" / name)


def gate_for(tmp_path: Path, spec: TableSpec, expectations: list[dict] = PEOPLE) -> QualityGate:
    """The table's gate: on the delta-spark engine's session (a Spark DataFrame, as ``quality.validate_on:
    spark`` gives it, here on the local test master) when that engine commits, on the driver (pandas)
    otherwise."""
    write_suite(tmp_path / "suites", spec.expectations or "people", expectations)
    return QualityGate(spec, load_suite(tmp_path / "suites", spec.expectations or "people"),
                       results=ResultStore(tmp_path / "quality" / spec.name),
                       spark=getattr(current_writer(), "spark", None))


def spec_with(policy: str, **extra) -> TableSpec:
    return TableSpec(name="customers", topic="t", expectations="people", quality_policy=policy, **extra)


def run(spec, paths, gate, items, *, first_offset=0, batch_id=0):
    return apply_parts(spec, paths, decoded_rows(items, first_offset=first_offset), batch_id=batch_id,
                       run_id="test", gate=gate, fetch_raw=source_bytes, writer=current_writer())


def live(paths: TablePaths) -> dict[int, dict]:
    table = open_table(paths.table)
    return {r["id"]: r for r in read_all(table).to_pylist() if not r["_cdc_deleted"]} if table else {}


def held(paths: TablePaths) -> list[dict]:
    return sorted(quarantine.read(paths.quarantine).to_pylist(), key=lambda r: r["offset"])


@pytest.mark.one_writer
def test_warn_applies_everything_and_records_the_failures(tmp_path):
    spec, paths = spec_with("warn"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec)
    result = run(spec, paths, gate, [change("c", 1, 10, name="ok"), change("c", 2, 11, name="BAD"),
                                     change("c", 3, 12, name="rich", balance="500.00")])
    rec = result.record
    assert set(live(paths)) == {1, 2, 3} and held(paths) == []
    assert rec.quality_status == "warned" and rec.expectations_evaluated == 3 and rec.expectations_failed == 2
    assert json.loads(rec.quality_failures) == {NAME_RE: 1, BALANCE: 1}
    assert rec.inserted == 3 and rec.quarantined == 0 and rec.balanced


def test_quarantine_holds_failing_rows_with_expectations_and_observed_values(tmp_path):
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec)
    rec = run(spec, paths, gate, [change("c", 1, 10, name="ok"), change("c", 2, 11, name="BAD"),
                                  change("c", 3, 12, name="rich", balance="500.00"), "avro: unknown schema id"]).record
    assert set(live(paths)) == {1}
    rows = held(paths)
    assert [(r["offset"], r["stage"]) for r in rows] == [(1, "quality"), (2, "quality"), (3, "decode")]
    assert json.loads(rows[0]["expectations"]) == [NAME_RE] and "name='BAD'" in rows[0]["reason"]
    assert json.loads(rows[1]["expectations"]) == [BALANCE] and "balance=Decimal('500.00')" in rows[1]["reason"]
    assert rows[0]["raw_value"] == b"v" and json.loads(rows[0]["row_key"]) == {"id": 2}
    assert rec.received == 4 and rec.inserted == 1 and rec.quarantined == 3 and rec.balanced
    assert rec.quality_status == "quarantined"
    (row,) = audit.read(paths.audit).to_pylist()
    assert row["quality_status"] == "quarantined" and row["expectations_failed"] == 2 and row["balanced"]
    assert json.loads(row["quality_failures"]) == {NAME_RE: 1, BALANCE: 1}


def test_a_key_whose_winning_change_fails_is_held_with_all_its_changes_in_the_batch(tmp_path):
    """Balance stays exact: the earlier changes move from superseded to quarantined, nothing counts twice."""
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec)
    run(spec, paths, gate, [change("c", 1, 10, name="old"), change("c", 2, 10, name="two")])
    rec = run(spec, paths, gate, [change("u", 1, 20, name="mid"), change("u", 1, 30, name="BAD"),
                                  change("u", 2, 25, name="newer")], first_offset=2, batch_id=1).record
    assert live(paths)[1]["name"] == "old" and live(paths)[2]["name"] == "newer"
    rows = [r for r in held(paths) if r["batch_id"] == 1]
    assert [r["offset"] for r in rows] == [2, 3]
    assert rows[0]["reason"].startswith("held with the later change of its key at t[0]@3")
    assert rec.received == 3 and rec.quarantined == 2 and rec.superseded == 0 and rec.updated == 1 and rec.balanced


@pytest.mark.one_writer
def test_a_failing_change_superseded_in_the_batch_is_not_judged(tmp_path):
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec)
    rec = run(spec, paths, gate, [change("c", 1, 10, name="BAD"), change("u", 1, 20, name="good")]).record
    assert live(paths)[1]["name"] == "good" and held(paths) == []
    assert rec.quality_status == "passed" and rec.superseded == 1 and rec.balanced


def test_fail_commits_nothing_and_does_not_advance_the_offsets(tmp_path):
    spec, paths = spec_with("fail"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec)
    run(spec, paths, gate, [change("c", 1, 10, name="ok")])
    version = open_table(paths.table).version()
    bad = [change("u", 1, 20, name="BAD"), "avro: unknown schema id"]
    with pytest.raises(QualityGateError, match=r"expect_column_values_to_match_regex\(name\) failed for 1 of 1 rows"
                                               r", e\.g\. \(id=1\) name='BAD'") as caught:
        run(spec, paths, gate, bad, first_offset=1, batch_id=1)
    assert caught.value.expectations == [NAME_RE] and caught.value.table == "customers"
    table = open_table(paths.table)
    assert table.version() == version and load_state(paths.table).applied_offset("t", 0) == 0
    assert held(paths) == []  # not even the undecodable message: nothing is written before the gate
    assert len(audit.read(paths.audit).to_pylist()) == 1
    assert live(paths)[1]["name"] == "ok"
    stored = ResultStore(tmp_path / "quality" / "customers").find(batch_id=1)
    assert stored is not None and stored.load()["status"] == "failed"
    # The batch comes again (offsets did not move) and fails again; other tables go on meanwhile.
    with pytest.raises(QualityGateError):
        run(spec, paths, gate, bad, first_offset=1, batch_id=2)
    other = TableSpec(name="other", topic="t")
    assert apply_parts(other, paths_in(tmp_path, "other"), decoded_rows([change("c", 5, 50)]), batch_id=0,
                         run_id="test").record.inserted == 1


@pytest.mark.one_writer
def test_meta_policy_overrides_the_table_policy(tmp_path):
    suite = [PEOPLE[1], {**PEOPLE[2], "meta": {"policy": "fail"}}]
    spec, paths = spec_with("warn"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, suite)
    assert run(spec, paths, gate, [change("c", 1, 10, name="BAD")]).record.quality_status == "warned"
    with pytest.raises(QualityGateError, match=r"balance.*balance=Decimal\('500.00'\)"):
        run(spec, paths, gate, [change("c", 2, 11, balance="500.00")], first_offset=1, batch_id=1)


@pytest.mark.one_writer
def test_config_override_beats_meta_policy(tmp_path):
    suite = [PEOPLE[1], {**PEOPLE[2], "meta": {"policy": "fail"}}]
    spec, paths = spec_with("warn", expectation_policies={BALANCE: "quarantine"}), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, suite)
    rec = run(spec, paths, gate, [change("c", 1, 10, name="BAD"), change("c", 2, 11, balance="500.00")]).record
    assert set(live(paths)) == {1}
    assert [json.loads(r["expectations"]) for r in held(paths)] == [[BALANCE]]
    assert rec.quality_status == "quarantined" and rec.balanced


@pytest.mark.one_writer
def test_a_failed_batch_level_expectation_under_quarantine_holds_every_validated_row(tmp_path):
    suite = [{"type": "expect_table_row_count_to_be_between", "kwargs": {"max_value": 1}}]
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, suite)
    run(spec, paths, gate, [change("c", 3, 5)])
    rec = run(spec, paths, gate, [change("c", 1, 10), change("c", 2, 11), change("d", 3, 12)],
              first_offset=1, batch_id=1).record
    assert live(paths) == {}  # the delete (not validated: no after image) still applied
    rows = held(paths)
    assert [r["offset"] for r in rows] == [1, 2] and "observed 2 for the batch" in rows[0]["reason"]
    assert rec.deleted == 1 and rec.quarantined == 2 and rec.balanced
    assert json.loads(rec.quality_failures) == {"expect_table_row_count_to_be_between": 2}


def test_a_new_table_whose_first_changes_all_fail_is_created_empty_with_its_offsets(tmp_path):
    """The next run starts past them, as docs/quality.md says; only a new table none of whose records
    could be decoded has no columns to be created from, and is read again by the next run."""
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    failing = [change("c", 1, 1, name="Ann"), change("c", 2, 2, name="B")]  # the suite wants ^[a-z]+$
    rec = run(spec, paths, gate_for(tmp_path, spec), failing).record
    assert (rec.status, rec.quarantined, live(paths)) == ("committed", 2, {})
    assert load_state(paths.table).applied_offset("t", 0) == 1
    undecodable = paths_in(tmp_path, "orders")
    rec = run(TableSpec(name="orders", topic="t"), undecodable, None, ["not JSON", "nor this"]).record
    assert (rec.status, rec.quarantined, open_table(undecodable.table)) == ("nothing-to-commit", 2, None)


@pytest.mark.one_writer
def test_mostly_lets_the_expectation_pass_and_its_rows_apply(tmp_path):
    suite = [{"type": "expect_column_values_to_match_regex",
              "kwargs": {"column": "name", "regex": "^[a-z]+$", "mostly": 0.5}}]
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, suite)
    rec = run(spec, paths, gate, [change("c", 1, 10, name="ok"), change("c", 2, 11, name="BAD"),
                                  change("c", 3, 12, name="fine")]).record
    assert set(live(paths)) == {1, 2, 3} and rec.quality_status == "passed"


@pytest.mark.one_writer
def test_column_pair_expectation_names_its_rows(tmp_path):
    columns = (*COLUMNS, ColumnSpec("credit", "decimal(12,2)"))
    suite = [{"type": "expect_column_pair_values_a_to_be_greater_than_b",
              "kwargs": {"column_A": "credit", "column_B": "balance", "or_equal": True}, "meta": {"name": "credit_ok"}}]
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, suite)
    items = [change("c", k, 10 + k, columns=columns, balance=b, extra={"credit": Decimal(c)})
             for k, b, c in [(1, "5.00", "9.00"), (2, "50.00", "9.00"), (3, "9.00", "9.00")]]
    run(spec, paths, gate, items)
    assert set(live(paths)) == {1, 3}
    (row,) = held(paths)
    assert json.loads(row["expectations"]) == ["credit_ok"]
    assert "credit=Decimal('9.00'), balance=Decimal('50.00')" in row["reason"]


@pytest.mark.one_writer
def test_deletes_only_is_skipped_and_no_suite_is_skipped(tmp_path):
    spec, paths = spec_with("fail"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 5}}])
    run(TableSpec(name="customers", topic="t"), paths, None, [change("c", 1, 10)])
    rec = run(spec, paths, gate, [change("d", 1, 20)], first_offset=1, batch_id=1).record
    assert rec.quality_status == "skipped" and rec.expectations_evaluated == 0 and rec.deleted == 1
    plain = run(TableSpec(name="customers", topic="t"), paths_in(tmp_path, "p"), None, [change("c", 1, 10)]).record
    assert plain.quality_status == "skipped" and plain.quality_failures == "{}"


def test_a_column_the_first_batch_lacks_stops_the_table_before_any_commit(tmp_path):
    spec, paths = spec_with("warn"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "email"}}])
    with pytest.raises(SuiteMismatchError, match=r"'email'.*nothing was committed"):
        run(spec, paths, gate, [change("c", 1, 10), "avro: bad"])
    assert open_table(paths.table) is None and held(paths) == []


def test_a_table_with_a_suite_needs_its_gate(tmp_path):
    with pytest.raises(TableError, match="no quality gate"):
        run(spec_with("warn"), paths_in(tmp_path), None, [change("c", 1, 10)])


@pytest.mark.one_writer
def test_multicolumn_expectations_name_their_rows(tmp_path):
    suite = [{"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": ["name", "balance"]}},
             {"type": "expect_select_column_values_to_be_unique_within_record",
              "kwargs": {"column_list": ["name", "notes"]}}]
    spec, paths = spec_with("quarantine"), paths_in(tmp_path)
    gate = gate_for(tmp_path, spec, suite)
    rec = run(spec, paths, gate, [change("c", 1, 10, name="a", notes="b"), change("c", 2, 11, name="a", notes="a"),
                                  change("c", 3, 12, name="z", notes="q")]).record
    assert set(live(paths)) == {3}
    by_offset = {r["offset"]: json.loads(r["expectations"]) for r in held(paths)}
    assert by_offset == {0: ["expect_compound_columns_to_be_unique(name, balance)"],
                         1: ["expect_compound_columns_to_be_unique(name, balance)",
                             "expect_select_column_values_to_be_unique_within_record(name, notes)"]}
    assert rec.quarantined == 2 and rec.balanced
