"""The engine on a real Spark standalone cluster (issue 46, point 5).

A master and two workers on loopback (:class:`harness.spark_cluster.SparkCluster`), each in a
directory of its own, with no path of the driver's and no credential but the Kafka one an operator
puts in the workers' environment (the executors read Kafka over SASL); the driver (``ingest run
--continuous``) starts from yet another directory. The lake and the Spark checkpoints are on the S3
server, so no local path is shared between the driver and the workers. The ``shop`` workload runs
on PostgreSQL, then steady load while the run goes on; half the tables are applied with delta-rs,
half with delta-spark. A worker is killed (with its executors) mid-run and started again later; the
driver must ride it out without a restart, and every table must end equal to PostgreSQL
(``verify --source-db``), with balanced audits and nothing quarantined.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from harness.postgres.load import LoadGenerator
from harness.postgres.workload import WorkloadSpec, run_workload
from harness.spark_cluster import SparkCluster
from harness.stack.s3 import S3Server
from harness.stack_proofs.check import check_stack
from harness.stack_proofs.setup import engine_environment, reset_source, stack_config
from harness.torture.process import IngestProcess

from ingest.config import load_config
from ingest.lake.layout import TablePaths
from ingest.records import audit
from ingest.spark.session import QUICK_JIT
from ingest.verify.capture import wait_for_capture

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "cluster"
#: Which writer applies each table: both writers in one run.
WRITERS = {"customers": "delta-spark", "products": "delta-rs", "orders": "delta-spark", "order_items": "delta-rs"}


def _committed_batches(config: Any) -> int:
    return audit.read(config.tables_root / config.target.audit_table).num_rows  # none yet: 0


def _wait_for(check: Any, what: str, timeout: float, process: IngestProcess) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert process.alive, f"the driver died while waiting for {what}:\n{process.tail(30)}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n{process.tail(30)}"
        time.sleep(2)


def test_a_standalone_cluster_with_the_lake_on_s3_survives_a_worker_loss(
        stack: Any, pg_dsn: str, s3: S3Server, bucket: str, tmp_path: Path) -> None:
    driver_dir, workdir = tmp_path / "driver", tmp_path / "driver" / "engine"
    driver_dir.mkdir()
    reset_source(stack, SCHEMA)
    run_workload(pg_dsn, WorkloadSpec(seed=46, scale=0.05, schema=SCHEMA))

    # The executors read Kafka over SASL: its credentials are in the workers' environment (spark-env.sh)
    # and the driver's, as on a cluster an operator set up; the registry is asked on the driver only.
    sasl = {"KAFKA_SASL_JAAS_CONFIG": stack.engine_env()["KAFKA_SASL_JAAS_CONFIG"]}
    with SparkCluster(tmp_path / "cluster", workers=2, cores=1, memory="2g", worker_env=sasl) as cluster:
        path = stack_config(stack, workdir, schema=SCHEMA, sasl=True,
                            table_options={t: {"writer": w} for t, w in WRITERS.items()})
        data = yaml.safe_load(path.read_text())
        data["target"] = {"root": f"s3://{bucket}/lake", "storage": s3.storage(),
                          "checkpoint_dir": f"s3://{bucket}/checkpoints"}
        # Tuned as the suite's own session is (tests/conftest.py), for a cluster that shares two cores
        # with the stack and the other test worker: the quick JIT and the serial collector in every JVM,
        # no adaptive re-planning of a test's small queries.
        small = f"{QUICK_JIT} -XX:+UseSerialGC"
        data["spark"] = {"master": cluster.url, "shuffle_partitions": 2,
                         "conf": {"spark.executor.memory": "1g", "spark.cores.max": "2",
                                  "spark.driver.extraJavaOptions": small, "spark.executor.extraJavaOptions": small,
                                  "spark.sql.adaptive.enabled": "false"}}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        config = load_config(path)

        process = IngestProcess(path, tmp_path / "logs", engine_environment(stack, **s3.environment), cwd=driver_dir)
        process.start()
        load = LoadGenerator(pg_dsn, rate=20, duration=None, seed=46, schema=SCHEMA,
                             application_name="cluster-load").start()
        try:
            # The initial load is one commit per table; one more means the steady load is flowing.
            _wait_for(lambda: _committed_batches(config) >= len(WRITERS) + 1, "first commits", 400, process)
            before = _committed_batches(config)
            cluster.kill_worker(1)
            # One commit of each loaded table (orders, order_items) with one worker left.
            _wait_for(lambda: _committed_batches(config) >= before + 2, "commits on one worker", 300, process)
            cluster.start_worker(1)
            time.sleep(10)
        finally:
            load.stop()
            report = load.join(60)
        assert report.committed_changes > 0 and report.failed_transactions == 0, report
        assert wait_for_capture(pg_dsn, timeout=180, on_stall=stack.unstick_capture).ok

        check = check_stack(config, pg_dsn, wait=300)
        alive = process.alive
        process.stop(timeout=60)
    assert alive and process.starts == 1, process.tail(30)
    assert check.ok, (check.problems[:10], check.divergent_rows)
    assert check.source_rows > 0 and check.source_rows == check.delta_rows
    for name, writer in WRITERS.items():  # each table's last commit was written by the writer it names
        where = TablePaths.of(config, name).table
        last = DeltaTable(where.uri, storage_options=where.storage_options).history(1)[0]
        wrote = "delta-spark" if "Delta-Lake" in str(last.get("engineInfo", "")) else "delta-rs"
        assert wrote == writer, (name, last)
