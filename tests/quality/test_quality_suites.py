"""Loading suites with GX: demo suites, strict errors at start-up, names and policy precedence."""

from __future__ import annotations

import json
from pathlib import Path

import great_expectations as gx
import pytest

from ingest.apply.journey import apply_parts
from ingest.config import TableSpec
from ingest.errors import ConfigError, SuiteError
from ingest.lake.layout import TablePaths
from ingest.quality import QualityGate
from ingest.quality.suites import effective_policies, load_suite
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce
from tests.factories import change, decoded_rows
from tests.quality.helpers import make_config, write_suite

DEMO = Path("expectations")


@pytest.mark.parametrize("name", ["customers", "products", "orders"])
def test_demo_suites_are_gx_suites_gx_itself_loads(name):
    doc = json.loads((DEMO / f"{name}.json").read_text())
    suite = gx.ExpectationSuite(**doc)  # GX's own constructor, no help from us
    assert suite.name == name and len(suite.expectations) == len(doc["expectations"])
    loaded = load_suite(DEMO, name)
    assert {e.type for e in loaded.expectations} >= {"expect_column_values_to_not_be_null",
                                                      "expect_column_values_to_be_unique",
                                                      "expect_table_row_count_to_be_between"}
    assert any(e.row_level for e in loaded.expectations) and any(not e.row_level for e in loaded.expectations)


def test_unknown_expectation_type_is_a_clear_error(tmp_path):
    write_suite(tmp_path, "s", [{"type": "expect_column_values_to_be_purple", "kwargs": {"column": "id"}}])
    with pytest.raises(SuiteError, match=r"s\.json: expectations\[0\]: expect_column_values_to_be_purple .*not found"):
        load_suite(tmp_path, "s")


def test_invalid_arguments_and_policy_are_clear_errors(tmp_path):
    write_suite(tmp_path, "args", [{"type": "expect_column_values_to_be_between", "kwargs": {"min_valu": 1}}])
    with pytest.raises(SuiteError, match=r"expectations\[0\].*column"):
        load_suite(tmp_path, "args")
    write_suite(tmp_path, "pol", [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"},
                                   "meta": {"policy": "drop"}}])
    with pytest.raises(SuiteError, match=r"meta\.policy 'drop'"):
        load_suite(tmp_path, "pol")
    with pytest.raises(SuiteError, match="not found"):
        load_suite(tmp_path, "missing")


def test_names_are_meta_name_or_type_and_columns_and_stay_unique(tmp_path):
    write_suite(tmp_path, "s", [
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "name", "regex": "a"}},
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "name", "regex": "b"}},
        {"type": "expect_column_pair_values_to_be_equal", "kwargs": {"column_A": "a", "column_B": "b"},
         "meta": {"name": "a_equals_b"}},
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"max_value": 5}},
    ])
    suite = load_suite(tmp_path, "s")
    assert suite.names() == ["expect_column_values_to_match_regex(name)", "expect_column_values_to_match_regex(name)#2",
                             "a_equals_b", "expect_table_row_count_to_be_between"]
    assert [e.row_level for e in suite.expectations] == [True, True, True, False]


def test_policy_precedence_config_then_meta_then_table(tmp_path):
    write_suite(tmp_path, "s", [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "a"}, "meta": {"policy": "fail"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "b"}, "meta": {"policy": "fail"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "c"}},
    ])
    spec = TableSpec(name="t", topic="t", expectations="s", quality_policy="quarantine",
                     expectation_policies={"expect_column_values_to_not_be_null(b)": "warn"})
    assert effective_policies(spec, load_suite(tmp_path, "s")) == {
        "expect_column_values_to_not_be_null(a)": "fail",
        "expect_column_values_to_not_be_null(b)": "warn",
        "expect_column_values_to_not_be_null(c)": "quarantine",
    }
    typo = TableSpec(name="t", topic="t", expectations="s", expectation_policies={"not_a_name": "warn"})
    with pytest.raises(SuiteError, match=r"not_a_name.*does not have"):
        effective_policies(typo, load_suite(tmp_path, "s"))


def test_engine_start_up_refuses_a_suite_naming_a_missing_column(tmp_path):
    """Checked against the existing Delta table before any query starts, in a run that has work (a
    caught-up run loads no suite: it ends before Great Expectations is imported)."""
    config = make_config(tmp_path, tables=[{"name": "customers", "topic": "t", "expectations": "s"}])
    write_suite(config.expectations_dir, "s", [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "no_such_column"}}])
    apply_parts(TableSpec(name="customers", topic="t"), TablePaths.of(config, "customers"),
                  decoded_rows([change("c", 1, 10)]), batch_id=0, run_id="r")  # the table exists now
    produce(config, "t", [("c", {"id": 2}, 20), ("c", {"id": 4}, 21)])  # offset 1 is one the table has not read
    with pytest.raises(SuiteError, match=r"no_such_column"):
        Runner(config).run()


def test_engine_start_up_refuses_an_unknown_expectation(tmp_path):
    config = make_config(tmp_path, tables=[{"name": "customers", "topic": "t", "expectations": "s"}])
    write_suite(config.expectations_dir, "s", [{"type": "expect_the_unexpected", "kwargs": {}}])
    produce(config, "t", [("c", {"id": 1}, 10)])
    with pytest.raises(SuiteError, match="expect_the_unexpected"):
        Runner(config).run()
    assert QualityGate.for_table(config, TableSpec(name="x", topic="x")) is None


def test_config_rejects_overrides_without_a_suite(tmp_path):
    with pytest.raises(ConfigError, match="expectation_policies"):
        make_config(tmp_path, tables=[{"name": "a", "topic": "t", "expectation_policies": {"x": "warn"}}])
