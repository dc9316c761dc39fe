"""``demo-stack`` end to end on the real stack, and ``verify --source-db`` catching differences.

The module runs the demo flow once (PostgreSQL schema and MariaDB database ``shoptest``, so
``make demo-stack``'s ``shop`` is left alone; smaller workloads than the demo's), on temporary
workdirs and the shared SparkSession. The tests after the first damage what it produced on purpose:
run them in file order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from harness.postgres.workload import WorkloadSpec
from harness.stack_proofs.demo import DemoStackResult, run_demo_stack
from typer.testing import CliRunner

from ingest.cli import app
from ingest.config import IngestConfig
from tests.stack.helpers import mariadb_config, stack_config, write_config

pytestmark = [pytest.mark.stack, pytest.mark.spark]

SCHEMA = "shoptest"
runner = CliRunner()


@pytest.fixture(scope="module")
def demo(stack: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> DemoStackResult:
    root = tmp_path_factory.mktemp("demo-stack")
    configs = [(fmt, stack_config(fmt, root / fmt, schema=SCHEMA)) for fmt in ("avro", "json")]
    lines: list[str] = []
    result = run_demo_stack(configs, spec=WorkloadSpec(seed=11, scale=0.3), wait=120, say=lines.append,
                            spark=spark, stack=stack, mariadb=mariadb_config(root / "mariadb", SCHEMA))
    result.lines = lines  # type: ignore[attr-defined]
    return result


def _cli_verify(config: IngestConfig, dsn: str, path: Path, *extra: str) -> Any:
    return runner.invoke(app, ["verify", "-c", str(write_config(config, path)), "--source-db", dsn, *extra])


def test_demo_flow_verifies_every_table_equal_in_avro_and_json(demo: DemoStackResult) -> None:
    assert demo.ok, "\n".join(getattr(demo, "lines", []))
    assert [r.label for r in demo.runs] == ["avro", "json", "mariadb"]
    workload = demo.workload
    assert workload is not None and workload.truncates == 1 and len(workload.ddl) == 4
    for run in demo.runs[:2]:
        checks = {c.table: c for c in run.verification.tables}
        assert set(checks) == {"customers", "products", "orders", "order_items"}
        for name, check in checks.items():
            v = check.verification
            assert v is not None and v.ok and v.expected_rows == workload.tables[name].rows > 0, (run.label, name)
            # moved customers with TOASTed notes included: nothing is left unknown
            assert check.unknown_rows == 0, (run.label, name)
            assert run.report.tables[name].total("quarantined") == 0


def test_the_mariadb_workload_verifies_equal_to_mariadb(demo: DemoStackResult) -> None:
    run, workload = demo.runs[2], demo.mariadb_workload
    assert workload is not None and demo.mariadb_capture is not None and demo.mariadb_capture.ok
    assert "TRUNCATE TABLE order_items" in workload.ddl and len(workload.ddl) == 4
    assert run.verification is not None and run.verification.ok, "\n".join(getattr(demo, "lines", []))
    for check in run.verification.tables:
        v = check.verification
        assert v is not None and v.ok and v.expected_rows == workload.rows[check.table] > 0, check.table
        assert run.report.tables[check.table].total("quarantined") == 0

    def types(table: str) -> dict[str, str]:
        return {f.name: f.type.type for f in DeltaTable(str(run.config.table_path(table))).schema().fields}

    assert types("orders")["total"] == "decimal(14,2)"  # DECIMAL(12,2) -> DECIMAL(14,2)
    assert types("orders")["id"] == "decimal(20,0)" and types("orders")["flags"] == "binary"
    assert types("customers")["phone"] == "string" and types("customers")["active"] == "boolean"


def test_schema_changes_reached_the_delta_tables(demo: DemoStackResult) -> None:
    for run in demo.runs[:2]:
        def types(table: str, config: IngestConfig = run.config) -> dict[str, str]:
            return {f.name: f.type.type for f in DeltaTable(str(config.table_path(table))).schema().fields}

        assert types("order_items")["quantity"] == "long"  # integer -> bigint
        assert types("orders")["total"] == "decimal(14,2)"  # numeric(12,2) -> numeric(14,2)
        assert types("orders")["id"] == "long"
        assert "phone" in types("customers") and types("products")["discontinued"] == "boolean"


def test_verify_source_db_is_equal_from_the_command_line(demo: DemoStackResult, pg_dsn: str, tmp_path: Path) -> None:
    result = _cli_verify(demo.runs[1].config, pg_dsn, tmp_path / "json.yaml", "--wait", "60")
    assert result.exit_code == 0, result.output
    assert result.output.count("equal") >= 4 and "DIFFERENT" not in result.output
    assert pg_dsn.split("@")[0].split(":")[-1] not in result.output  # the password is never printed


def test_verify_names_a_row_deleted_behind_the_engines_back(demo: DemoStackResult, pg_dsn: str,
                                                            tmp_path: Path) -> None:
    config = demo.runs[0].config
    with psycopg.connect(pg_dsn) as conn:
        victim = conn.execute(f"SELECT min(id) FROM {SCHEMA}.customers").fetchone()[0]  # type: ignore[index]
    DeltaTable(str(config.table_path("customers"))).delete(f"id = {victim}")
    result = _cli_verify(config, pg_dsn, tmp_path / "avro.yaml", "--wait", "60", "-t", "customers")
    assert result.exit_code == 1, result.output
    assert f"customers (id={victim}): missing" in result.output
    assert "1 missing, 0 unexpected, 0 different" in result.output


def test_verify_names_a_source_change_not_ingested(demo: DemoStackResult, pg_dsn: str, tmp_path: Path) -> None:
    config = demo.runs[1].config
    with psycopg.connect(pg_dsn) as conn:
        key = conn.execute(f"SELECT min(id) FROM {SCHEMA}.products").fetchone()[0]  # type: ignore[index]
        old = conn.execute(f"SELECT name FROM {SCHEMA}.products WHERE id = %s", (key,)).fetchone()[0]  # type: ignore[index]
        conn.execute(f"UPDATE {SCHEMA}.products SET name = 'changed behind the engine' WHERE id = %s", (key,))
    result = _cli_verify(config, pg_dsn, tmp_path / "json.yaml", "--wait", "8", "-t", "products")
    assert result.exit_code == 1, result.output
    assert "not caught up" in result.output and "products lag 1" in result.output
    assert f"products (id={key}): column 'name' expected 'changed behind the engine', got {old!r}" in result.output
