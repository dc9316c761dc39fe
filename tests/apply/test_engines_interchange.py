"""delta-rs and delta-spark continue each other's tables, and every reader sees the same live rows.

The way back from deletion vectors is refused with the way out named (issue 11, point 5).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from ingest.apply.journey import apply_parts
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.commit.state import load_state
from ingest.config import TableSpec
from ingest.errors import TableError
from ingest.lake.delta import has_deletion_vectors, open_table, read_all, table_schema
from ingest.model import ColumnSpec
from ingest.records import audit, quarantine
from tests.factories import change, decoded_rows
from tests.harness import paths_in

pytestmark = pytest.mark.spark
SPEC = TableSpec(name="customers", topic="t")


def _apply(engine, paths, items, *, first_offset, batch_id):
    return apply_parts(SPEC, paths, decoded_rows(items, first_offset=first_offset), batch_id=batch_id,
                       run_id="test", writer=engine).record


def _live(paths) -> dict[int, str]:
    return {r["id"]: r["name"] for r in read_all(open_table(paths.table)).to_pylist() if not r["_cdc_deleted"]}


def _spark_live(spark, path) -> dict[int, str]:
    rows = spark.read.format("delta").load(str(path)).where("NOT coalesce(_cdc_deleted, false)").collect()
    return {r["id"]: r["name"] for r in rows}


def test_delta_spark_continues_a_delta_rs_table_and_delta_rs_takes_it_back(tmp_path, spark):
    paths = paths_in(tmp_path, "customers")
    rs, ds = DeltaRsWriter(), DeltaSparkWriter(spark)
    _apply(rs, paths, [change("c", k, 10 + k, name=f"rs{k}") for k in range(4)], first_offset=0, batch_id=0)
    # delta-spark resumes after offset 3: the replayed offsets 2..3 are already applied, 4..5 are new
    rec = _apply(ds, paths, [change("u", 2, 12, name="old"), change("d", 3, 13), change("u", 1, 20, name="ds1"),
                             change("d", 0, 21)], first_offset=2, batch_id=1)
    assert rec.received == 2 and rec.updated == 1 and rec.deleted == 1 and rec.balanced
    # continued, not converted: the table keeps delta-rs's protocol, so delta-rs can take it back
    assert not has_deletion_vectors(open_table(paths.table))
    _apply(rs, paths, [change("c", 9, 30, name="rs9")], first_offset=6, batch_id=2)
    expected = {1: "ds1", 2: "rs2", 3: "rs3", 9: "rs9"}
    assert _live(paths) == expected == _spark_live(spark, paths.table)
    assert load_state(paths.table).applied_offset("t", 0) == 6
    assert sorted(r["batch_id"] for r in audit.read(paths.audit).to_pylist()) == [0, 1, 2]


def test_a_delta_spark_table_with_deletion_vectors_reads_everywhere_and_delta_rs_refuses_it(tmp_path, spark):
    paths = paths_in(tmp_path, "customers")
    ds = DeltaSparkWriter(spark)
    _apply(ds, paths, [change("c", k, 10 + k, name=f"n{k}") for k in range(6)], first_offset=0, batch_id=0)
    rec = _apply(ds, paths, [change("d", 1, 20), change("u", 2, 21, name="two"), "garbage: not a change"],
                 first_offset=6, batch_id=1)
    assert rec.deleted == 1 and rec.updated == 1 and rec.quarantined == 1 and rec.balanced
    # the audit row says how: rows marked by a deletion vector, none copied into rewritten files
    metrics = json.loads(rec.merge_metrics)
    assert rec.engine == "delta-spark" and metrics["numTargetDeletionVectorsAdded"] >= 1
    assert metrics["numTargetRowsCopied"] == 0 and metrics["numTargetRowsMatchedDeleted"] == 1
    table = open_table(paths.table)
    assert has_deletion_vectors(table)
    expected = {0: "n0", 2: "two", 3: "n3", 4: "n4", 5: "n5"}
    # polars (the framework's reads), Spark SQL and DuckDB over the same snapshot
    assert _live(paths) == expected == _spark_live(spark, paths.table)
    # the deleted row is marked by a deletion vector, not rewritten away: the files still hold it
    assert spark.read.parquet(f"{paths.table}/*.parquet").count() > len(expected)
    # Spark SQL reads the audit and quarantine tables too (delta-rs writes those)
    assert spark.read.format("delta").load(str(paths.audit)).count() == 2
    assert spark.read.format("delta").load(str(paths.quarantine)).count() == len(quarantine.read(paths.quarantine))
    with pytest.raises(TableError, match=r"deletion vectors.*DROP FEATURE deletionVectors"):
        _apply(DeltaRsWriter(), paths, [change("c", 7, 30)], first_offset=9, batch_id=2)
    assert _live(paths) == expected  # nothing was written by the refused engine


def test_without_deletion_vectors_delta_rs_continues_a_delta_spark_table(tmp_path, spark):
    paths = paths_in(tmp_path, "customers")
    _apply(DeltaSparkWriter(spark, deletion_vectors=False), paths,
           [change("c", k, 10 + k, name=f"n{k}") for k in range(3)], first_offset=0, batch_id=0)
    assert not has_deletion_vectors(open_table(paths.table))
    # delta-rs resumes from the offsets delta-spark recorded in its commit's metadata
    rec = _apply(DeltaRsWriter(), paths, [change("u", 2, 12, name="x"), change("d", 0, 20)], first_offset=2,
                 batch_id=1)
    assert rec.received == 1 and rec.deleted == 1
    assert _live(paths) == {1: "n1", 2: "n2"} == _spark_live(spark, paths.table)


def test_maintenance_compacts_and_vacuums_a_table_with_deletion_vectors(tmp_path, spark):
    from assets.maintenance import MaintenanceOptions, maintain

    paths = paths_in(tmp_path, "customers")
    ds = DeltaSparkWriter(spark)
    for b in range(3):
        _apply(ds, paths, [change("c", 10 * b + k, 10 * b + k, name=f"n{b}") for k in range(3)]
               + [change("d", 10 * (b - 1), 10 * b + 5)] * (b > 0), first_offset=10 * b, batch_id=b)
    before = _live(paths)
    files = len(open_table(paths.table).file_uris())
    report = maintain(paths.table, MaintenanceOptions(layout="zorder", vacuum_retention_hours=0),
                      key_columns=("id",))
    assert report.files_removed == files and report.files_added == 1 and report.vacuumed_files >= files
    table = open_table(paths.table)
    assert len(table.file_uris()) == 1 and report.version_after > report.version_before
    assert _live(paths) == before == _spark_live(spark, paths.table)
    assert load_state(paths.table).applied_offset("t", 0) == 23  # maintenance commits keep the progress


TYPED = (ColumnSpec("id", "integer", False), ColumnSpec("b", "byte"), ColumnSpec("s", "short"),
         ColumnSpec("l", "long"), ColumnSpec("f", "float"), ColumnSpec("d", "double"), ColumnSpec("ok", "boolean"),
         ColumnSpec("bin", "binary"), ColumnSpec("day", "date"), ColumnSpec("at", "timestamp"),
         ColumnSpec("local", "timestamp_ntz"), ColumnSpec("amount", "decimal(12,2)"), ColumnSpec("name", "string"))


def test_every_column_type_keeps_its_type_and_values_on_both_engines(tmp_path, spark):
    """Caught by the delta-spark torture: a timestamp without time zone must stay timestamp_ntz."""
    values = {"b": 7, "s": -300, "l": 2**40, "f": 1.5, "d": 2.25, "ok": True, "bin": b"\x00\xff",
              "day": date(2024, 2, 29), "at": datetime(2024, 6, 3, 8, 8, 57, 389000, tzinfo=UTC),
              "local": datetime(2024, 6, 3, 10, 8, 57, 389000), "amount": Decimal("20214.74")}
    tables = {}
    for engine in (DeltaRsWriter(), DeltaSparkWriter(spark)):
        paths = paths_in(tmp_path / engine.name, "customers")
        _apply(engine, paths, [change("c", 1, 10, columns=TYPED, extra=values)], first_offset=0, batch_id=0)
        _apply(engine, paths, [change("u", 1, 11, columns=TYPED, extra={**values, "name": "second"}),
                               change("c", 2, 12, columns=TYPED, extra=values)], first_offset=1, batch_id=1)
        table = open_table(paths.table)
        tables[engine.name] = (table_schema(table), read_all(table).sort_by("id").select([c.name for c in TYPED]))
    (rs_schema, rs_rows), (ds_schema, ds_rows) = tables["delta-rs"], tables["delta-spark"]
    assert [(f.name, f.type) for f in ds_schema] == [(f.name, f.type) for f in rs_schema]
    assert ds_rows.to_pylist() == rs_rows.to_pylist()
    assert ds_rows.to_pylist()[0] == {"id": 1, **values, "name": "second"}


def test_a_table_with_int96_files_from_before_reads_the_same_with_new_files(tmp_path, spark):
    """delta-spark wrote timestamps as INT96 until the engine asked for int64 microseconds: a table
    from before holds both kinds of files, and delta-rs and Spark read every row's timestamps alike."""
    import pyarrow.parquet as pq

    paths = paths_in(tmp_path, "customers")
    ds = DeltaSparkWriter(spark)
    ds.session().conf.set("spark.sql.parquet.outputTimestampType", "INT96")  # Spark's default, as before
    _apply(ds, paths, [change("c", k, 10 + k, name=f"old{k}") for k in range(2)], first_offset=0, batch_id=0)
    # a writer of the engine's session as it is now
    _apply(DeltaSparkWriter(spark), paths, [change("c", 5, 20, name="new")], first_offset=2, batch_id=1)
    kinds = {pq.ParquetFile(f).metadata.schema.column(
        pq.ParquetFile(f).schema_arrow.get_field_index("_cdc_ingested_at")).physical_type
        for f in Path(str(paths.table)).glob("*.parquet")}
    assert kinds == {"INT96", "INT64"}
    stamps = {r["id"]: r["_cdc_ingested_at"] for r in read_all(open_table(paths.table)).to_pylist()}
    by_spark = {r["id"]: r["_cdc_ingested_at"] for r in spark.read.format("delta").load(str(paths.table)).collect()}
    assert sorted(stamps) == [0, 1, 5]
    assert all(abs((stamps[k] - by_spark[k].replace(tzinfo=UTC)).total_seconds()) < 1e-6 for k in stamps)
    assert all(abs((datetime.now(UTC) - t).total_seconds()) < 600 for t in stamps.values())
