"""The whole journey with the lake on a real S3 API server: run, verify, status, query, maintenance.

The topic log stays local; every Delta table (targets, tombstones, audit, quarantine) and the Spark
checkpoints are written to the bucket, by each engine (delta-spark and the checkpoints through
Hadoop's S3A), and nothing of the lake is written to local disk.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml
from harness.demo import TableFingerprint, prepare_workload, verify_all
from typer.testing import CliRunner

from ingest.cli import app
from ingest.config import load_config
from ingest.lake.location import s3_client
from ingest.records import audit, quarantine
from ingest.stream.runner import Runner
from tests.harness import make_config

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", params=["delta-rs", "delta-spark"])
def on_s3(request, s3, tmp_path_factory, spark):
    """The end-to-end workload (duplicates, reorders, a truncate, an added column, TOAST, malformed
    messages) ingested into a lake on the S3 server, by each engine."""
    # A bucket of its own: under TEST_S3=stack the test workers share one server, and two workers
    # ingesting into one prefix are two writers, which the lease (rightly) refuses.
    bucket = f"journey-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(bucket)
    workdir = tmp_path_factory.mktemp("s3-e2e")
    path = make_config(workdir, batch=300, engine=request.param).workdir / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    # delta-spark: every look-up of stored rows reads the bucket from Spark's executors, as a large
    # table's would (the tables here are small enough for the driver's own read).
    raw["target"].update(root=f"s3://{bucket}/{request.param}", storage=s3.storage(),
                         checkpoint_dir=f"s3://{bucket}/checkpoints-{request.param}", driver_lookup_rows=0)
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    prepare_workload(config, events=800, seed=5, malformed_fraction=0.02)
    report = Runner(config, spark=spark).run()
    return config, report, path


def test_tables_on_s3_equal_the_source_and_nothing_lands_on_local_disk(on_s3):
    config, report, _ = on_s3
    assert not report.failed, report
    results = verify_all(config)
    assert results and all(r.ok for r in results), [(r.table, r.examples) for r in results if not r.ok]
    assert not (config.workdir / "tables").exists()
    root = config.tables_root
    pages = s3_client(root).get_paginator("list_objects_v2").paginate(Bucket=root.bucket, Prefix=root.key + "/")
    written = {obj["Key"].split("/")[1] for page in pages for obj in page.get("Contents", [])}
    assert {t.name for t in config.tables} | {"_cdc_audit", "_cdc_quarantine"} <= written
    assert "_cdc_locks" not in written  # every lease was given back at the end of the run


def _keys(where) -> set[str]:
    pages = s3_client(where).get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=where.key + "/")
    return {obj["Key"][len(where.key) + 1:] for page in pages for obj in page.get("Contents", [])}


def test_spark_checkpoints_on_s3_are_resumed_and_a_damaged_one_is_discarded(on_s3, spark):
    from ingest.stream import checkpoint
    from ingest.stream.queries import query_name

    config, _, _ = on_s3
    assert not (config.workdir / "checkpoints").exists()
    query = config.checkpoint_location / query_name(list(config.tables))
    if not _keys(query):  # the driver applied it alone (source.driver_seconds): a replay goes through Spark
        assert not Runner(config, spark=spark).run(from_beginning=True).failed
    written = _keys(query)
    assert {"metadata", "offsets/0", "commits/0"} <= written, sorted(written)
    before = {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    applied = {t.topic: (lambda p: None, t.name) for t in config.tables}  # as if no table had applied anything
    assert not checkpoint.inspect(query, topics=applied).ok  # it claims progress: the check reads it on S3

    # Damage it the way a half-written upload would: the last offsets file truncated.
    last = max(int(n.split("/")[1]) for n in written if n.startswith("offsets/") and n.split("/")[1].isdigit())
    s3_client(query).put_object(Bucket=query.bucket, Key=f"{query.key}/offsets/{last}", Body=b"v1\n{")
    Runner(config, spark=spark, full_start=True).run()  # caught up: only a forced start reads the checkpoint
    assert before == {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    if f"offsets/{last}" in _keys(query):  # discarded; the resumed query wrote its own batches
        body = s3_client(query).get_object(Bucket=query.bucket, Key=f"{query.key}/offsets/{last}")["Body"].read()
        assert body != b"v1\n{"
    assert checkpoint.inspect(query, topics={t.topic: ((lambda p, t=t: _applied(config, t, p)), t.name)
                                             for t in config.tables}).ok


def _applied(config, spec, partition):
    from ingest.commit.state import load_state

    return load_state(config.table_path(spec.name)).applied_offset(spec.topic, partition)


def test_audit_and_quarantine_on_s3(on_s3):
    config, _, _ = on_s3
    rows = audit.read(config.tables_root / config.target.audit_table).to_pylist()
    assert len(rows) >= 3 and all(r["balanced"] for r in rows)
    held = quarantine.read(config.tables_root / config.target.quarantine_table)
    assert held.num_rows > 0 and all(held["reason"].to_pylist())


def test_a_replay_from_the_beginning_changes_no_table_on_s3(on_s3, spark):
    config, _, _ = on_s3
    before = {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    Runner(config, spark=spark).run(from_beginning=True)
    assert before == {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}


def test_status_verify_and_query_commands_read_the_s3_lake(on_s3):
    config, _, path = on_s3
    runner = CliRunner()
    status = runner.invoke(app, ["status", "-c", str(path)])
    assert status.exit_code == 0, status.output
    assert all(t.name in status.output for t in config.tables)
    verified = runner.invoke(app, ["verify", "-c", str(path)])
    assert verified.exit_code == 0, verified.output
    rows = runner.invoke(app, ["query", "-c", str(path), "--format", "csv",
                               "SELECT count(*) AS n FROM customers"])
    assert rows.exit_code == 0, rows.output
    live = verify_all(config)
    expected = next(r for r in live if r.table == "customers").expected_rows
    assert rows.output.strip().splitlines()[-1] == str(expected)


def test_a_run_on_a_table_whose_lease_another_run_holds_stops_before_spark(on_s3):
    from ingest.errors import TableLockedError
    from ingest.lake.lease import Lease

    config, _, _ = on_s3
    holder = Lease(config.tables_root, "orders", ttl=30).acquire()
    try:
        with pytest.raises(TableLockedError, match="another writer holds its lease") as refused:
            Runner(config).run()  # no SparkSession given: the refusal comes before one would start
        assert refused.value.table == "orders"
    finally:
        holder.release()
    root = config.tables_root
    keys = s3_client(root).list_objects_v2(Bucket=root.bucket, Prefix=root.key + "/_cdc_locks/")
    assert keys.get("KeyCount") == 0  # the leases it took before the refusal were given back


def test_maintenance_compacts_and_vacuums_a_table_on_s3(on_s3):
    from assets.maintenance import MaintenanceOptions, maintain_cdc_table

    config, _, _ = on_s3
    spec = config.table("orders")
    before = TableFingerprint.of(config.table_path("orders"))
    report = maintain_cdc_table(config, spec, MaintenanceOptions(layout="compact", vacuum_retention_hours=0,
                                                                 checkpoint=True, cleanup_log=False))
    # Each MERGE rewrote the files it touched (delta-rs) or marked rows in deletion vectors that
    # compaction then folds in (delta-spark): vacuum deletes the files no version refers to any more.
    assert report.exists and report.vacuumed_files > 0, report
    assert report.version_after > report.version_before, report
    if config.target.writer == "delta-rs":
        assert report.checkpoint_version == report.version_after, report
    assert TableFingerprint.of(config.table_path("orders")) != before
    assert all(r.ok for r in verify_all(config))


def test_two_processes_committing_to_one_s3_table_never_lose_a_commit(s3, bucket, tmp_path: Path):
    """Delta's commit on S3 needs a create-only put of each log entry: of two writers racing for a
    version one wins, the other retries or fails cleanly, and no commit is lost."""
    options = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    uri = f"s3://{bucket}/race"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import pyarrow as pa
        from deltalake import DeltaTable, write_deltalake
        from deltalake.exceptions import CommitFailedError
        me, done, failed = sys.argv[1], 0, 0
        for i in range(15):
            try:
                write_deltalake({uri!r}, pa.table({{"writer": [me], "n": [i]}}), mode="append",
                                storage_options={options!r})
                done += 1
            except CommitFailedError:
                failed += 1
        print(done, failed)
    """))
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from ingest.lake.delta import read_all

    write_deltalake(uri, pa.table({"writer": ["seed"], "n": [-1]}), storage_options=options)
    writers = [subprocess.Popen([sys.executable, str(script), name], stdout=subprocess.PIPE, text=True)
               for name in ("a", "b")]
    counts = [tuple(map(int, w.communicate(timeout=300)[0].split())) for w in writers]
    assert all(w.returncode == 0 for w in writers)
    table = DeltaTable(uri, storage_options=options)
    data = read_all(table)
    committed = sum(done for done, _ in counts)
    assert data.num_rows == committed + 1  # every commit a writer saw succeed is in the table, once
    assert table.version() == committed  # versions 0..committed, no gap, no overwrite
    assert [entry["version"] for entry in table.history()] == list(range(committed, -1, -1))
