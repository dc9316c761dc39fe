"""PostgreSQL 15 (Debian's ``postgresql-15``) as the real CDC source.

The cluster lives in ``$STACK_DIR/pg/data``, initialised by us: as root, ``initdb`` and
``postgres`` run as the ``postgres`` system user the package creates (PostgreSQL refuses to run as
root). ``wal_level=logical``; TCP on 127.0.0.1 with SCRAM passwords; a private Unix socket (mode
0700) through which the controller manages roles without a password.

Roles: the workload role (``STACK_PG_USER``, default ``cdc``: superuser, owner of the database
``STACK_PG_DB``, default ``cdc``) and Debezium's replication role (``STACK_PG_REPL_USER``, default
``debezium``: LOGIN REPLICATION, member of ``pg_read_all_data`` for snapshots, nothing more).

Publication: we create ``cdc_pub`` as ``FOR ALL TABLES`` and the connectors use
``publication.autocreate.mode=disabled``. Debezium's ``filtered`` mode would need the replication
role to own every table, ``all_tables`` a superuser; and a FOR ALL TABLES publication also covers
tables created after the connector started (tests create them on the fly), which a filtered
publication only picks up at the connector's next restart. It publishes a partitioned table's changes
as the partitioned table's (``publish_via_partition_root``), so one topic holds them all.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import psycopg
from psycopg import sql

from harness.stack.component import Launch
from harness.stack.errors import StackError
from harness.stack.process import as_user
from harness.stack.server import SystemUserServer
from harness.stack.tools import ensure_postgres, render
from ingest.errors import first_line

#: Debezium's signal table (``signal.data.collection`` in infra/stack/connectors/)
SIGNAL_TABLE = "public.debezium_signal"


class Postgres(SystemUserServer):
    """PostgreSQL 15 on ``127.0.0.1:STACK_PG_PORT``."""

    name = "pg"
    system_user, package, title = "postgres", "postgresql-15", "PostgreSQL"
    stop_signal = signal.SIGINT  # fast shutdown: disconnects Debezium's walsenders at once
    start_timeout = 60.0

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        """Directory of the private Unix socket."""
        return self.dir / "run"

    def ports(self) -> dict[str, int]:
        return {"sql": self.settings.pg_port}

    def prepare(self) -> None:
        bin_dir = ensure_postgres(self.progress)
        self.check_system_user()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._chown(self.socket_dir)
        if not (self.data / "PG_VERSION").exists():
            self._initdb(bin_dir)
        s = self.settings
        (self.data / "stack.conf").write_text(render(s.infra_dir / "postgresql.conf", {
            "port": s.pg_port, "socket_dir": self.socket_dir}))
        shutil.copyfile(s.infra_dir / "pg_hba.conf", self.data / "pg_hba.conf")
        for name in ("stack.conf", "pg_hba.conf"):
            self._chown(self.data / name)
        main_conf = self.data / "postgresql.conf"
        if "include_if_exists = 'stack.conf'" not in main_conf.read_text():
            with main_conf.open("a") as out:
                out.write("\n# Added by harness.stack (infra/stack/postgresql.conf)\n"
                          "include_if_exists = 'stack.conf'\n")

    def _initdb(self, bin_dir: Path) -> None:
        if self.data.exists():
            shutil.rmtree(self.data)
        self.data.mkdir(mode=0o700)
        self._chown(self.data)
        self._chown(self.dir)
        pwfile = self.dir / ".initdb-pw"
        pwfile.write_text(self.settings.credentials.pg_password + "\n")
        pwfile.chmod(0o600)
        self._chown(pwfile)
        self.progress(f"pg: initdb {self.data} (superuser {self.settings.pg_user})")
        user = self._os_user()
        try:
            result = subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(self.data), "-U", self.settings.pg_user, f"--pwfile={pwfile}",
                 "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
                 "--no-instructions"],
                cwd=self.dir, capture_output=True, text=True, check=False,
                env={**os.environ, "HOME": str(self.dir)}, **as_user(user),
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            shutil.rmtree(self.data, ignore_errors=True)
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            hint = " (the postgres user must be able to reach it: try STACK_DIR under /tmp)" if user else ""
            raise StackError(f"pg: initdb failed in {self.data}{hint}: {last}")

    def launch(self) -> Launch:
        return Launch(cmd=[str(ensure_postgres(self.progress) / "postgres"), "-D", str(self.data)],
                      cwd=self.dir, user=self._os_user())

    def admin(self, dbname: str = "postgres") -> psycopg.Connection:
        """An autocommit superuser connection over the private Unix socket (no password)."""
        return psycopg.connect(host=str(self.socket_dir), port=self.settings.pg_port, user=self.settings.pg_user,
                               dbname=dbname, autocommit=True, connect_timeout=3)

    def healthy(self) -> bool:
        with self.admin() as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def after_start(self) -> None:
        s = self.settings
        with self.admin() as conn:
            conn.execute(sql.SQL("ALTER ROLE {} WITH SUPERUSER LOGIN PASSWORD {}").format(
                sql.Identifier(s.pg_user), sql.Literal(s.credentials.pg_password)))
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (s.pg_repl_user,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(sql.SQL(verb + " ROLE {} WITH LOGIN REPLICATION NOSUPERUSER PASSWORD {}").format(
                sql.Identifier(s.pg_repl_user), sql.Literal(s.credentials.pg_repl_password)))
            conn.execute(sql.SQL("GRANT pg_read_all_data TO {}").format(sql.Identifier(s.pg_repl_user)))
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (s.pg_db,)).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(s.pg_db), sql.Identifier(s.pg_user)))
        with self.admin(s.pg_db) as conn:
            if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (s.publication,)).fetchone():
                conn.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(s.publication)))
            # A partitioned table's changes under its own name, not each partition's (docs/getting-started.md).
            conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(
                sql.Identifier(s.publication)))
            # Debezium's signal table (ingest resnapshot): the connectors write their incremental
            # snapshots' watermarks into it, and read their signals from the WAL (the publication is
            # FOR ALL TABLES).
            conn.execute(f"CREATE TABLE IF NOT EXISTS {SIGNAL_TABLE} (id varchar(64) PRIMARY KEY, "
                         "type varchar(32) NOT NULL, data text)")
            conn.execute(sql.SQL("GRANT SELECT, INSERT, DELETE ON {} TO {}").format(
                sql.SQL(SIGNAL_TABLE), sql.Identifier(s.pg_repl_user)))
        # The roles must log in over TCP with their passwords, as the engine and Debezium do.
        logins = ((s.pg_user, s.credentials.pg_password), (s.pg_repl_user, s.credentials.pg_repl_password))
        for user, password in logins:
            try:
                psycopg.connect(host="127.0.0.1", port=s.pg_port, user=user, password=password, dbname=s.pg_db,
                                connect_timeout=5).close()
            except psycopg.Error as exc:
                raise StackError(f"pg: role {user} cannot log in over TCP: {first_line(exc)}") from exc

    def drop_slots(self) -> list[str]:
        """Drop every inactive replication slot (for a clean restart of the connectors)."""
        with self.admin() as conn:
            rows = conn.execute("SELECT slot_name FROM pg_replication_slots WHERE NOT active").fetchall()
            for (slot,) in rows:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        return [r[0] for r in rows]
