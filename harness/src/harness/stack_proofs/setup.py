"""Set-up shared by the stack torture, the latency benchmark and the security tests.

* :func:`stack_config` writes an engine configuration for the ``shop`` tables (or another schema)
  of the running stack: Avro through the registry's basic-auth port, or JSON; over Kafka's
  PLAINTEXT listener or its SASL_PLAINTEXT / SCRAM-SHA-512 one (``sasl=True``). Addresses come
  from the stack's settings, credentials stay in the environment (``SCHEMA_REGISTRY_USER_INFO``,
  ``KAFKA_SASL_JAAS_CONFIG``).
* :func:`reset_source` makes a fresh start like ``demo-stack`` does: waits until Debezium has
  captured what is in flight, deletes the schema's topics of both connectors, removes old
  workdirs and drops and recreates the schema.
* :func:`engine_environment` is the environment for an ``ingest`` subprocess: this process's,
  plus the stack's engine credentials.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, Literal

import psycopg
import yaml

from harness.mariadb import workload as maria
from harness.mariadb.capture import CONNECTOR as MARIADB_PREFIX
from harness.postgres import schema as pg_schema
from harness.stack_proofs.demo import remove_workdir
from ingest.errors import IngestError
from ingest.verify.capture import delete_topics, wait_for_capture

Say = Callable[[str], None]
Format = Literal["avro", "json"]
#: Debezium topic prefix of each connector (infra/stack/connectors).
PREFIX: Final = {"avro": "pgavro", "json": "pgjson"}
#: Configured table names of the ``shop`` schema, parents first.
SHOP_TABLES: Final = tuple(t.name for t in pg_schema.TABLES)


def stack_config(stack: Any, workdir: Path, *, value_format: Format = "avro", schema: str = "shop",
                 sasl: bool = False, tls: bool = False, tables: Iterable[str] = SHOP_TABLES,
                 max_records_per_batch: int | None = None,
                 spark_conf: dict[str, str] | None = None, path: Path | None = None,
                 table_options: dict[str, dict[str, Any]] | None = None, mariadb: bool = False) -> Path:
    """Write a configuration for ``schema``'s tables on the running stack; returns the file.

    Args:
        stack: an :class:`harness.stack.Stack` (its settings give the addresses).
        workdir: the engine's workdir (tables, checkpoints); the file goes into it unless ``path``.
        value_format: ``avro`` (connector ``pgavro``, registry through nginx basic auth) or ``json``.
        schema: the PostgreSQL schema; topics are ``<prefix>.<schema>.<table>``.
        sasl: read Kafka through the SASL_PLAINTEXT / SCRAM-SHA-512 listener.
        tls: read Kafka through the SASL_SSL listener (SCRAM-SHA-512 over TLS, the stack's client
            certificate) and the registry over HTTPS, trusting the stack's CA.
        tables: table names of the schema to ingest.
        max_records_per_batch: the source's ``max_records_per_batch`` (default: the engine's).
        spark_conf: extra Spark settings (``spark.conf``).
        path: where to write the file (default ``<workdir>/config.yaml``).
        table_options: more settings per table name (e.g. ``{"customers": {"history_mode": "scd2"}}``).
        mariadb: also the MariaDB database ``schema``'s tables (:mod:`harness.mariadb.workload`, Avro
            only), as ``mariadb_<table>``.
    """
    pg_schema.check_schema_name(schema)
    kafka: dict[str, Any] = {"bootstrap_servers": stack.bootstrap_servers(sasl=sasl, tls=tls)}
    if sasl or tls:
        kafka["options"] = {"kafka.security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                            "kafka.sasl.mechanism": "SCRAM-SHA-512"}
        kafka["credentials_env"] = "KAFKA_SASL_JAAS_CONFIG"
    if tls:
        files = stack.tls_files()
        kafka["tls"] = {"ca_file": str(files.ca), "cert_file": str(files.client)}
    source: dict[str, Any] = {"kind": "kafka", "kafka": kafka, "value_format": value_format}
    if value_format == "avro":
        source["registry"] = {"kind": "confluent",
                              "url": f"{stack.registry_url(authenticated=True, tls=tls)}/apis/ccompat/v7",
                              "credentials_env": "SCHEMA_REGISTRY_USER_INFO"}
        if tls:
            source["registry"]["tls"] = {"ca_file": str(stack.tls_files().ca)}
    if max_records_per_batch is not None:
        source["max_records_per_batch"] = max_records_per_batch
    data: dict[str, Any] = {
        "workdir": str(workdir.resolve()),
        "source": source,
        "dagster": {"analytics": True},  # the shop schema's tables are the demo's
        "tables": [{"name": t, "topic": f"{PREFIX[value_format]}.{schema}.{t}", "source_table": f"{schema}.{t}",
                    **(table_options or {}).get(t, {})} for t in tables],
    }
    if mariadb:
        if value_format != "avro":
            raise ValueError("the stack's MariaDB connector writes Avro only")
        data["tables"] += [{"name": f"mariadb_{t}", "topic": f"{MARIADB_PREFIX}.{schema}.{t}",
                            "source_table": f"{schema}.{t}", "primary_key": list(maria.KEYS[t])}
                           for t in maria.TABLES]
    if spark_conf:
        data["spark"] = {"conf": dict(spark_conf)}
    workdir.mkdir(parents=True, exist_ok=True)
    target = path or workdir / "config.yaml"
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    return target


def topics_of(schema: str, tables: Iterable[str] = SHOP_TABLES) -> list[str]:
    """The topics both connectors write for ``schema``'s tables."""
    return [f"{prefix}.{schema}.{t}" for prefix in PREFIX.values() for t in tables]


