"""The MERGE statement both engines run (ingest.commit.merge_sql): one text, two SQL dialects.

What each statement does to a table is proven by the engine suites, which run on delta-rs and on
delta-spark; these tests pin the statement's shape and that the two dialects differ only in how
they write identifiers, strings and timestamps.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from ingest.commit.delta_rs import DIALECT as RS
from ingest.commit.merge_sql import Dialect, MergeStatement, current_merge, history_merge
from ingest.commit.spark_merge import DIALECT as SPARK
from ingest.model import ColumnSpec
from ingest.rules.history import DROP
from ingest.rules.plan import TOAST_FLAG

COLUMNS = [ColumnSpec("id", "long", False), ColumnSpec("notes", "string", True)]
SOURCE = pa.table({"id": pa.array([7, 3, 12], pa.int64()), "notes": ["a", None, "c"],
                   TOAST_FLAG + "notes": [False, True, False]})


def _plain(statement: MergeStatement) -> list[str]:
    """The statement as text with identifier quotes and timestamp spelling taken out."""
    def norm(text: str | None) -> str:
        text = re.sub(r"arrow_cast\('([^']*)Z', '[^']*'\)", r"TS(\1)", text or "")
        text = re.sub(r"CAST\('([^']*)\+00:00' AS TIMESTAMP\)", r"TS(\1)", text)
        return text.replace("NULL", "TS()").replace("CAST(TS() AS TIMESTAMP)", "TS()").replace('"', "").replace("`", "")
    return [norm(statement.on)] + [
        f"{c.kind} {norm(c.condition)} {sorted((norm(k), norm(v)) for k, v in (c.sets or {}).items())}"
        for c in statement.clauses]


def _current(d: Dialect, mode: str = "hard", truncate: str | None = None, keys: tuple[str, ...] = ("id",)
             ) -> MergeStatement:
    return current_merge(SOURCE, d, key_columns=keys, columns=COLUMNS, delete_mode=mode,  # type: ignore[arg-type]
                         truncate=truncate)


@pytest.mark.parametrize(("mode", "truncate"), [("hard", None), ("hard", "0001"), ("soft", None), ("soft", "0001")])
def test_both_dialects_write_the_same_statement(mode: str, truncate: str | None) -> None:
    """Apart from delta-spark's list of the batch's keys (below)."""
    unlisted = replace(SPARK, key_list_limit=0)
    assert _plain(_current(RS, mode, truncate)) == _plain(_current(unlisted, mode, truncate))
    assert '"id"' in _current(RS, mode, truncate).on and "`id`" in _current(SPARK, mode, truncate).on


def test_delta_spark_lists_the_batchs_keys_in_the_join_and_delta_rs_does_not() -> None:
    """The list is implied by the key equality; delta-spark filters the target's rows by it before the
    join that writes a deletion-vector MERGE's changes."""
    assert _current(SPARK).on == "t.`id` >= 3 AND t.`id` <= 12 AND t.`id` IN (7L, 3L, 12L) AND t.`id` = s.`id`"
    assert " IN " not in _current(RS).on
    assert _current(SPARK, truncate="0001").on == "t.`id` = s.`id`"  # a truncate sees every row
    statement = history_merge(SOURCE.drop_columns([TOAST_FLAG + "notes"]), SPARK, key_columns=("id",),
                              columns=COLUMNS, truncate=None, truncate_ts=None)
    assert "t.`id` IN (7L, 3L, 12L) AND " in statement.on


def test_the_key_list_is_the_first_key_columns_distinct_values_within_the_limit() -> None:
    source = pa.table({"region": ["eu", "it's", None, "eu"], "n": [1, 2, 3, 4]})
    on = current_merge(source, SPARK, key_columns=("region", "n"), columns=[], delete_mode="hard", truncate=None).on
    assert "t.`region` IN ('eu', 'it\\'s') AND " in on  # distinct, no null, Spark's quoting
    assert "t.`n` IN" not in on
    small = replace(SPARK, key_list_limit=1)
    assert " IN " not in current_merge(source, small, key_columns=("region", "n"), columns=[], delete_mode="hard",
                                       truncate=None).on
    long_keys = pa.table({"region": [f"{n:0300d}" for n in range(1_000)], "n": range(1_000)})
    assert " IN " not in current_merge(long_keys, SPARK, key_columns=("region",), columns=[], delete_mode="hard",
                                       truncate=None).on  # 300 kB of keys: too long for every commit's record
    assert " IN " in current_merge(long_keys.slice(0, 900), SPARK, key_columns=("region",), columns=[],
                                   delete_mode="hard", truncate=None).on
    dated = pa.table({"day": pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))})
    assert " IN " not in current_merge(dated, SPARK, key_columns=("day",), columns=[], delete_mode="hard",
                                       truncate=None).on  # no plain literal: no list


