"""``ingest check`` against the real stack: SASL/SCRAM to Kafka, the registry behind basic auth.

A configuration that reaches everything passes every check (exit 0); then one piece is broken at a
time -- a wrong SCRAM password, a stopped registry -- and the check of that piece fails with its cause
while the others still pass (exit 3). No secret appears in what is printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.postgres.workload import WorkloadSpec, run_workload
from harness.stack_proofs.setup import reset_source, stack_config

from ingest.verify.capture import wait_for_capture

pytestmark = pytest.mark.stack

SCHEMA = "shopcheck"
WRONG = "Wr0ng-Check-Passw0rd-77"


@pytest.fixture(scope="module")
def config(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    reset_source(stack, SCHEMA)
    run_workload(stack.pg_dsn(), WorkloadSpec(seed=5, scale=0.02, schema=SCHEMA))
    assert wait_for_capture(stack.pg_dsn(), timeout=180, on_stall=stack.unstick_capture).ok
    return stack_config(stack, tmp_path_factory.mktemp("check") / "work", value_format="avro", schema=SCHEMA,
                        sasl=True)


def _check(config: Path, env: dict[str, str]) -> tuple[int, dict[str, list[str]]]:
    done = subprocess.run([sys.executable, "-m", "ingest.cli", "check", "-c", str(config)], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    lines: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        lines.setdefault(rest.strip().split(":")[0], []).append(verdict + " " + rest.strip())
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.returncode, lines


def _env(stack: Any, **override: str) -> dict[str, str]:
    env = {**os.environ, **stack.engine_env(), **override}
    return env


def test_a_deployment_that_reaches_everything_passes_every_check(stack: Any, config: Path) -> None:
    code, lines = _check(config, _env(stack))
    assert code == 0, lines
    assert set(lines) >= {"java", "jvm artifacts", "source", "topics", "registry", "lake", "checkpoints", "tables"}
    assert all(line.startswith("ok") for found in lines.values() for line in found), lines
    assert "SASL_PLAINTEXT" in lines["source"][0]


def test_a_misspelled_key_column_fails_the_columns_check(stack: Any, config: Path, tmp_path: Path) -> None:
    """The registry's newest schema of each topic says which columns a table may name."""
    settings = yaml.safe_load(config.read_text())
    orders = next(t for t in settings["tables"] if t["name"] == "orders")
    customers = next(t for t in settings["tables"] if t["name"] == "customers")
    orders["primary_key"] = ["idd"]
    customers["primary_key"] = "id"
    misspelled = tmp_path / "misspelled.yaml"
    misspelled.write_text(yaml.safe_dump({**settings, "workdir": str(config.parent)}))
    code, lines = _check(misspelled, _env(stack))
    assert code == 3
    assert lines["columns"] == [
        f"ok columns: customers: primary_key (id) found in the newest schema under {customers['topic']}-value",
        f"FAIL columns: orders: primary_key names idd, not in the newest schema under {orders['topic']}-value "
        "(its columns: id, customer_id, status, ordered_at, total, shipping_address, coupon_code, tags) -> name "
        "the source's columns, as the schema spells them, in tables[].primary_key, columns and track_history"
    ], lines["columns"]
    assert all(line.startswith("ok") for name, found in lines.items() if name != "columns" for line in found)


def test_a_json_topics_newest_change_says_its_columns(stack: Any, config: Path, tmp_path: Path) -> None:
    """JSON messages carry their own schema: the check reads the newest change of the topic from Kafka, for
    the columns a table names and, before its first run, the columns its suite reads."""
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "orders.json").write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "totl"}}]}))
    path = stack_config(stack, tmp_path / "work", value_format="json", schema=SCHEMA, sasl=True,
                        table_options={"orders": {"primary_key": ["id", "idd"], "expectations": "orders"}})
    settings = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**settings, "quality": {"expectations_dir": str(suites)}}))
    code, lines = _check(path, _env(stack))
    assert code == 3
    topic = next(t["topic"] for t in settings["tables"] if t["name"] == "orders")
    assert lines["columns"] == [
        f"FAIL columns: orders: primary_key names idd, not in the newest change in topic {topic} (its columns: id, "
        "customer_id, status, ordered_at, total, shipping_address, coupon_code, tags) -> name the source's "
        "columns, as the schema spells them, in tables[].primary_key, columns and track_history"], lines["columns"]
    assert lines["quality"] == [
        f"FAIL quality: orders: table 'orders': suite 'orders' ({suites / 'orders.json'}) names columns the newest "
        f"change in topic {topic} does not have: expect_column_values_to_not_be_null(totl) reads ['totl'] (columns: "
        "['coupon_code', 'customer_id', 'id', 'ordered_at', 'shipping_address', 'status', 'tags', 'total']) -> "
        "correct the suite (quality.expectations_dir/<suite>.json) or the table's expectations"], lines["quality"]


def test_a_wrong_kafka_password_fails_the_source_check_with_its_cause(stack: Any, config: Path) -> None:
    jaas = stack.engine_env()["KAFKA_SASL_JAAS_CONFIG"]
    right = stack.settings.credentials.kafka_sasl_password
    code, lines = _check(config, _env(stack, KAFKA_SASL_JAAS_CONFIG=jaas.replace(right, WRONG)))
    assert code == 3
    assert lines["source"][0].startswith("FAIL") and "authentication" in lines["source"][0].lower(), lines
    assert lines["registry"][0].startswith("ok") and lines["lake"][0].startswith("ok")
    assert WRONG not in str(lines) and right not in str(lines)


def test_a_stopped_registry_fails_the_registry_check(stack: Any, config: Path) -> None:
    stack.down(["registry-auth", "registry"])
    try:
        code, lines = _check(config, _env(stack))
    finally:
        stack.up(["registry", "registry-auth"])
        stack.restart("connect")  # its Avro converter met the stopped registry: the other tests get a fresh one
    assert code == 3
    assert lines["registry"][0].startswith("FAIL") and "registry" in lines["registry"][0], lines
    assert lines["source"][0].startswith("ok")
