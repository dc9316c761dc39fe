"""verify_table: live rows of a Delta table against the truth, by key and column."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from ingest.verify.compare import keys_of, verify_table

UTC = dt.UTC
EXPECTED = pa.table(
    {
        "id": pa.array([1, 2, 3], pa.int32()),
        "name": pa.array(["a", "b", "c"]),
        "balance": pa.array([Decimal("1.50"), Decimal("-2.00"), None], pa.decimal128(12, 2)),
        "seen": pa.array([dt.datetime(2024, 1, 1, 12, tzinfo=UTC)] * 3, pa.timestamp("us", tz="UTC")),
        "made": pa.array([dt.datetime(2024, 1, 1, 8, 30)] * 3, pa.timestamp("us")),
    }
)
KEY = ("id",)


def _write(path: Path, table: pa.Table) -> Path:
    write_deltalake(str(path), table)
    return path


def _actual(**changes: pa.Array) -> pa.Table:
    columns = {name: EXPECTED[name] for name in EXPECTED.column_names}
    columns.update(changes)
    return pa.table(columns)


def test_identical_table_is_ok(tmp_path: Path) -> None:
    result = verify_table("t", _write(tmp_path / "t", EXPECTED), EXPECTED, KEY)
    assert result.ok
    assert (
        result.expected_rows,
        result.actual_rows,
        result.missing,
        result.unexpected,
        result.different,
    ) == (3, 3, 0, 0, 0)
    assert result.examples == []


def test_wider_types_other_zones_and_cdc_columns_still_match(tmp_path: Path) -> None:
    actual = pa.table(
        {
            "id": pa.array([3, 1, 2], pa.int64()),  # order and width differ
            "name": pa.array(["c", "a", "b"]),
            "balance": pa.array([None, Decimal("1.5"), Decimal("-2")], pa.decimal128(20, 4)),
            "seen": pa.array(
                [dt.datetime(2024, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1)))] * 3,
                pa.timestamp("ns", tz="Europe/Paris"),
            ),
            "made": pa.array([dt.datetime(2024, 1, 1, 8, 30)] * 3, pa.timestamp("us")),
            "_cdc_position": pa.array(["x", "y", "z"]),
            "_cdc_deleted": pa.array([False, None, False]),
        }
    )
    assert verify_table("t", _write(tmp_path / "t", actual), EXPECTED, KEY).ok


def test_missing_row(tmp_path: Path) -> None:
    result = verify_table("t", _write(tmp_path / "t", EXPECTED.slice(0, 2)), EXPECTED, KEY)
    assert not result.ok and result.missing == 1 and result.unexpected == 0 and result.different == 0
    assert result.examples == ["t (id=3): missing"]


def test_unexpected_row(tmp_path: Path) -> None:
    extra = pa.concat_tables([EXPECTED, _actual(id=pa.array([9, 9, 9], pa.int32())).slice(0, 1)])
    result = verify_table("t", _write(tmp_path / "t", extra), EXPECTED, KEY)
    assert not result.ok and (result.missing, result.unexpected, result.different) == (0, 1, 0)
    assert result.examples[0].startswith("t (id=9): unexpected row")


def test_repeated_key_counts_as_unexpected(tmp_path: Path) -> None:
    twice = pa.concat_tables([EXPECTED, EXPECTED.slice(1, 1)])
    result = verify_table("t", _write(tmp_path / "t", twice), EXPECTED, KEY)
    assert (result.unexpected, result.ok) == (1, False)


def test_different_value_is_reported_with_both_values(tmp_path: Path) -> None:
    changed = _actual(balance=pa.array([Decimal("1.50"), Decimal("-2.01"), None], pa.decimal128(12, 2)))
    result = verify_table("t", _write(tmp_path / "t", changed), EXPECTED, KEY)
    assert (result.missing, result.unexpected, result.different, result.ok) == (0, 0, 1, False)
    assert "id=2" in result.examples[0] and "'balance'" in result.examples[0]
    assert "Decimal('-2.00')" in result.examples[0] and "Decimal('-2.01')" in result.examples[0]


def test_timestamp_one_microsecond_off_is_different(tmp_path: Path) -> None:
    shifted = _actual(
        made=pa.array(
            [dt.datetime(2024, 1, 1, 8, 30, 0, 1)] + [dt.datetime(2024, 1, 1, 8, 30)] * 2, pa.timestamp("us")
        )
    )
    assert verify_table("t", _write(tmp_path / "t", shifted), EXPECTED, KEY).different == 1


def test_null_versus_value_is_different(tmp_path: Path) -> None:
    nulled = _actual(name=pa.array(["a", None, "c"]))
    assert verify_table("t", _write(tmp_path / "t", nulled), EXPECTED, KEY).different == 1


def test_soft_deleted_rows_are_not_live(tmp_path: Path) -> None:
    flagged = _actual(_cdc_deleted=pa.array([False, True, False]))
    result = verify_table("t", _write(tmp_path / "t", flagged), EXPECTED, KEY)
    assert (result.actual_rows, result.missing, result.ok) == (2, 1, False)


def test_absent_column_differs_unless_expected_all_null(tmp_path: Path) -> None:
    with_tier = EXPECTED.append_column("tier", pa.array([None, None, None], pa.string()))
    assert verify_table("t", _write(tmp_path / "a", EXPECTED), with_tier, KEY).ok
    with_value = EXPECTED.append_column("tier", pa.array([None, "gold", None], pa.string()))
    result = verify_table("t", _write(tmp_path / "b", EXPECTED), with_value, KEY)
    assert (result.different, result.ok) == (1, False)
    assert "lacks the column" in result.examples[0]


def test_missing_delta_table_means_every_row_is_missing(tmp_path: Path) -> None:
    result = verify_table("t", tmp_path / "nothing", EXPECTED, KEY)
    assert (result.actual_rows, result.missing, result.ok) == (0, 3, False)


def test_explained_keys_are_reported_not_counted(tmp_path: Path) -> None:
    changed = _actual(name=pa.array(["a", "B", "c"])).slice(0, 2)  # id=2 differs, id=3 missing
    result = verify_table("t", _write(tmp_path / "t", changed), EXPECTED, KEY, explained_keys={(2,), (3,)})
    assert result.ok and (result.missing, result.different, result.explained) == (0, 0, 2)
    assert all(e.endswith("(explained)") for e in result.examples) and len(result.examples) == 2
    partly = verify_table("t", tmp_path / "t", EXPECTED, KEY, explained_keys={(2,)})
    assert (partly.ok, partly.missing, partly.explained) == (False, 1, 1)
    assert partly.examples[0] == "t (id=3): missing"  # real problems come before explained ones


def test_held_keys_are_named_and_still_counted(tmp_path: Path) -> None:
    """A difference on a key whose change the quarantine holds says so; the table still differs."""
    changed = _actual(name=pa.array(["a", "B", "c"])).slice(0, 2)  # id=2 differs, id=3 missing
    held = dict(zip(keys_of([{"id": 3}], KEY, EXPECTED), ["held in quarantine: t:0:7 (decode: bad)"], strict=True))
    result = verify_table("t", _write(tmp_path / "t", changed), EXPECTED, KEY, held=held)
    assert (result.ok, result.missing, result.different, result.held) == (False, 1, 1, 1)
    assert result.examples == ["t (id=2): column 'name' expected 'b', got 'B'",
                               "t (id=3): missing; held in quarantine: t:0:7 (decode: bad)"]


def test_keys_given_as_json_text_read_as_the_truths_key_types() -> None:
    """The quarantine keeps a key as JSON, with dates, decimals and timestamps as text: they find
    the truth's keys all the same, and a value that is not of its column's type finds none."""
    truth = pa.table({
        "day": pa.array([dt.date(2024, 2, 29)], pa.date32()),
        "amount": pa.array([Decimal("1.50")], pa.decimal128(12, 2)),
        "at": pa.array([dt.datetime(2024, 1, 1, 12, tzinfo=UTC)], pa.timestamp("us", tz="UTC")),
        "n": pa.array([7], pa.int16()),
    })
    key = ("day", "amount", "at", "n")
    found = keys_of([{"day": "2024-02-29", "amount": "1.50", "at": "2024-01-01 12:00:00+00:00", "n": 7},
                     {"day": "not a day", "amount": "1.50", "at": "2024-01-01 12:00:00+00:00", "n": 7}],
                    key, truth)
    expected = list(verify_table("t", Path("/nonexistent"), truth, key, held=dict.fromkeys(found, "held")).examples)
    assert expected == ["t (day=datetime.date(2024, 2, 29), amount=Decimal('1.50'), at=1704110400000000, n=7): "
                        "missing; held"]


def test_examples_are_capped_at_five(tmp_path: Path) -> None:
    many = pa.table({"id": pa.array(range(20), pa.int32()), "v": pa.array(range(20), pa.int64())})
    off = pa.table({"id": pa.array(range(20), pa.int32()), "v": pa.array(range(1, 21), pa.int64())})
    result = verify_table("t", _write(tmp_path / "t", off), many, KEY)
    assert result.different == 20 and len(result.examples) == 5


def test_unknown_key_column_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key columns"):
        verify_table("t", tmp_path / "t", EXPECTED, ("nope",))


def test_string_where_an_int_is_expected_is_different(tmp_path: Path) -> None:
    expected = pa.table({"id": pa.array([1], pa.int32()), "qty": pa.array([5], pa.int16())})
    actual = pa.table({"id": pa.array([1], pa.int32()), "qty": pa.array(["5"])})
    result = verify_table("t", _write(tmp_path / "t", actual), expected, KEY)
    assert (result.different, result.ok) == (1, False)


def test_columns_of_another_kind_are_named_unless_they_hold_only_nulls(tmp_path: Path) -> None:
    """A string where a decimal is read (a connector's decimal.handling.mode=string) is named with
    both types; a column the table first saw holding only nulls is a string, and is not."""
    actual = _actual(balance=pa.array(["1.50", "-2.00", None]), name=pa.array([None, None, None], pa.string()))
    expected = EXPECTED.set_column(1, "name", pa.array([None, None, None], pa.int64()))
    result = verify_table("t", _write(tmp_path / "t", actual), expected, KEY)
    assert result.other_types == {"balance": (pa.decimal128(12, 2), pa.string())}
    assert verify_table("t", tmp_path / "t", EXPECTED.select(["id", "seen", "made"]), KEY).other_types == {}


def test_a_zoned_timestamp_where_a_naive_one_is_read_is_named_and_still_compared(tmp_path: Path) -> None:
    """A connector of time.precision.mode=connect sends a local timestamp as Connect's Timestamp,
    an instant: named, though its values compare as instants (naive ones read as UTC)."""
    made = pa.array([dt.datetime(2024, 1, 1, 8, 30, tzinfo=UTC)] * 3, pa.timestamp("ms", tz="UTC"))
    result = verify_table("t", _write(tmp_path / "t", _actual(made=made)), EXPECTED, KEY)
    assert result.ok and result.other_types == {"made": (pa.timestamp("us"), pa.timestamp("us", tz="UTC"))}


def test_table_without_the_key_column_matches_nothing(tmp_path: Path) -> None:
    result = verify_table("t", _write(tmp_path / "t", EXPECTED.drop_columns(["id"])), EXPECTED, KEY)
    assert (result.missing, result.unexpected, result.ok) == (3, 3, False)
    assert "no key column" in result.examples[0]


def test_naive_timestamp_compares_as_utc_instant(tmp_path: Path) -> None:
    # A target that stores a MicroTimestamp as a UTC timestamp holds the same instants.
    as_utc = _actual(
        made=pa.array([dt.datetime(2024, 1, 1, 8, 30, tzinfo=UTC)] * 3, pa.timestamp("us", tz="UTC"))
    )
    assert verify_table("t", _write(tmp_path / "a", as_utc), EXPECTED, KEY).ok
    shifted = _actual(
        made=pa.array([dt.datetime(2024, 1, 1, 9, 30, tzinfo=UTC)] * 3, pa.timestamp("us", tz="UTC"))
    )
    assert verify_table("t", _write(tmp_path / "b", shifted), EXPECTED, KEY).different == 3
