"""Credentials on the real stack: Kafka over SASL_PLAINTEXT / SCRAM-SHA-512, the registry behind basic auth.

A configuration (:func:`harness.stack_proofs.setup.stack_config` with ``sasl=True``) reads Kafka
through the SCRAM listener (``kafka.security.protocol=SASL_PLAINTEXT``,
``kafka.sasl.mechanism=SCRAM-SHA-512``, the JAAS config from ``KAFKA_SASL_JAAS_CONFIG``) and Avro
schemas through nginx's basic-auth port (``SCHEMA_REGISTRY_USER_INFO``). Spark's scratch space is
in the workdir, so it is searched too.

1. ``ingest run`` (a subprocess) ingests the schema; every table equals PostgreSQL.
2. ``ingest status`` and ``ingest verify --source-db`` (subprocesses) report lag 0 and equal.
3. A Dagster materialization of every asset (in process, on the shared SparkSession, a persistent
   instance in a temporary directory) after more source changes.
4. The change data feed of every table, folded by key, is the table; the orders' coupon codes equal
   PostgreSQL's; ``--as-of`` reads the updated orders before and after; customers, kept in
   ``history_mode: scd2``, have well-formed versions, past ones among them, and their current rows
   equal PostgreSQL's in steps 1-3 (issue 12).
5. A wrong SCRAM password (fresh workdir: Spark's Kafka source; existing tables: the admin client,
   for a run and for a continuous run, which does not wait for a refusing cluster, and ``ingest
   status``) and a wrong registry password each fail with an error that names the authentication
   that failed, and without any secret.
6. TLS (issue 43, point 4): both Kafka readers through the broker's SASL_SSL listener, with a client
   certificate whose key is encrypted (its password from the environment), and the registry over
   HTTPS, trusting the stack's CA: every table equals PostgreSQL. A CA that did not sign the
   broker's or the registry's certificate, an expired certificate and one for another name each
   fail in one line naming the endpoint and the reason.
7. Every byte written -- Delta tables, audit, quarantine, checkpoints, logs, captured output, the
   Dagster instance's storage and materialization metadata -- is searched for the passwords, the
   TLS key's password and lines of the stack's private keys.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from deltalake import DeltaTable
from harness.postgres import schema as pg_schema
from harness.postgres.workload import WorkloadSpec, run_workload
from harness.stack.tls import Issued, issue, serve
from harness.stack_proofs.setup import reset_source, stack_config
from psycopg import sql

from ingest.config import load_config
from ingest.ops.verify_source import verify_source_db
from ingest.verify.capture import wait_for_capture

pytestmark = pytest.mark.stack

SCHEMA = "shopsec"
WRONG_SCRAM = "Wr0ng-Scram-Passw0rd-4711"
WRONG_REGISTRY = "Wr0ng-Registry-Passw0rd-0815"
TLS_KEY_PASSWORD = "Tls-K3y-Passw0rd-2718"


REVENUE_IN_PG = """
SELECT (o.ordered_at AT TIME ZONE 'UTC')::date, c.segment::text, count(*)::bigint,
       sum(coalesce(i.units, 0))::bigint, sum(o.total)
FROM {o} o JOIN {c} c ON o.customer_id = c.id
LEFT JOIN (SELECT order_id, sum(quantity) AS units FROM {i} GROUP BY order_id) i ON o.id = i.order_id
WHERE o.status <> 'cancelled'
GROUP BY 1, 2
"""


class Written:
    """Everything the runs of this module wrote or printed, to be searched for secrets at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.texts: list[tuple[str, str]] = []

    def add(self, label: str, text: str) -> str:
        self.texts.append((label, text))
        return text


