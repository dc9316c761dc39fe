"""``verify --source-db`` compares only the columns a table keeps (``tables[].columns``).

A column left out never reaches the lake, so the source's value of it is no difference: verify
names the columns it leaves out in a note, and compares the rest. Before, each row holding a value
in such a column was "different" (the table lacks the column).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.config import ColumnSelection
from tests.stack.helpers import PREFIX, fresh_schema, run_and_verify, stack_config, write_config

pytestmark = [pytest.mark.stack]

SCHEMA = "selection"  # a previous run's schema and topics are dropped first


@pytest.mark.parametrize(("selection", "left_out"), [
    (ColumnSelection(exclude=("secret", "shape")), "'secret', 'shape'"),
    (ColumnSelection(include=("name",)), "'secret', 'note', 'shape'"),
])
def test_verify_compares_only_the_columns_a_table_keeps(stack: Any, pg_dsn: str, tmp_path: Path,
                                                       selection: ColumnSelection, left_out: str) -> None:
    fresh_schema(stack, pg_dsn, SCHEMA, [f"{prefix}.{SCHEMA}.t" for prefix in PREFIX.values()],
                 f"CREATE TABLE {SCHEMA}.t (id integer PRIMARY KEY, name text, secret text, note text, shape box)",
                 f"INSERT INTO {SCHEMA}.t VALUES (1, 'a', 'x', 'n', '((0,0),(1,1))'), (2, 'b', 'y', NULL, NULL)")
    settings = stack_config("json", tmp_path / "work", schema=SCHEMA, tables=["t"])
    spec = settings.tables[0].model_copy(update={"columns": selection})
    config = write_config(settings.model_copy(update={"tables": (spec,)}), tmp_path / "c.yaml")
    flat = run_and_verify(config, pg_dsn)
    assert f"column(s) {left_out}: left out by tables[].columns {selection.selects}, so not in the lake" in flat
    assert "box is not compared" not in flat  # what verify would say of a column it compared