def reset_source(stack: Any, schema: str, *, workdirs: Iterable[Path] = (), wait: float = 180.0,
                 say: Say | None = None) -> list[str]:
    """Fresh source: drain Debezium, delete the schema's topics, remove workdirs, recreate the schema.

    Dropping a schema emits no change events, so without deleting the topics (Debezium recreates
    them with the next change) the previous run's rows would stay in them.

    Returns:
        The topics that were deleted.

    Raises:
        IngestError: Debezium did not capture what was in flight within ``wait`` seconds.
    """
    say = say or (lambda _line: None)
    dsn = stack.pg_dsn()
    drained = wait_for_capture(dsn, timeout=wait, say=say, on_stall=stack.unstick_capture)
    if not drained.ok:
        raise IngestError(f"Debezium has not captured the source before the reset: {drained.problem}")
    deleted = delete_topics(stack.bootstrap_servers(), topics_of(schema))
    for workdir in workdirs:
        if remove_workdir(workdir):
            say(f"  removed {workdir}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg_schema.reset(conn, schema)
    say(f"reset: schema {schema} recreated, {len(deleted)} topic(s) of the previous run deleted")
    return deleted


def reset_mariadb(stack: Any, database: str, *, say: Say | None = None) -> list[str]:
    """Fresh MariaDB source: delete ``database``'s topics, recreate it with the workload's tables
    (:func:`harness.mariadb.workload.reset`). Returns the topics that were deleted."""
    deleted = delete_topics(stack.bootstrap_servers(), [f"{MARIADB_PREFIX}.{database}.{t}" for t in maria.TABLES])
    with stack.component("mariadb").connect() as conn:
        maria.reset(conn, database)
    (say or (lambda _line: None))(f"reset: MariaDB database {database} recreated, {len(deleted)} topic(s) deleted")
    return deleted


def engine_environment(stack: Any, **extra: str) -> dict[str, str]:
    """This process's environment with the stack's engine credentials (and ``extra``) for a subprocess."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **stack.engine_env(), **extra}
    env.pop("INGEST_KILL_AT", None)
    return env
