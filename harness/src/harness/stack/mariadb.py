"""MariaDB 10.11 (Debian's ``mariadb-server``) as the stack's second real CDC source.

The server's files live in ``$STACK_DIR/mariadb``: the data directory (initialised by
``mariadb-install-db``), a private Unix socket, and ``my.cnf`` rendered from
``infra/stack/mariadb.cnf`` (binlog in ROW format with full row images, strict GTIDs, utf8mb4) and
passed as ``--defaults-file``, so no system-wide option file applies. As root the server runs as the
``mysql`` system user the package creates.

The controller manages users over the socket as the server's all-privilege local account
(``root``, authenticated by the socket's peer; or, when the stack does not run as root, the OS user
that initialised the data directory), through the ``mariadb`` client the package ships.

Users: the workload user (``STACK_MARIADB_USER``, default ``cdc``: every privilege, owner of the
database ``STACK_MARIADB_DB``, default ``cdc``) and Debezium's (``STACK_MARIADB_REPL_USER``, default
``debezium``: what the connector documents for a snapshot and the binlog, and writes to the signal
table).
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from pathlib import Path

import pymysql

from harness.mariadb.capture import MARKER_TABLE
from harness.stack.component import Launch
from harness.stack.errors import StackError
from harness.stack.process import as_user
from harness.stack.server import SystemUserServer
from harness.stack.tools import ensure_mariadb, render

#: Debezium's signal table in the MariaDB database (``signal.data.collection`` of the connector).
SIGNAL_TABLE = "debezium_signal"


def quote_literal(value: str) -> str:
    """``value`` as a MariaDB string literal (for statements sent through the ``mariadb`` client)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class MariaDB(SystemUserServer):
    """MariaDB on ``127.0.0.1:STACK_MARIADB_PORT``."""

    name = "mariadb"
    system_user, package, title = "mysql", "mariadb-server", "MariaDB"
    start_timeout = 60.0

    @property
    def data(self) -> Path:
        """The server's data directory."""
        return self.dir / "data"

    @property
    def socket(self) -> Path:
        """The private Unix socket."""
        return self.dir / "run" / "mariadb.sock"

    @property
    def config(self) -> Path:
        """The rendered option file."""
        return self.dir / "my.cnf"

    def ports(self) -> dict[str, int]:
        return {"sql": self.settings.mariadb_port}

    def _admin_user(self) -> str:
        return "root" if os.geteuid() == 0 else getpass.getuser()

    def prepare(self) -> None:
        ensure_mariadb(self.progress)
        self.check_system_user()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.socket.parent)
        self.config.write_text(render(self.settings.infra_dir / "mariadb.cnf", {
            "data": self.data, "socket": self.socket, "pidfile": self.dir / "run" / "mariadbd.pid",
            "port": self.settings.mariadb_port}))
        if not (self.data / "mysql").is_dir():
            self._install_db()

    def _install_db(self) -> None:
        if self.data.exists():
            shutil.rmtree(self.data)
        self.data.mkdir(mode=0o700)
        self._chown(self.data)
        self.progress(f"mariadb: mariadb-install-db {self.data}")
        user = self._os_user()
        result = subprocess.run(
            ["mariadb-install-db", f"--defaults-file={self.config}", "--auth-root-authentication-method=socket",
             "--skip-test-db", f"--user={user or getpass.getuser()}"],
            cwd=self.dir, capture_output=True, text=True, check=False, **as_user(user))
        if result.returncode != 0:
            shutil.rmtree(self.data, ignore_errors=True)
            last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["(no output)"])[-1]
            raise StackError(f"mariadb: mariadb-install-db failed in {self.data}: {last}")

    def launch(self) -> Launch:
        return Launch(cmd=[str(ensure_mariadb(self.progress)), f"--defaults-file={self.config}"],
                      cwd=self.dir, user=self._os_user())

    def admin(self, statements: str, *, database: str | None = None) -> str:
        """Run SQL as the all-privilege local account over the socket; returns the client's output.

        Raises:
            StackError: the client failed (its last line).
        """
        cmd = ["mariadb", "--no-defaults", f"--socket={self.socket}", f"--user={self._admin_user()}",
               "--batch", "--skip-column-names", "--connect-timeout=3"]
        if database:
            cmd.append(f"--database={database}")
        result = subprocess.run([*cmd, "-e", statements], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise StackError(f"mariadb: {last}")
        return result.stdout

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        """An autocommit utf8mb4 connection of the workload user over TCP, as a client would make it."""
        s = self.settings
        return pymysql.connect(host="127.0.0.1", port=s.mariadb_port, user=s.mariadb_user,
                               password=s.credentials.mariadb_password, database=database, autocommit=True,
                               charset="utf8mb4", connect_timeout=5)

    def healthy(self) -> bool:
        return self.admin("SELECT 1").strip() == "1"

    def after_start(self) -> None:
        s = self.settings
        db, user, repl = (f"`{s.mariadb_db}`", quote_literal(s.mariadb_user), quote_literal(s.mariadb_repl_user))
        self.admin(
            f"CREATE DATABASE IF NOT EXISTS {db} CHARACTER SET utf8mb4;"
            f"CREATE USER IF NOT EXISTS {user}@'%';"
            f"ALTER USER {user}@'%' IDENTIFIED BY {quote_literal(s.credentials.mariadb_password)};"
            # Every database, as PostgreSQL's workload role is a superuser: the demo's workload
            # creates and drops its own (``shop``).
            f"GRANT ALL ON *.* TO {user}@'%';"
            # Debezium's MySQL connector: snapshot reads, its locks, and the binlog.
            f"CREATE USER IF NOT EXISTS {repl}@'%';"
            f"ALTER USER {repl}@'%' IDENTIFIED BY {quote_literal(s.credentials.mariadb_repl_password)};"
            "GRANT SELECT, RELOAD, SHOW DATABASES, LOCK TABLES, REPLICATION SLAVE, BINLOG MONITOR "
            f"ON *.* TO {repl}@'%';"
            # Debezium's signal table (ingest resnapshot): the connector writes its incremental
            # snapshots' watermarks into it.
            f"CREATE TABLE IF NOT EXISTS {db}.{SIGNAL_TABLE} (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, "
            "data text);"
            f"GRANT INSERT, DELETE ON {db}.{SIGNAL_TABLE} TO {repl}@'%';"
            # harness.mariadb.capture's marker: one row, rewritten to see the connector pass it.
            f"CREATE TABLE IF NOT EXISTS {db}.{MARKER_TABLE} (id INT PRIMARY KEY, at DATETIME(6));")
        # Both users must log in over TCP with their passwords, as the workload and Debezium do.
        try:
            self.connect(s.mariadb_db).close()
            pymysql.connect(host="127.0.0.1", port=s.mariadb_port, user=s.mariadb_repl_user,
                            password=s.credentials.mariadb_repl_password, connect_timeout=5).close()
        except pymysql.Error as exc:
            raise StackError(f"mariadb: a user cannot log in over TCP: {exc}") from exc
