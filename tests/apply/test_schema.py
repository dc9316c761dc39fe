import pytest

from ingest.errors import SchemaIncompatibleError
from ingest.model import ColumnSpec
from ingest.rules.schema import combine, holds, plan_schema


@pytest.mark.parametrize(
    ("wide", "narrow", "ok"),
    [
        ("long", "integer", True), ("integer", "long", False), ("short", "byte", True),
        ("double", "float", True), ("float", "double", False), ("double", "long", True), ("long", "double", False),
        ("decimal(12,2)", "decimal(10,2)", True), ("decimal(12,4)", "decimal(10,2)", True),
        ("decimal(12,1)", "decimal(10,2)", False), ("decimal(11,3)", "decimal(10,2)", True),
        ("decimal(10,3)", "decimal(10,2)", False),
        ("string", "long", False), ("timestamp", "timestamp_ntz", False),
    ],
)
def test_widening_rules(wide, narrow, ok):
    assert holds(wide, narrow) is ok


def test_plan_adds_widens_and_keeps():
    current = [ColumnSpec("id", "integer"), ColumnSpec("amount", "decimal(10,2)"), ColumnSpec("n", "long")]
    incoming = [ColumnSpec("id", "long"), ColumnSpec("amount", "decimal(10,2)"), ColumnSpec("n", "integer"),
                ColumnSpec("tier", "string")]
    plan = plan_schema("t", current, incoming)
    assert [(c.name, c.type) for c in plan.columns] == [("id", "long"), ("amount", "decimal(10,2)"),
                                                        ("n", "long"), ("tier", "string")]
    assert plan.widened == [("id", "integer", "long")] and [c.name for c in plan.added] == ["tier"]


def test_incompatible_change_names_column_and_both_types():
    with pytest.raises(SchemaIncompatibleError) as info:
        plan_schema("orders", [ColumnSpec("status", "string")], [ColumnSpec("status", "integer")])
    assert info.value.column == "status" and info.value.current == "string" and info.value.incoming == "integer"
    assert "orders" in str(info.value) and "nothing was committed" in str(info.value)


def test_combine_takes_the_wider_version_within_a_batch():
    merged = combine("t", [[ColumnSpec("x", "integer")], [ColumnSpec("x", "long"), ColumnSpec("y", "string")]])
    assert [(c.name, c.type) for c in merged] == [("x", "long"), ("y", "string")]
    with pytest.raises(SchemaIncompatibleError):
        combine("t", [[ColumnSpec("x", "integer")], [ColumnSpec("x", "string")]])


def test_a_null_only_schemaless_column_takes_any_type_and_is_stored_as_string_when_new():
    assert holds("long", "void") and holds("decimal(10,2)", "void") and not holds("void", "long")
    assert combine("t", [[ColumnSpec("n", "void")], [ColumnSpec("n", "long")]]) == [ColumnSpec("n", "long")]
    assert combine("t", [[ColumnSpec("n", "long")], [ColumnSpec("n", "void")]]) == [ColumnSpec("n", "long")]
    kept = plan_schema("t", [ColumnSpec("n", "long")], [ColumnSpec("n", "void")])
    assert kept.columns == [ColumnSpec("n", "long")] and not kept.changed
    added = plan_schema("t", [ColumnSpec("id", "long")], [ColumnSpec("s", "void")])
    assert added.columns[1].type == "string" and added.added[0].type == "string"
    assert plan_schema("t", None, [ColumnSpec("s", "void")]).columns[0].type == "string"
