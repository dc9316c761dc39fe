"""Where the local stack lives, which ports it uses, and its test credentials.

Everything comes from the environment (``STACK_*`` variables) with the defaults docs/stack.md lists.
Credentials that are not given in the environment are generated once and kept in
``$STACK_DIR/credentials.env`` (mode 0600), so every restart of a component, and every other process
that builds a :class:`StackSettings`, sees the same ones. The engine receives them through
environment variables only (:meth:`StackSettings.engine_env`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.stack.errors import StackError

REPO_ROOT = Path(__file__).resolve().parents[4]  # harness/src/harness/stack/settings.py

#: Environment variables read by :meth:`StackSettings.from_env`, with their defaults.
PORT_DEFAULTS: dict[str, int] = {
    "STACK_PG_PORT": 5432,
    "STACK_MARIADB_PORT": 3306,
    "STACK_KAFKA_PORT": 9092,
    "STACK_KAFKA_SASL_PORT": 9095,
    "STACK_KAFKA_SSL_PORT": 9096,
    "STACK_KAFKA_CONTROLLER_PORT": 9093,
    "STACK_CONNECT_PORT": 8083,
    "STACK_REGISTRY_PORT": 8081,
    "STACK_REGISTRY_AUTH_PORT": 8082,
    "STACK_REGISTRY_TLS_PORT": 8443,
    "STACK_REGISTRY_MGMT_PORT": 8091,
    "STACK_S3_PORT": 9310,
    "STACK_S3_CONSOLE_PORT": 9311,
}

#: Credential variables: (environment variable, default user name or None for a generated secret).
CREDENTIAL_VARS: tuple[str, ...] = (
    "STACK_PG_PASSWORD",
    "STACK_PG_REPL_PASSWORD",
    "STACK_MARIADB_PASSWORD",
    "STACK_MARIADB_REPL_PASSWORD",
    "STACK_KAFKA_SASL_PASSWORD",
    "STACK_REGISTRY_AUTH_PASSWORD",
    "STACK_S3_SECRET_KEY",
)

#: Variables the engine reads (ingest/config.py defaults): registry ``user:password`` and SASL JAAS.
#: Connectors registered by default (infra/stack/connectors/<name>.json): PostgreSQL in Avro and in
#: JSON, MariaDB in Avro.
DEFAULT_CONNECTORS: tuple[str, ...] = ("pgavro", "pgjson", "mariaavro")

ENGINE_REGISTRY_ENV = "SCHEMA_REGISTRY_USER_INFO"
ENGINE_KAFKA_JAAS_ENV = "KAFKA_SASL_JAAS_CONFIG"


@dataclass(frozen=True)
class Credentials:
    """Test credentials of the stack (never written anywhere but ``credentials.env``)."""

    pg_password: str
    pg_repl_password: str
    mariadb_password: str
    mariadb_repl_password: str
    kafka_sasl_password: str
    registry_auth_password: str
    s3_secret_key: str

    @classmethod
    def load(cls, stack_dir: Path, env: Mapping[str, str], *, create: bool) -> Credentials:
        """Credentials from ``env``, else from ``credentials.env``, else newly generated.

        Args:
            stack_dir: The stack's directory (holds ``credentials.env``).
            env: Environment to read ``STACK_*_PASSWORD`` overrides from.
            create: Write newly generated values to ``credentials.env`` (``up`` does; read-only
                callers such as ``status`` do not).

        Returns:
            The credentials; an environment value always wins over the stored one.
        """
        path = stack_dir / "credentials.env"
        stored = _read_env_file(path)
        values: dict[str, str] = {}
        generated: dict[str, str] = {}
        for var in CREDENTIAL_VARS:
            value = env.get(var) or stored.get(var)
            if not value:
                value = generated[var] = secrets.token_urlsafe(18)
            values[var] = value
        if generated and create:
            stack_dir.mkdir(parents=True, exist_ok=True)
            merged = {**stored, **generated}
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write("# Test credentials of the local stack (generated; STACK_* variables override them).\n")
                out.writelines(f"{k}={v}\n" for k, v in sorted(merged.items()))
            tmp.replace(path)
        return cls(
            pg_password=values["STACK_PG_PASSWORD"],
            pg_repl_password=values["STACK_PG_REPL_PASSWORD"],
            mariadb_password=values["STACK_MARIADB_PASSWORD"],
            mariadb_repl_password=values["STACK_MARIADB_REPL_PASSWORD"],
            kafka_sasl_password=values["STACK_KAFKA_SASL_PASSWORD"],
            registry_auth_password=values["STACK_REGISTRY_AUTH_PASSWORD"],
            s3_secret_key=values["STACK_S3_SECRET_KEY"],
        )


def _read_env_file(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _port(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return PORT_DEFAULTS[name]
    try:
        value = int(raw)
    except ValueError:
        raise StackError(f"{name}={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise StackError(f"{name}={value} is not a port number (1-65535)")
    return value


@dataclass(frozen=True)
class StackSettings:
    """Paths, ports, names and credentials of one local stack."""

    repo: Path
    stack_dir: Path
    jars_dir: Path
    pg_port: int
    pg_db: str
    pg_user: str
    pg_repl_user: str
    mariadb_port: int
    mariadb_db: str
    mariadb_user: str
    mariadb_repl_user: str
    publication: str
    kafka_port: int
    kafka_sasl_port: int
    kafka_ssl_port: int
    kafka_controller_port: int
    kafka_sasl_user: str
    connect_port: int
    registry_port: int
    registry_auth_port: int
    registry_tls_port: int
    registry_mgmt_port: int
    registry_auth_user: str
    s3_port: int
    s3_console_port: int
    s3_access_key: str
    s3_bucket: str
    connectors: tuple[str, ...]
    timeout: float | None
    credentials: Credentials = field(repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, create: bool = False) -> StackSettings:
        """Settings from ``env`` (default ``os.environ``).

        Args:
            env: Environment mapping; ``STACK_DIR`` (default ``<repo>/.stack``), ``STACK_JARS_DIR``
                (default ``$STACK_DIR/jars``), the ``STACK_*_PORT`` variables of
                :data:`PORT_DEFAULTS`, ``STACK_PG_DB``/``STACK_PG_USER``/``STACK_PG_REPL_USER`` and their
                ``STACK_MARIADB_*`` twins,
                ``STACK_KAFKA_SASL_USER``, ``STACK_REGISTRY_AUTH_USER``, ``STACK_S3_ACCESS_KEY``,
                ``STACK_S3_BUCKET``, ``STACK_CONNECTORS``
                (comma list, default :data:`DEFAULT_CONNECTORS`), ``STACK_TIMEOUT`` (seconds per component)
                and the credentials of :data:`CREDENTIAL_VARS`.
            create: Store generated credentials (see :meth:`Credentials.load`).

        Returns:
            The settings.
        """
        env = os.environ if env is None else env
        stack_dir = Path(env.get("STACK_DIR") or REPO_ROOT / ".stack").expanduser().resolve()
        jars_dir = Path(env.get("STACK_JARS_DIR") or stack_dir / "jars").expanduser().resolve()
        listed = env.get("STACK_CONNECTORS", ",".join(DEFAULT_CONNECTORS))
        connectors = tuple(c.strip() for c in listed.split(",") if c.strip())
        timeout_raw = env.get("STACK_TIMEOUT")
        return cls(
            repo=REPO_ROOT,
            stack_dir=stack_dir,
            jars_dir=jars_dir,
            pg_port=_port(env, "STACK_PG_PORT"),
            pg_db=env.get("STACK_PG_DB") or "cdc",
            pg_user=env.get("STACK_PG_USER") or "cdc",
            pg_repl_user=env.get("STACK_PG_REPL_USER") or "debezium",
            publication=env.get("STACK_PG_PUBLICATION") or "cdc_pub",
            mariadb_port=_port(env, "STACK_MARIADB_PORT"),
            mariadb_db=env.get("STACK_MARIADB_DB") or "cdc",
            mariadb_user=env.get("STACK_MARIADB_USER") or "cdc",
            mariadb_repl_user=env.get("STACK_MARIADB_REPL_USER") or "debezium",
            kafka_port=_port(env, "STACK_KAFKA_PORT"),
            kafka_sasl_port=_port(env, "STACK_KAFKA_SASL_PORT"),
            kafka_ssl_port=_port(env, "STACK_KAFKA_SSL_PORT"),
            kafka_controller_port=_port(env, "STACK_KAFKA_CONTROLLER_PORT"),
            kafka_sasl_user=env.get("STACK_KAFKA_SASL_USER") or "cdc",
            connect_port=_port(env, "STACK_CONNECT_PORT"),
            registry_port=_port(env, "STACK_REGISTRY_PORT"),
            registry_auth_port=_port(env, "STACK_REGISTRY_AUTH_PORT"),
            registry_tls_port=_port(env, "STACK_REGISTRY_TLS_PORT"),
            registry_mgmt_port=_port(env, "STACK_REGISTRY_MGMT_PORT"),
            registry_auth_user=env.get("STACK_REGISTRY_AUTH_USER") or "registry",
            s3_port=_port(env, "STACK_S3_PORT"),
            s3_console_port=_port(env, "STACK_S3_CONSOLE_PORT"),
            # not a word that appears in paths or log lines: the engine masks the access key wherever it appears
            s3_access_key=env.get("STACK_S3_ACCESS_KEY") or "stack-s3-admin",
            s3_bucket=env.get("STACK_S3_BUCKET") or "lake",
            connectors=connectors,
            timeout=float(timeout_raw) if timeout_raw else None,
            credentials=Credentials.load(stack_dir, env, create=create),
        )

    @property
    def infra_dir(self) -> Path:
        """``infra/stack``: the configuration templates."""
        return self.repo / "infra" / "stack"

    @property
    def jvm_dir(self) -> Path:
        """``infra/jvm``: the Maven poms of the JVM components."""
        return self.repo / "infra" / "jvm"

    def pg_dsn(self, dbname: str | None = None) -> str:
        """libpq URL of the workload role (superuser, owner of the database) over TCP."""
        from urllib.parse import quote

        return (f"postgresql://{quote(self.pg_user, safe='')}:{quote(self.credentials.pg_password, safe='')}"
                f"@127.0.0.1:{self.pg_port}/{quote(dbname or self.pg_db, safe='')}")

    def mariadb_url(self, dbname: str | None = None) -> str:
        """``mysql://`` URL of the MariaDB workload user (owner of the database) over TCP."""
        from urllib.parse import quote

        return (f"mysql://{quote(self.mariadb_user, safe='')}:{quote(self.credentials.mariadb_password, safe='')}"
                f"@127.0.0.1:{self.mariadb_port}/{quote(dbname or self.mariadb_db, safe='')}")

    def bootstrap_servers(self, *, sasl: bool = False, tls: bool = False) -> str:
        """``host:port`` of the PLAINTEXT listener, of the SASL_PLAINTEXT (SCRAM-SHA-512) one, or of the
        SASL_SSL one (SCRAM-SHA-512 over TLS, a client certificate required)."""
        port = self.kafka_ssl_port if tls else self.kafka_sasl_port if sasl else self.kafka_port
        return f"127.0.0.1:{port}"

    @property
    def tls_dir(self) -> Path:
        """The stack's CA and certificates (:mod:`harness.stack.tls`)."""
        return self.stack_dir / "tls"

    def kafka_sasl_config(self) -> dict[str, str]:
        """librdkafka (confluent_kafka) settings that log in on the SASL port with SCRAM-SHA-512."""
        return {
            "bootstrap.servers": self.bootstrap_servers(sasl=True),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": self.kafka_sasl_user,
            "sasl.password": self.credentials.kafka_sasl_password,
        }

    def registry_url(self, *, authenticated: bool = False, tls: bool = False) -> str:
        """Base URL of the registry: the open port, nginx's basic-auth port, or that over HTTPS."""
        if tls:
            return f"https://127.0.0.1:{self.registry_tls_port}"
        return f"http://127.0.0.1:{self.registry_auth_port if authenticated else self.registry_port}"

    def connect_url(self) -> str:
        """Base URL of the Kafka Connect REST API."""
        return f"http://127.0.0.1:{self.connect_port}"

    def s3_endpoint(self) -> str:
        """Base URL of the S3 API (MinIO)."""
        return f"http://127.0.0.1:{self.s3_port}"

    def s3_env(self) -> dict[str, str]:
        """The object-store keys delta-rs, polars and boto3 read, for a lake on the stack's MinIO."""
        return {"AWS_ACCESS_KEY_ID": self.s3_access_key, "AWS_SECRET_ACCESS_KEY": self.credentials.s3_secret_key,
                "AWS_REGION": "us-east-1"}

    def engine_env(self) -> dict[str, str]:
        """The environment the engine reads credentials from (names of ``ingest/config.py``)."""
        jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{self.kafka_sasl_user}" password="{self.credentials.kafka_sasl_password}";')
        return {
            ENGINE_REGISTRY_ENV: f"{self.registry_auth_user}:{self.credentials.registry_auth_password}",
            ENGINE_KAFKA_JAAS_ENV: jaas,
        }

    def shell_env(self) -> dict[str, str]:
        """Every ``STACK_*`` setting and the engine's variables, for ``python -m harness.stack env``."""
        c = self.credentials
        return {
            "STACK_DIR": str(self.stack_dir),
            "STACK_PG_PORT": str(self.pg_port),
            "STACK_PG_DB": self.pg_db,
            "STACK_PG_USER": self.pg_user,
            "STACK_PG_PASSWORD": c.pg_password,
            "STACK_PG_REPL_USER": self.pg_repl_user,
            "STACK_PG_REPL_PASSWORD": c.pg_repl_password,
            "STACK_PG_DSN": self.pg_dsn(),
            "STACK_MARIADB_PORT": str(self.mariadb_port),
            "STACK_MARIADB_DB": self.mariadb_db,
            "STACK_MARIADB_USER": self.mariadb_user,
            "STACK_MARIADB_PASSWORD": c.mariadb_password,
            "STACK_MARIADB_REPL_USER": self.mariadb_repl_user,
            "STACK_MARIADB_REPL_PASSWORD": c.mariadb_repl_password,
            "STACK_MARIADB_URL": self.mariadb_url(),
            "STACK_KAFKA_BOOTSTRAP": self.bootstrap_servers(),
            "STACK_KAFKA_SASL_BOOTSTRAP": self.bootstrap_servers(sasl=True),
            "STACK_KAFKA_SASL_USER": self.kafka_sasl_user,
            "STACK_KAFKA_SASL_PASSWORD": c.kafka_sasl_password,
            "STACK_CONNECT_URL": self.connect_url(),
            "STACK_REGISTRY_URL": self.registry_url(),
            "STACK_REGISTRY_AUTH_URL": self.registry_url(authenticated=True),
            "STACK_REGISTRY_AUTH_USER": self.registry_auth_user,
            "STACK_REGISTRY_AUTH_PASSWORD": c.registry_auth_password,
            "STACK_S3_ENDPOINT": self.s3_endpoint(),
            "STACK_S3_BUCKET": self.s3_bucket,
            **self.s3_env(),
            **self.engine_env(),
        }
