"""Apache Kafka 4.3 in KRaft mode (one combined broker + controller) from Maven Central's jars.

Storage is formatted once with ``kafka.tools.StorageTool format`` (the class in kafka_2.13 4.3.1),
which also creates the SCRAM-SHA-512 user of the SASL_PLAINTEXT listener; on every ``up`` that
user's password is checked by logging in and, if it fails, upserted through the Admin API (so a
changed ``STACK_KAFKA_SASL_PASSWORD`` applies without reformatting).
"""

from __future__ import annotations

import base64
import logging
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from harness.stack import gclog, tls
from harness.stack.component import Component, Launch
from harness.stack.errors import StackError
from harness.stack.process import port_in_use
from harness.stack.tools import LEAN_JVM, kafka_java, render

_quiet = logging.getLogger("harness.stack.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False
_SCRAM_SAFE = re.compile(r"^[A-Za-z0-9_\-.~]+$")


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64, unpadded, never starting with ``-``.

    One id in 64 would start with ``-``, and the storage tool's argument parser would take it for an
    option ("--cluster-id: expected one argument"); Kafka's own ``random-uuid`` skips those too.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def admin_client(config: dict[str, Any]) -> Any:
    """A confluent_kafka AdminClient whose librdkafka log lines are discarded (probes fail on purpose)."""
    from confluent_kafka.admin import AdminClient

    full: dict[str, Any] = {**config, "logger": _quiet, "socket.connection.setup.timeout.ms": 3000}
    return AdminClient(full)


def jvm_options(heap: str, directory: Path) -> list[str]:
    """JVM flags for Kafka and Connect: a bounded heap, :data:`LEAN_JVM`, and their pauses logged in
    ``directory`` (:mod:`harness.stack.gclog`)."""
    return [f"-Xms{heap}", f"-Xmx{heap}", *LEAN_JVM, gclog.option(directory), "-Djava.awt.headless=true"]


class Kafka(Component):
    """Kafka broker + KRaft controller: PLAINTEXT, SASL_PLAINTEXT and SASL_SSL (SCRAM-SHA-512) and controller
    ports."""

    name = "kafka"
    start_timeout = 120.0
    stop_timeout = 60.0

    def ports(self) -> dict[str, int]:
        s = self.settings
        return {"plaintext": s.kafka_port, "sasl": s.kafka_sasl_port, "ssl": s.kafka_ssl_port,
                "controller": s.kafka_controller_port}

    def needs_jars(self) -> bool:
        return True

    @property
    def properties(self) -> Path:
        """The rendered broker configuration."""
        return self.dir / "server.properties"

    @property
    def data(self) -> Path:
        """``log.dirs``: partitions and KRaft metadata."""
        return self.dir / "data"

    def _classpath(self) -> str:
        return str(self.settings.jars_dir / "kafka" / "*")

    def _java(self, *jvm_flags: str) -> list[str]:
        log4j = self.settings.infra_dir / "log4j2.properties"
        return [str(kafka_java(self.progress)), *jvm_flags, f"-Dlog4j2.configurationFile={log4j}",
                "-cp", self._classpath()]

    def prepare(self) -> None:
        s = self.settings
        self.dir.mkdir(parents=True, exist_ok=True)
        tls.ensure(s.tls_dir, s.kafka_sasl_user)
        self.properties.write_text(render(s.infra_dir / "server.properties", {
            "plaintext_port": s.kafka_port, "sasl_port": s.kafka_sasl_port, "ssl_port": s.kafka_ssl_port,
            "controller_port": s.kafka_controller_port, "data_dir": self.data, "tls_dir": s.tls_dir}))
        if (self.data / "meta.properties").exists():
            return
        cluster_file = self.dir / "cluster.id"
        cluster_id = cluster_file.read_text().strip() if cluster_file.exists() else ""
        if not cluster_id or cluster_id.startswith("-"):  # a file from before new_cluster_id() is replaced
            cluster_id = new_cluster_id()
            cluster_file.write_text(cluster_id + "\n")
        cmd = [*self._java(), "kafka.tools.StorageTool", "format", "--cluster-id", cluster_id,
               "--config", str(self.properties), "--ignore-formatted"]
        password = s.credentials.kafka_sasl_password
        if _SCRAM_SAFE.match(password) and _SCRAM_SAFE.match(s.kafka_sasl_user):
            cmd += ["--add-scram", f"SCRAM-SHA-512=[name={s.kafka_sasl_user},password={password}]"]
        self.progress(f"kafka: formatting {self.data} (cluster id {cluster_id})")
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = ((result.stderr or result.stdout).strip().splitlines() or ["(no output)"])[-1]
            raise StackError(f"kafka: kafka.tools.StorageTool format failed: {last.replace(password, '***')}")

    def launch(self) -> Launch:
        cmd = [*self._java(*jvm_options("1g", self.dir)), "kafka.Kafka", str(self.properties)]
        return Launch(cmd=cmd, cwd=self.dir)

    def healthy(self) -> bool:
        if not port_in_use(self.settings.kafka_port):
            return False
        metadata = admin_client({"bootstrap.servers": self.settings.bootstrap_servers()}).list_topics(timeout=3)
        return bool(metadata.brokers)

    def sasl_login_works(self, password: str | None = None, timeout: float = 5.0) -> bool:
        """Whether a SCRAM-SHA-512 login on the SASL port succeeds (with ``password``, default the stack's)."""
        config = self.settings.kafka_sasl_config()
        if password is not None:
            config["sasl.password"] = password
        try:
            return bool(admin_client(config).list_topics(timeout=timeout).brokers)
        except Exception:  # KafkaException: authentication failed or timed out
            return False

    def after_start(self) -> None:
        if self.sasl_login_works():
            return
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        s = self.settings
        upsert = UserScramCredentialUpsertion(
            s.kafka_sasl_user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
            s.credentials.kafka_sasl_password.encode())
        futures = admin_client({"bootstrap.servers": s.bootstrap_servers()}).alter_user_scram_credentials([upsert])
        for future in futures.values():
            future.result(timeout=30)
        for _ in range(20):  # the credential reaches the listener through the metadata log
            if self.sasl_login_works(timeout=3):
                return
        raise StackError(f"kafka: SCRAM-SHA-512 login as {s.kafka_sasl_user} on port {s.kafka_sasl_port} "
                         "still fails after upserting the credential")
