"""Kafka Connect (distributed mode, one worker) with Debezium's PostgreSQL and MySQL connectors.

The worker keeps connector configs, source offsets and statuses in Kafka topics, so a restart of
the worker resumes every connector from its last flushed offset (flushed every second). Connectors
are registered, or updated, at run time through the REST API (``PUT /connectors/<name>/config``)
from ``infra/stack/connectors/<name>.json``: ``pgavro`` (Avro through Apicurio's converter, Confluent
framing) and ``pgjson`` (Kafka's JsonConverter with schemas) for PostgreSQL, ``mariaavro`` (Avro) for
MariaDB.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import requests

from harness.stack.component import Component, Launch
from harness.stack.errors import StackError
from harness.stack.kafka import jvm_options
from harness.stack.process import tail
from harness.stack.tools import kafka_java, render


class Connect(Component):
    """Kafka Connect REST on ``127.0.0.1:STACK_CONNECT_PORT``, plugins from ``jars/connect-plugins``."""

    name = "connect"
    requires = ("pg", "mariadb", "kafka", "registry")
    start_timeout = 180.0

    def ports(self) -> dict[str, int]:
        return {"rest": self.settings.connect_port}

    def needs_jars(self) -> bool:
        return True

    @property
    def properties(self) -> Path:
        """The rendered worker configuration."""
        return self.dir / "connect-distributed.properties"

    @property
    def secrets_file(self) -> Path:
        """Properties file read by the worker's FileConfigProvider (mode 0600)."""
        return self.dir / "secrets.properties"

    @property
    def url(self) -> str:
        """REST base URL."""
        return self.settings.connect_url()

    def prepare(self) -> None:
        s = self.settings
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.secrets_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"pg.replication.password={s.credentials.pg_repl_password}\n")
            out.write(f"mariadb.replication.password={s.credentials.mariadb_repl_password}\n")
        self.properties.write_text(render(s.infra_dir / "connect-distributed.properties", {
            "kafka_port": s.kafka_port, "connect_port": s.connect_port,
            "plugin_path": s.jars_dir / "connect-plugins"}))

    def launch(self) -> Launch:
        log4j = self.settings.infra_dir / "log4j2.properties"
        cmd = [str(kafka_java(self.progress)), *jvm_options("1g", self.dir), f"-Dlog4j2.configurationFile={log4j}",
               "-cp", str(self.settings.jars_dir / "kafka" / "*"),
               "org.apache.kafka.connect.cli.ConnectDistributed", str(self.properties)]
        return Launch(cmd=cmd, cwd=self.dir)

    def healthy(self) -> bool:
        response = requests.get(self.url + "/", timeout=3)
        return response.status_code == 200 and "version" in response.json()

    # -- connectors -------------------------------------------------------------------------------

    def connector_template(self, name: str) -> dict[str, str]:
        """The configuration of connector ``name`` from ``infra/stack/connectors/<name>.json``, rendered."""
        s = self.settings
        path = s.infra_dir / "connectors" / f"{name}.json"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in path.parent.glob("*.json")))
            raise StackError(f"connect: no connector configuration {path} (known: {known})")
        text = render(path, {
            "pg_port": s.pg_port, "pg_db": s.pg_db, "pg_repl_user": s.pg_repl_user, "publication": s.publication,
            "secrets_file": self.secrets_file, "connect_dir": self.dir, "registry_url": s.registry_url(),
            "kafka_port": s.kafka_port,
            "mariadb_port": s.mariadb_port, "mariadb_db": s.mariadb_db, "mariadb_repl_user": s.mariadb_repl_user})
        config: dict[str, str] = json.loads(text)["config"]
        return config

    def register(self, name: str, config: dict[str, Any]) -> dict[str, Any]:
        """Create connector ``name`` or update its configuration (``PUT /connectors/<name>/config``).

        Returns:
            The connector info the worker answers with.
        """
        body = {k: str(v) for k, v in config.items()}
        for attempt in range(30):  # 409: the worker is rebalancing, just after start
            response = requests.put(f"{self.url}/connectors/{name}/config", json=body, timeout=60)
            if response.status_code != 409:
                break
            time.sleep(min(0.5 * (attempt + 1), 3))
        if response.status_code not in (200, 201):
            raise StackError(f"connect: registering {name} failed: HTTP {response.status_code} {response.text[:500]}")
        result: dict[str, Any] = response.json()
        return result

    def status(self, name: str) -> dict[str, Any]:
        """``GET /connectors/<name>/status`` (connector and task states)."""
        response = requests.get(f"{self.url}/connectors/{name}/status", timeout=10)
        if response.status_code == 404:
            return {"name": name, "connector": {"state": "MISSING"}, "tasks": []}
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def offsets(self, name: str) -> list[dict[str, Any]]:
        """The connector's committed source offsets (``GET /connectors/<name>/offsets``): a list of
        ``{"partition": ..., "offset": ...}``, empty before its first commit."""
        response = requests.get(f"{self.url}/connectors/{name}/offsets", timeout=10)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json().get("offsets", [])
        return result

    def pause(self, name: str) -> None:
        """Pause connector ``name`` (``PUT .../pause``): it stops reading its database; its slot or
        binlog position keeps what it has not read, for :meth:`resume`."""
        requests.put(f"{self.url}/connectors/{name}/pause", timeout=30).raise_for_status()

    def resume(self, name: str) -> None:
        """Resume a paused connector (``PUT .../resume``): it reads on from where it paused."""
        requests.put(f"{self.url}/connectors/{name}/resume", timeout=30).raise_for_status()

    def running(self, name: str) -> bool:
        """Connector ``name`` and all its tasks (at least one) are RUNNING."""
        st = self.status(name)
        tasks = st.get("tasks", [])
        return st["connector"]["state"] == "RUNNING" and bool(tasks) and all(t["state"] == "RUNNING" for t in tasks)

    def restart_failed(self, name: str) -> bool:
        """Restart the connector's failed parts (``POST .../restart?includeTasks=true&onlyFailed=true``)."""
        st = self.status(name)
        failed = st["connector"]["state"] == "FAILED" or any(t["state"] == "FAILED" for t in st.get("tasks", []))
        if failed:
            requests.post(f"{self.url}/connectors/{name}/restart",
                          params={"includeTasks": "true", "onlyFailed": "true"}, timeout=30)
        return failed

    def wait_running(self, names: list[str], timeout: float) -> None:
        """Wait until every connector in ``names`` runs; restart failed tasks once in a while.

        Raises:
            StackError: a connector is not RUNNING after ``timeout`` seconds (with its trace).
        """
        deadline = time.monotonic() + timeout
        last_restart = time.monotonic()
        pending = list(names)
        while pending:
            pending = [n for n in pending if not self._safe_running(n)]
            if not pending:
                return
            if time.monotonic() - last_restart > 10:  # e.g. PostgreSQL was restarted under the task
                for n in pending:
                    self.restart_failed(n)
                last_restart = time.monotonic()
            if time.monotonic() > deadline:
                st = self.status(pending[0])
                traces = [t.get("trace", "") for t in st.get("tasks", [])] + [st["connector"].get("trace", "")]
                trace = next((t for t in traces if t), "")
                raise StackError(f"connect: connector {pending[0]} is not RUNNING after {timeout:.0f} s "
                                 f"(state {json.dumps(st)[:400]})\n{trace[:2000] or tail(self.log)}")
            time.sleep(1)

    def _safe_running(self, name: str) -> bool:
        try:
            return self.running(name)
        except (requests.RequestException, KeyError, ValueError):
            return False

    def after_start(self) -> None:
        for name in self.settings.connectors:
            self.register(name, self.connector_template(name))
            # one left paused by a process that was killed inside connectors_paused (a benchmark's
            # other-format connector) stays paused across restarts: an up stack runs them all
            self.resume(name)
        self.wait_running(list(self.settings.connectors), self.settings.timeout or self.start_timeout)

    def ready(self) -> bool:
        return self.healthy() and all(self._safe_running(n) for n in self.settings.connectors)
