"""The runbook "A column changed type at the source" (docs/operations.md), step by step.

A column's values turn from integers into text at the source: the table stops in one line that names
the column, both types and the command; ``ingest retype`` rewrites the table with the column as
``string`` (delta-rs for a delta-rs table, Spark for a delta-spark one, whose deletion vectors
delta-rs cannot read); the next run applies the change that stopped it, from the offsets the
table's own commits record. A value that does not convert refuses the rewrite, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import load_config
from ingest.lake.delta import open_table, read_all
from ingest.stream.runner import Runner
from tests.dagster.conftest import produce
from tests.harness import ingest_cli

TOPIC = "app.public.items"



@pytest.mark.spark
@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_a_column_that_changed_type_is_retyped_and_the_table_goes_on(tmp_path: Path, spark: Any,
                                                                      writer: str) -> None:
    raw = {"workdir": str(tmp_path / "work"), "source": {"value_format": "json"}, "target": {"writer": writer},
           "tables": [{"name": "items", "topic": TOPIC}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    produce(config, TOPIC, [("c", {"id": i, "qty": i * 10}, 100 + i) for i in range(1, 6)])
    assert not Runner(config, spark=spark).run().failed

    # Step 1: the source's column became text; the table stops, saying what to do.
    produce(config, TOPIC, [("u", {"id": i, "qty": f"{i} dozen"}, 200 + i) for i in (1, 2)])
    stopped = Runner(config, spark=spark).run()
    error = stopped.tables["items"].error or ""
    assert stopped.failed and "column 'qty' changed type from long to string" in error
    assert "ingest retype items qty <type>" in error

    # A type the stored values do not fit is refused in one line, and nothing is written.
    before = open_table(config.table_path("items")).version()  # type: ignore[union-attr]
    refused = ingest_cli("retype", "items", "qty", "date", "-c", str(path))
    assert refused.returncode != 0 and "does not convert to date" in refused.stderr, refused
    assert "Traceback" not in refused.stderr and "at org.apache" not in refused.stderr, refused.stderr[-3000:]
    assert open_table(config.table_path("items")).version() == before  # type: ignore[union-attr]

    # Step 2: give the column the new type.
    done = ingest_cli("retype", "items", "qty", "string", "-c", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "column qty int64 -> string; 5 rows rewritten" in done.stdout, done.stdout

    # Step 3: run again; the change that stopped the table is applied.
    report = Runner(config, spark=spark).run()
    assert not report.failed, report.tables["items"].error
    assert report.tables["items"].total("updated") == 2
    rows = {r["id"]: r["qty"] for r in read_all(open_table(config.table_path("items"))).to_pylist()}  # type: ignore[arg-type]
    assert rows == {1: "1 dozen", 2: "2 dozen", 3: "30", 4: "40", 5: "50"}
