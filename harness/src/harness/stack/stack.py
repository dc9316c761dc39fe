"""The stack as a whole: bring components up in dependency order, probe, restart, stop."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.mariadb import capture
from harness.stack.component import Component
from harness.stack.connect import Connect
from harness.stack.errors import StackError
from harness.stack.kafka import Kafka
from harness.stack.mariadb import MariaDB
from harness.stack.postgres import Postgres
from harness.stack.process import Progress, alive, port_in_use, spawn, stop, wait_until
from harness.stack.registry import Registry, RegistryAuth
from harness.stack.s3 import Minio
from harness.stack.settings import StackSettings
from harness.stack.tls import TlsFiles
from harness.stack.tools import ensure_jars
from ingest.lake.locks import exclusive

#: Start order (and, reversed, stop order).
ORDER: tuple[str, ...] = ("pg", "mariadb", "kafka", "registry", "registry-auth", "connect", "s3")
#: The change-data path alone: what the real-stack tests, demo and torture start (not the S3 server,
#: whose first start builds MinIO).
CDC_COMPONENTS: tuple[str, ...] = ("pg", "mariadb", "kafka", "registry", "registry-auth", "connect")
_CLASSES: dict[str, type[Component]] = {
    c.name: c for c in (Postgres, MariaDB, Kafka, Registry, RegistryAuth, Connect, Minio)}


def _print_progress(line: str) -> None:
    print(f"[stack] {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ComponentStatus:
    """One row of :meth:`Stack.status`."""

    name: str
    ports: dict[str, int]
    pid: int | None
    healthy: bool
    started_in: float | None


class Stack:
    """The local stack: PostgreSQL, Kafka, the schema registry (+ its basic-auth proxy), Connect.

    Usable from pytest fixtures::

        stack = Stack.from_env()
        stack.up()                      # idempotent: starts only what is not running
        dsn = stack.pg_dsn()
        stack.restart("kafka")          # fault injection
        stack.down()
    """

    def __init__(self, settings: StackSettings, progress: Progress | None = None) -> None:
        self.settings = settings
        self.progress: Progress = progress or _print_progress

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, progress: Progress | None = None) -> Stack:
        """A stack configured from ``STACK_*`` environment variables (see :class:`StackSettings`).

        Generated credentials are stored in ``$STACK_DIR/credentials.env`` at once, so every
        ``Stack`` built on the same directory agrees on them.
        """
        return cls(StackSettings.from_env(env, create=True), progress)

    # -- components -------------------------------------------------------------------------------

    def component(self, name: str) -> Component:
        """The component object called ``name``."""
        if name not in _CLASSES:
            raise StackError(f"unknown component {name!r}: choose from {', '.join(ORDER)}")
        return _CLASSES[name](self.settings, self.progress)

    def resolve(self, names: Sequence[str] | None, *, with_requirements: bool = True) -> list[str]:
        """``names`` (default: all) plus what they require, in start order."""
        wanted = set(names or ORDER)
        for name in list(wanted):
            self.component(name)  # validates the name
        if with_requirements:
            frontier = list(wanted)
            while frontier:
                for req in _CLASSES[frontier.pop()].requires:
                    if req not in wanted:
                        wanted.add(req)
                        frontier.append(req)
        return [n for n in ORDER if n in wanted]

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with exclusive(self.settings.stack_dir / ".lock"):
            yield

    # -- lifecycle --------------------------------------------------------------------------------

    def up(self, components: Sequence[str] | None = None) -> dict[str, float]:
        """Start the components (default all, plus their requirements) that are not running.

        Args:
            components: Names from :data:`ORDER`; requirements are added (``connect`` needs ``pg``,
                ``kafka`` and ``registry``; ``registry-auth`` needs ``registry``).

        Returns:
            Seconds each component took to become ready (0.0 for one already running).

        Raises:
            StackError: something is missing or a component did not become healthy in time.
        """
        with self._locked():
            return {name: self._up_one(self.component(name)) for name in self.resolve(components)}

    def prepare(self, components: Sequence[str] | None = None) -> None:
        """Everything ``up`` does before it starts a component, for the components (default all, plus
        their requirements) that are not running: the Debian packages, the JVM jars, the data
        directories and configuration files. Nothing is started; ``up`` then only starts them."""
        with self._locked():
            for name in self.resolve(components):
                comp = self.component(name)
                if comp.pid() is not None:
                    continue
                if comp.needs_jars():
                    ensure_jars(self.settings, self.progress)
                comp.prepare()

    def _timeout(self, comp: Component) -> float:
        return self.settings.timeout or comp.start_timeout

    def _up_one(self, comp: Component) -> float:
        pid = comp.pid()
        if pid is not None:
            if not _safe(comp.healthy):
                self.progress(f"{comp.name}: running (pid {pid}) but not healthy yet; waiting")
                wait_until(comp.healthy, what=comp.name, timeout=self._timeout(comp), pid=pid, log=comp.log)
            comp.after_start()
            self.progress(f"{comp.name}: already running (pid {pid}), healthy")
            return 0.0
        comp.pidfile.unlink(missing_ok=True)
        for role, port in comp.ports().items():
            if port_in_use(port):
                raise StackError(f"{comp.name}: port {port} ({role}) is already in use by a process this stack "
                                 f"did not start ({self.settings.stack_dir}): stop it or choose another port")
        if comp.needs_jars():
            ensure_jars(self.settings, self.progress)
        comp.prepare()
        launch = comp.launch()
        start = time.monotonic()
        pid = spawn(launch.cmd, log=comp.log, pidfile=comp.pidfile, cwd=launch.cwd, env=launch.env, user=launch.user)
        ports = ", ".join(f"{k} {v}" for k, v in comp.ports().items())
        self.progress(f"{comp.name}: started (pid {pid}; {ports}); waiting until healthy (log {comp.log})")
        try:
            wait_until(comp.healthy, what=comp.name, timeout=self._timeout(comp), pid=pid, log=comp.log)
        except StackError:
            # Leave nothing half-started behind: the next `up` starts it afresh.
            stop(pid, sig=comp.stop_signal, timeout=comp.stop_timeout)
            comp.pidfile.unlink(missing_ok=True)
            raise
        healthy_in = time.monotonic() - start
        comp.after_start()
        elapsed = time.monotonic() - start
        extra = f" (process healthy after {healthy_in:.1f} s)" if elapsed - healthy_in > 1 else ""
        self.progress(f"{comp.name}: ready after {elapsed:.1f} s{extra}")
        (comp.dir / "startup.json").write_text(json.dumps(
            {"pid": pid, "healthy_s": round(healthy_in, 2), "ready_s": round(elapsed, 2), "at": time.time()}))
        return elapsed

    def down(self, components: Sequence[str] | None = None) -> None:
        """Stop the components (default all), in reverse start order: SIGTERM (PostgreSQL: SIGINT,
        fast shutdown), SIGKILL to the process group after the component's stop timeout."""
        with self._locked():
            for name in reversed(self.resolve(components, with_requirements=False)):
                if name == "connect":
                    self.settle_mariadb_offset()
                self._down_one(self.component(name))

    def settle_mariadb_offset(self, timeout: float = 30.0) -> bool:
        """Have the MariaDB connector commit an offset past a row transaction, before Connect stops.

        Debezium 2.6's MySQL connector with its MariaDB adapter takes the GTID event of a DDL
        statement (standalone: no commit follows it) as a transaction's begin, and counts each later
        event, the server's heartbeats while the binlog is idle included, as one a restart must skip.
        Restarted, the task skips that many real events of the transactions after it, silently
        (docs/stack.md): after a DDL and 25 idle minutes, a whole 3,000-row insert. A row transaction
        (the capture marker) ends the count, and an offset at or past it skips at most that
        transaction's own events, which it had sent. Only :meth:`down` calls this: a :meth:`restart`
        injects a fault, and must stop Connect where it finds it.

        Returns:
            Whether the offset was settled (``True`` also when there is nothing to settle).
        """
        if "mariaavro" not in self.settings.connectors or None in (self.component("mariadb").pid(),
                                                                   self.component("connect").pid()):
            return True
        try:
            result = capture.wait_for_capture(self, timeout=timeout)
            problem = result.problem
        except Exception as exc:  # the stack stops anyway
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            self.progress(f"connect: the MariaDB connector's offset was not settled before the stop ({problem}); "
                          "a restart may skip events (docs/stack.md)")
            return False
        return True

    def _down_one(self, comp: Component) -> None:
        pid = comp.pid()
        if pid is None:
            comp.pidfile.unlink(missing_ok=True)
            return
        start = time.monotonic()
        clean = stop(pid, sig=comp.stop_signal, timeout=comp.stop_timeout)
        comp.pidfile.unlink(missing_ok=True)
        how = "stopped" if clean else "killed (SIGKILL) after not stopping"
        self.progress(f"{comp.name}: {how} in {time.monotonic() - start:.1f} s (pid {pid})")

    def restart(self, component: str, *, away: float = 0.0) -> float:
        """Stop and start one component (fault injection: broker, Connect, registry, PostgreSQL, S3 restart),
        leaving it stopped for ``away`` seconds in between.

        Afterwards, if Connect runs, waits until every connector runs again (restarting tasks that
        failed while the component was away).

        Returns:
            Seconds from the stop until the component (and the connectors) were ready again.
        """
        with self._locked():
            comp = self.component(component)
            start = time.monotonic()
            self._down_one(comp)
            time.sleep(away)
            self._up_one(comp)
            connect = self.component("connect")
            if component != "connect" and connect.pid() is not None:
                assert isinstance(connect, Connect)
                connect.wait_running(list(self.settings.connectors), self._timeout(connect))
            elapsed = time.monotonic() - start
            self.progress(f"{component}: restarted; ready again {elapsed:.1f} s after the stop")
            return elapsed

    def unstick_capture(self) -> None:
        """Restart Kafka Connect: the ``on_stall`` of :func:`ingest.verify.capture.wait_for_capture` on this stack."""
        self.restart("connect")

    def status(self) -> list[ComponentStatus]:
        """Pid and health of every component."""
        rows = []
        for name in ORDER:
            comp = self.component(name)
            pid = comp.pid()
            started = None
            info = comp.dir / "startup.json"
            if pid is not None and info.exists():
                data = json.loads(info.read_text())
                started = data.get("ready_s") if data.get("pid") == pid else None
            rows.append(ComponentStatus(name, comp.ports(), pid, pid is not None and _safe(comp.ready), started))
        return rows

    def leftovers(self) -> list[tuple[int, str]]:
        """Live processes whose command line names a component's directory (after :meth:`down`: none).

        Processes that merely use the jars (a Spark driver with ``spark.jars``) do not count.
        """
        markers = [str(self.component(name).dir) for name in ORDER]
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            if any(alive(int(proc.name), marker) for marker in markers):
                try:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue
                found.append((int(proc.name), cmd[:160]))
        return found

    # -- what clients need ------------------------------------------------------------------------

    def pg_dsn(self, dbname: str | None = None) -> str:
        """libpq URL of the workload role on the stack's database."""
        return self.settings.pg_dsn(dbname)

    def bootstrap_servers(self, *, sasl: bool = False, tls: bool = False) -> str:
        """Kafka ``host:port``: PLAINTEXT, SASL_PLAINTEXT with ``sasl=True``, SASL_SSL with ``tls=True``."""
        return self.settings.bootstrap_servers(sasl=sasl, tls=tls)

    def tls_files(self) -> TlsFiles:
        """The stack CA's certificate and those its servers and its client present."""
        return TlsFiles(self.settings.tls_dir)

    def kafka_sasl_config(self) -> dict[str, str]:
        """confluent_kafka settings for a SCRAM-SHA-512 login on the SASL port."""
        return self.settings.kafka_sasl_config()

    def registry_url(self, *, authenticated: bool = False, tls: bool = False) -> str:
        """Registry base URL (append ``/apis/ccompat/v7`` for the Confluent API); HTTPS with ``tls=True``."""
        return self.settings.registry_url(authenticated=authenticated, tls=tls)

    def registry_auth(self) -> tuple[str, str]:
        """``(user, password)`` of the registry's basic-auth endpoint."""
        return self.settings.registry_auth_user, self.settings.credentials.registry_auth_password

    def connect_url(self) -> str:
        """Kafka Connect REST base URL."""
        return self.settings.connect_url()

    def engine_env(self) -> dict[str, str]:
        """Environment variables through which the engine gets the stack's credentials."""
        return self.settings.engine_env()

    def _connect(self) -> Connect:
        comp = self.component("connect")
        assert isinstance(comp, Connect)
        return comp

    def connector_template(self, name: str) -> dict[str, str]:
        """The configuration of connector ``name`` as ``infra/stack/connectors/<name>.json`` gives it, rendered."""
        return self._connect().connector_template(name)

    def register_connector(self, name: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create or update a connector (default config: ``infra/stack/connectors/<name>.json``)."""
        connect = self._connect()
        return connect.register(name, dict(config) if config is not None else connect.connector_template(name))

    def connector_status(self, name: str) -> dict[str, Any]:
        """The connector's status document from the Connect REST API."""
        return self._connect().status(name)

    @contextmanager
    def connectors_paused(self, names: Sequence[str]) -> Iterator[None]:
        """Pause the connectors ``names`` for the block (e.g. those capturing the same tables in another
        format, while a benchmark measures one), and resume them after it, whatever happens."""
        connect = self._connect()
        paused = []
        try:
            for name in names:
                connect.pause(name)
                paused.append(name)
            yield
        finally:
            for name in paused:
                connect.resume(name)

    def wait_connectors(self, names: Sequence[str] | None = None, timeout: float = 120.0) -> None:
        """Wait until the connectors (default: the configured ones) are RUNNING."""
        self._connect().wait_running(list(names or self.settings.connectors), timeout)


def _safe(check: Any) -> bool:
    try:
        return bool(check())
    except Exception:  # a probe that raises means "not healthy"
        return False