def test_the_batch_key_range_bounds_the_join_unless_a_truncate_must_see_every_row() -> None:
    assert _current(RS).on == 't."id" >= 3 AND t."id" <= 12 AND t."id" = s."id"'
    truncating = _current(RS, truncate="0001")
    assert truncating.on == 't."id" = s."id"'
    assert _current(RS, keys=()).on == "false"  # only a truncate: nothing to join on


def test_hard_mode_deletes_and_a_truncate_removes_older_rows() -> None:
    kinds = [c.kind for c in _current(RS, "hard", "0001").clauses]
    assert kinds == ["matched_delete", "matched_update", "not_matched_insert", "not_matched_by_source_delete"]
    guard = _current(RS, "hard").clauses[0].condition
    assert guard is not None and guard.startswith("s._cdc_deleted AND (CASE WHEN s._cdc_position = t._cdc_position")
    assert "'0001'" in (_current(RS, "hard", "0001").clauses[-1].condition or "")


def test_soft_mode_marks_deletes_and_truncated_rows_and_keeps_stored_values() -> None:
    statement = _current(SPARK, "soft", "it's")
    kinds = [c.kind for c in statement.clauses]
    assert kinds == ["matched_update", "matched_update", "not_matched_insert", "not_matched_by_source_update"]
    soft_delete = statement.clauses[0].sets or {}
    assert "`notes`" not in soft_delete and "`_cdc_unknown_columns`" not in soft_delete  # stored values stay
    marks = statement.clauses[-1].sets or {}
    assert marks["_cdc_position"] == "'it\\'s'"  # Spark escapes quotes with a backslash
    assert _current(RS, "soft", "it's").clauses[-1].sets["_cdc_position"] == "'it''s'"  # type: ignore[index]
    assert statement.clauses[2].condition is None  # soft mode inserts even a delete, marked


def test_an_unchanged_toast_value_keeps_the_stored_one_on_update_only() -> None:
    update = _current(RS).clauses[1].sets or {}
    assert update['"notes"'] == f'CASE WHEN s."{TOAST_FLAG}notes" THEN t."notes" ELSE s."notes" END'
    assert update['"id"'] == 's."id"'
    assert _current(RS).clauses[2].sets['"notes"'] == 's."notes"'  # type: ignore[index]


@pytest.mark.parametrize("ended_at", [None, datetime(2024, 6, 3, 8, 0, 1, 250000, tzinfo=UTC)])
def test_history_matches_versions_by_key_and_position_and_a_truncate_ends_current_ones(
        ended_at: datetime | None) -> None:
    source = SOURCE.drop_columns([TOAST_FLAG + "notes"]).append_column(DROP, pa.array([False, True, False]))
    ends = {"truncate": "0002", "truncate_ts": ended_at}
    rs = history_merge(source, RS, key_columns=("id",), columns=COLUMNS, **ends)
    spark = history_merge(source, SPARK, key_columns=("id",), columns=COLUMNS, **ends)
    assert _plain(rs) == _plain(spark)
    assert rs.on == 't."id" = s."id" AND t._cdc_position = s._cdc_position'  # a truncate: no bounds
    assert [c.kind for c in rs.clauses][-1] == "not_matched_by_source_update"
    valid_to = (spark.clauses[-1].sets or {})["_cdc_valid_to"]
    assert valid_to == ("CAST(NULL AS TIMESTAMP)" if ended_at is None
                        else "CAST('2024-06-03T08:00:01.250000+00:00' AS TIMESTAMP)")
    untruncated = history_merge(source, RS, key_columns=("id",), columns=COLUMNS, truncate=None, truncate_ts=None)
    assert untruncated.on.startswith('t."id" >= 3 AND t."id" <= 12 AND ')
    assert len(untruncated.clauses) == 3