def _env(stack: Any, *, jaas: str | None = None, user_info: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SCHEMA_REGISTRY_USER_INFO", "KAFKA_SASL_JAAS_CONFIG")}
    engine = stack.engine_env()
    env["KAFKA_SASL_JAAS_CONFIG"] = jaas or engine["KAFKA_SASL_JAAS_CONFIG"]
    env["SCHEMA_REGISTRY_USER_INFO"] = user_info or engine["SCHEMA_REGISTRY_USER_INFO"]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _ingest(written: Written, label: str, env: dict[str, str], *args: str,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "ingest.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    written.add(f"{label} stdout", done.stdout)
    written.add(f"{label} stderr", done.stderr)
    return done


def _config(stack: Any, written: Written, name: str) -> Path:
    """A SASL + basic-auth configuration with Spark's scratch space in its workdir; customers keep
    every version (``history_mode: scd2``), so PostgreSQL checks their current rows."""
    workdir = written.root / name
    conf = {"spark.local.dir": str(workdir / "spark-local")}
    return stack_config(stack, workdir, value_format="avro", schema=SCHEMA, sasl=True, spark_conf=conf,
                        table_options={"customers": {"history_mode": "scd2"}})


@pytest.fixture(scope="module")
def written(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Written]:
    """The schema with a small workload, captured by Debezium; one first SASL run over it."""
    out = Written(tmp_path_factory.mktemp("security"))
    reset_source(stack, SCHEMA)
    run_workload(stack.pg_dsn(), WorkloadSpec(seed=21, scale=0.05, schema=SCHEMA))
    assert wait_for_capture(stack.pg_dsn(), timeout=180, on_stall=stack.unstick_capture).ok
    yield out


def secrets_of(stack: Any) -> dict[str, str]:
    user, password = stack.registry_auth()
    return {"SCRAM password": stack.settings.credentials.kafka_sasl_password, "registry password": password,
            "registry user:password": f"{user}:{password}", "wrong SCRAM password": WRONG_SCRAM,
            "wrong registry password": WRONG_REGISTRY, "TLS key password": TLS_KEY_PASSWORD,
            **_key_material(stack)}


def _key_material(stack: Any) -> dict[str, str]:
    """Lines of the stack's private keys (the client's, the servers', the CA's), as a leak would show them."""
    out = {}
    for name in ("client", "server_key", "ca_key"):
        pem = getattr(stack.tls_files(), name).read_text()
        body = pem.split("PRIVATE KEY-----", 1)[1].strip().splitlines()
        out[f"{name} private key"] = body[1]  # one base64 line from inside the key
    return out


def test_a_sasl_and_basic_auth_run_ingests_every_table_equal(stack: Any, written: Written, pg_dsn: str) -> None:
    config_path = _config(stack, written, "good")
    # JSON logs at info: the secret scan at the end reads them too
    done = _ingest(written, "run", _env(stack), "--log-format", "json", "--log-level", "info", "run", "-c",
                   str(config_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert sum(1 for e in events if e.get("event") == "batch") >= 4
    # Port 9095 is the broker's SASL_PLAINTEXT listener only: the run logged in with SCRAM to read anything.
    assert config_path.read_text().count(stack.bootstrap_servers(sasl=True)) == 1
    result = verify_source_db(load_config(config_path), pg_dsn, wait=120, on_stall=stack.unstick_capture)
    assert result.ok, [(t.table, t.verification and t.verification.examples, t.error) for t in result.tables]
    assert all(t.verification and t.verification.expected_rows > 0 for t in result.tables)


def test_status_and_verify_over_sasl(stack: Any, written: Written, pg_dsn: str) -> None:
    config = str(written.root / "good" / "config.yaml")
    status = _ingest(written, "status", _env(stack), "status", "-c", config)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "unknown" not in status.stdout and status.stdout.count(f"pgavro.{SCHEMA}.") == 4
    verify = _ingest(written, "verify", _env(stack), "verify", "-c", config, "--source-db", pg_dsn, "--wait", "60")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "every table equals its source table" in verify.stdout


@pytest.mark.spark
def test_dagster_materializations_over_sasl(stack: Any, written: Written, pg_dsn: str, spark: Any) -> None:
    import dagster as dg

    from assets.definitions import build_definitions
    from assets.resources import SparkIngestPipeline

    orders = pg_schema.qualified(SCHEMA, "orders")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {t} SET coupon_code = 'SEC-1' WHERE id IN (SELECT id FROM {t} ORDER BY id "
                             "LIMIT 5)").format(t=orders))
    assert wait_for_capture(pg_dsn, timeout=120, on_stall=stack.unstick_capture).ok
    config_path = written.root / "good" / "config.yaml"
    engine = SparkIngestPipeline(config_path=str(config_path))
    defs = build_definitions(load_config(config_path), engine)
    home = written.root / "dagster-home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        result = dg.materialize([*defs.assets, *defs.asset_checks], instance=instance,  # type: ignore[list-item]
                                resources={"ingest_pipeline": engine})
        assert result.success
        metadata = [{k: str(v.value) for k, v in e.materialization.metadata.items()}
                    for e in result.get_asset_materialization_events()]
    meta = next(m for m in metadata if m.get("table_path", "").endswith("/orders"))
    assert int(meta["updated"]) >= 5 and meta["lag"] == "0"
    # The analytic asset over the Delta tables equals the same question asked of PostgreSQL.
    config = load_config(config_path)
    revenue = DeltaTable(str(config.tables_root / "analytics" / "daily_revenue_by_segment")).to_pyarrow_table()
    with psycopg.connect(pg_dsn) as conn:
        truth = conn.execute(sql.SQL(REVENUE_IN_PG).format(
            o=orders, c=pg_schema.qualified(SCHEMA, "customers"),
            i=pg_schema.qualified(SCHEMA, "order_items"))).fetchall()
    assert truth and sorted(tuple(r.values()) for r in revenue.to_pylist()) == sorted(truth)
    # So does the change-feed asset (its first run recomputes; tests/dagster/test_incremental.py
    # follows it through later runs).
    by_status = DeltaTable(str(config.tables_root / "analytics" / "orders_by_status")).to_pyarrow_table()
    with psycopg.connect(pg_dsn) as conn:
        counted = conn.execute(sql.SQL("SELECT status, count(*), sum(total) FROM {o} GROUP BY status").format(
            o=orders)).fetchall()
    assert counted and sorted(tuple(r.values()) for r in by_status.to_pylist()) == sorted(counted)
    written.add("dagster metadata", json.dumps(metadata))


def test_the_change_feed_and_time_travel_agree_with_postgresql(stack: Any, written: Written, pg_dsn: str) -> None:
    """Issue 12 on the real stack: the feed of every table, folded, is the table; the orders the
    Dagster test updated read as before and after through ``--as-of``; PostgreSQL is the truth."""
    from ingest.commit.state import load_state
    from ingest.lake.delta import open_table, read_all
    from ingest.read.changes import ChangeRange, changes
    from ingest.read.query import AsOf, run_sql
    from tests.harness import fold_feed, history_problems, live_by_key

    config = load_config(written.root / "good" / "config.yaml")
    folded = {}
    for spec in config.tables:
        state = load_state(config.table_path(spec.name))
        key_columns = list(state.key_columns or ())
        # A scd2 table holds several rows per key: its feed folds by version.
        versions = [*key_columns, "_cdc_position"] if state.history else key_columns
        feed = changes(config, spec.name, ChangeRange(from_version=0))
        folded[spec.name] = fold_feed(feed, versions)
        table = open_table(config.table_path(spec.name))
        assert table is not None, spec.name
        assert folded[spec.name] and folded[spec.name] == live_by_key(table, versions), spec.name
    customers = open_table(config.table_path("customers"))
    assert customers is not None and load_state(config.table_path("customers")).history
    assert not history_problems(customers, ["id"])
    past = read_all(customers, where="NOT _cdc_is_current")
    assert past.num_rows > 0 and set(past["_cdc_end_op"].to_pylist()) >= {"u", "d"}
    orders = pg_schema.qualified(SCHEMA, "orders")
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute(sql.SQL("SELECT id, coupon_code FROM {t}").format(t=orders)).fetchall()
    truth: dict[int, str | None] = dict(found)
    assert {k[0]: r["coupon_code"] for k, r in folded["orders"].items()} == truth
    marked = sorted(i for i, coupon in truth.items() if coupon == "SEC-1")
    assert len(marked) >= 5  # test_dagster_materializations_over_sasl set them
    feed = changes(config, "orders", ChangeRange(from_version=0)).to_pylist()
    versions = [c["_commit_version"] for c in feed
                if c["id"] in marked and c["_change_type"] == "update_postimage" and c["coupon_code"] == "SEC-1"]
    ids = ", ".join(str(i) for i in marked)
    before = run_sql(config, f"SELECT coupon_code FROM orders WHERE id IN ({ids})",
                     [AsOf(version=min(versions) - 1, table="orders")])
    after = run_sql(config, f"SELECT coupon_code FROM orders WHERE id IN ({ids})",
                    [AsOf(version=max(versions), table="orders")])
    assert "SEC-1" not in before["coupon_code"].to_pylist() and before.num_rows == len(marked)
    assert after["coupon_code"].to_pylist() == ["SEC-1"] * len(marked)


def test_a_wrong_scram_password_names_kafka_authentication(stack: Any, written: Written) -> None:
    wrong = stack.engine_env()["KAFKA_SASL_JAAS_CONFIG"].replace(stack.settings.credentials.kafka_sasl_password,
                                                                WRONG_SCRAM)
    # A fresh workdir: Spark's Kafka source is the first to log in.
    fresh = _config(stack, written, "wrong-scram")
    done = _ingest(written, "run wrong SCRAM", _env(stack, jaas=wrong), "run", "-c", str(fresh), timeout=300)
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "SaslAuthenticationException" in text or "Authentication failed" in text, text[-3000:]
    # Existing tables: the admin client (end offsets) is the first; `ingest status` too.
    config = str(written.root / "good" / "config.yaml")
    done = _ingest(written, "run wrong SCRAM, tables exist", _env(stack, jaas=wrong), "run", "-c", config,
                   timeout=300)
    assert done.returncode != 0
    assert "authentication" in (done.stdout + done.stderr).lower(), done.stdout[-3000:] + done.stderr[-3000:]
    status = _ingest(written, "status wrong SCRAM", _env(stack, jaas=wrong), "status", "-c", config, timeout=300)
    assert status.returncode == 3, status.stdout + status.stderr
    assert "source unavailable" in status.stderr and "authentication" in status.stderr.lower(), status.stderr
    # A continuous run waits for a cluster that does not answer, never for one that refused it.
    done = _ingest(written, "continuous run wrong SCRAM", _env(stack, jaas=wrong), "run", "--continuous", "-c",
                   config, timeout=120)
    assert done.returncode == 3 and "authentication" in done.stderr.lower(), done.stdout[-3000:] + done.stderr[-3000:]
    assert "waits for the cluster" not in done.stderr


def test_a_wrong_registry_password_names_the_registry_refusal(stack: Any, written: Written) -> None:
    user, _ = stack.registry_auth()
    fresh = _config(stack, written, "wrong-registry")
    done = _ingest(written, "run wrong registry", _env(stack, user_info=f"{user}:{WRONG_REGISTRY}"),
                   "run", "-c", str(fresh), timeout=300)
    assert done.returncode == 3  # the registry refused: unavailable, not a failed table
    text = done.stdout + done.stderr
    assert "schema registry refused" in text and "HTTP 401" in text, text[-3000:]
    tables = load_config(fresh).tables_root
    assert not (tables / "_cdc_quarantine").exists()  # a refused login is not bad data


def test_the_registrys_root_instead_of_its_api_is_one_line_not_a_quarantine(stack: Any, written: Written) -> None:
    """Apicurio's own URL without ``/apis/ccompat/v7``, behind nginx and its basic auth: every question
    is answered 404 by a server with no registry API there. A run used to take each for "no such
    schema id", send every record to quarantine and exit 0."""
    fresh = _config(stack, written, "registry-root")
    raw = yaml.safe_load(fresh.read_text())
    api = raw["source"]["registry"]["url"]
    raw["source"]["registry"]["url"] = root = api.removesuffix("/apis/ccompat/v7")
    assert root != api
    fresh.write_text(yaml.safe_dump(raw))
    done = _ingest(written, "run registry root", _env(stack), "run", "-c", str(fresh), timeout=300)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"schema registry {root} has no Confluent-compatible API: HTTP 404" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not (load_config(fresh).tables_root / "_cdc_quarantine").exists()
    check = _ingest(written, "check registry root", _env(stack), "check", "-c", str(fresh), timeout=300)
    [registry] = [line for line in check.stdout.splitlines() if line.startswith("FAIL registry:")]
    assert "no Confluent-compatible API" in registry and "/apis/ccompat/v7" in registry, check.stdout


def test_rotating_the_credentials_in_the_secrets_file(stack: Any, written: Written,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """The runbook's steps (docs/operations.md#rotating-the-kafka-or-registry-credentials): with the
    old secrets in the file, ``ingest check`` names both refusals; with the new ones it passes, and
    the next run ingests. The environment holds neither (it would win over the file)."""
    user, _ = stack.registry_auth()
    wrong_jaas = stack.engine_env()["KAFKA_SASL_JAAS_CONFIG"].replace(
        stack.settings.credentials.kafka_sasl_password, WRONG_SCRAM)
    secrets_file = tmp_path_factory.mktemp("rotation") / "secrets.yaml"  # outside what the scan reads
    path = _config(stack, written, "rotation")
    raw = yaml.safe_load(path.read_text())
    raw["secrets_file"] = str(secrets_file)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {k: v for k, v in _env(stack).items() if k not in ("KAFKA_SASL_JAAS_CONFIG", "SCHEMA_REGISTRY_USER_INFO")}

    def check(jaas: str, user_info: str) -> dict[str, dict[str, Any]]:
        secrets_file.write_text(yaml.safe_dump({"KAFKA_SASL_JAAS_CONFIG": jaas,
                                                "SCHEMA_REGISTRY_USER_INFO": user_info}))
        secrets_file.chmod(0o600)
        done = _ingest(written, "check during rotation", env, "check", "-c", str(path), "--format", "json")
        return {c["check"]: c for c in map(json.loads, done.stdout.splitlines())}

    old = check(wrong_jaas, f"{user}:{WRONG_REGISTRY}")
    assert not old["source"]["ok"] and "authentication" in old["source"]["detail"].lower(), old["source"]
    assert not old["registry"]["ok"] and "401" in old["registry"]["detail"], old["registry"]
    new = check(stack.engine_env()["KAFKA_SASL_JAAS_CONFIG"], stack.engine_env()["SCHEMA_REGISTRY_USER_INFO"])
    assert new["source"]["ok"] and new["registry"]["ok"], (new["source"], new["registry"])
    done = _ingest(written, "run after rotation", env, "run", "-c", str(path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _client_bundle(stack: Any, written: Written) -> Path:
    """The stack's client certificate with its key encrypted under :data:`TLS_KEY_PASSWORD`."""
    path = written.root / "client-encrypted.pem"
    if not path.exists():
        bundle = stack.tls_files().client
        # PBE-SHA1-3DES: what the JDK decrypts (not PBES2: tests/source/test_tls.py)
        encrypted = subprocess.run(["openssl", "pkcs8", "-topk8", "-v1", "PBE-SHA1-3DES", "-in", str(bundle),
                                    "-passout", "env:PASSPHRASE"], env={**os.environ, "PASSPHRASE": TLS_KEY_PASSWORD},
                                   capture_output=True, check=True).stdout
        cert = x509.load_pem_x509_certificate(bundle.read_bytes()).public_bytes(serialization.Encoding.PEM)
        path.write_bytes(cert + encrypted)
    return path


def _tls_config(stack: Any, written: Written, name: str, *, reader: str = "python", kafka: str | None = None,
                registry: str | None = None, kafka_ca: Path | None = None, registry_ca: Path | None = None) -> Path:
    """The configuration over TLS: SASL_SSL with a client certificate whose key is encrypted, the
    registry over HTTPS; ``kafka``/``registry`` and the CAs replace the stack's."""
    workdir = written.root / name
    path = stack_config(stack, workdir, value_format="avro", schema=SCHEMA, tls=True,
                        spark_conf={"spark.local.dir": str(workdir / "spark-local")},
                        table_options={"customers": {"history_mode": "scd2"}})
    raw = yaml.safe_load(path.read_text())
    source = raw["source"]
    source["kafka"]["reader"] = reader
    source["kafka"]["tls"]["cert_file"] = str(_client_bundle(stack, written))
    if kafka is not None:
        source["kafka"]["bootstrap_servers"] = kafka
    if kafka_ca is not None:
        source["kafka"]["tls"]["ca_file"] = str(kafka_ca)
    if registry is not None:
        source["registry"]["url"] = f"https://{registry}/apis/ccompat/v7"
    if registry_ca is not None:
        source["registry"]["tls"]["ca_file"] = str(registry_ca)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _tls_env(stack: Any) -> dict[str, str]:
    return {**_env(stack), "CDC_INGEST_TLS_KEY_PASSWORD": TLS_KEY_PASSWORD}


@pytest.mark.parametrize("reader", ["python", "spark"])
def test_a_run_over_tls_equals_postgresql(stack: Any, written: Written, pg_dsn: str, reader: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 43, point 4: the broker's SASL_SSL listener (a client certificate required) and the
    registry's HTTPS port, trusting the stack's CA, with either Kafka reader."""
    monkeypatch.setenv("CDC_INGEST_TLS_KEY_PASSWORD", TLS_KEY_PASSWORD)  # for the verification here
    path = _tls_config(stack, written, f"tls-{reader}", reader=reader)
    assert stack.bootstrap_servers(tls=True) in path.read_text()
    done = _ingest(written, f"run over TLS ({reader})", _tls_env(stack), "run", "-c", str(path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = verify_source_db(load_config(path), pg_dsn, wait=120, on_stall=stack.unstick_capture)
    assert result.ok, (result.catch_up, [(t.table, t.verification and t.verification.examples, t.error)
                                         for t in result.tables])
    status = _ingest(written, f"status over TLS ({reader})", _tls_env(stack), "status", "-c", str(path))
    assert status.returncode == 0 and status.stdout.count(f"pgavro.{SCHEMA}.") == 4, status.stdout + status.stderr


def test_a_wrong_ca_an_expired_or_a_mismatched_certificate_is_one_line(stack: Any, written: Written) -> None:
    """Each fails with one line that names the endpoint and the TLS reason: ``ingest status`` for the
    broker, the registry's line of ``ingest check``."""
    files = stack.tls_files()
    ca = Issued(files.ca.read_bytes(), files.ca_key.read_bytes())
    other = written.root / "other-ca.pem"
    other.write_bytes(issue("another CA").cert)
    expired = issue("127.0.0.1", ca=ca, hosts=("127.0.0.1",), validity=dt.timedelta(days=1),
                    not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=30))
    elsewhere = issue("broker.example", ca=ca, hosts=("broker.example",))
    broker, registry = stack.bootstrap_servers(tls=True), f"127.0.0.1:{stack.settings.registry_tls_port}"
    with serve(expired) as stale, serve(elsewhere) as misnamed:
        cases = [(broker, registry, other, "self-signed certificate in certificate chain"),
                 (stale, stale, None, "certificate has expired"),
                 (misnamed, misnamed, None, "IP address mismatch")]
        for i, (kafka_at, registry_at, trusted, reason) in enumerate(cases):
            path = _tls_config(stack, written, f"tls-bad-{i}", kafka=kafka_at, kafka_ca=trusted)
            status = _ingest(written, f"status, TLS case {i}", _tls_env(stack), "status", "-c", str(path), timeout=120)
            lines = status.stderr.strip().splitlines()
            assert status.returncode == 3 and len(lines) == 1, status.stdout + status.stderr
            assert kafka_at in lines[0] and f"certificate verify failed: {reason}" in lines[0], lines[0]

            path = _tls_config(stack, written, f"tls-bad-registry-{i}", registry=registry_at, registry_ca=trusted)
            check = _ingest(written, f"check, TLS case {i}", _tls_env(stack), "check", "-c", str(path),
                            "--format", "json", timeout=300)
            assert check.returncode == 3, check.stdout + check.stderr
            found = [c for c in map(json.loads, check.stdout.splitlines()) if c["check"] == "registry"]
            assert len(found) == 1 and not found[0]["ok"], check.stdout
            line = found[0]["detail"]
            assert "\n" not in line and registry_at in line and f"certificate verify failed: {reason}" in line, line


def test_no_secret_in_anything_written_or_printed(stack: Any, written: Written) -> None:
    """Runs last (file order): every byte the module's runs wrote, and everything they printed."""
    assert len(written.texts) >= 12
    files = [p for p in written.root.rglob("*") if p.is_file()]
    assert any("_delta_log" in p.parts for p in files) and any("checkpoints" in p.parts for p in files)
    assert any(p.suffix == ".db" or "dagster-home" in p.parts for p in files)
    for name, secret in secrets_of(stack).items():
        for label, text in written.texts:
            assert secret not in text, f"the {name} appears in {label}"
        for path in files:
            assert secret.encode() not in path.read_bytes(), f"the {name} appears in {path}"
