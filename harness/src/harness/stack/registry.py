"""Apicurio Registry 3.3.3 (Confluent-compatible API at ``/apis/ccompat/v7``), and nginx in front of
it with HTTP basic authentication.

The registry is the built Quarkus application Maven Central serves
(``io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all``), run with ``java -jar quarkus-run.jar`` on
Java >= 21. Storage: SQL on an H2 file database in ``$STACK_DIR/registry/data``, so artifacts and
ids survive a restart.

The registry's own port stays open on loopback (Debezium's converter uses it); the authenticated
endpoint is nginx (Debian's ``nginx``) on ``STACK_REGISTRY_AUTH_PORT`` with ``auth_basic``, proxying
to the same registry. Authentication inside Apicurio (OIDC, or Quarkus' embedded users) would cover
its only API port, so an open and an authenticated port over the same ids would need two registries.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pwd
import secrets

import requests

from harness.stack import gclog, tls
from harness.stack.component import Component, Launch
from harness.stack.tools import LEAN_JVM, ensure_nginx, registry_java, render

CCOMPAT = "/apis/ccompat/v7"


class Registry(Component):
    """Apicurio Registry on ``127.0.0.1:STACK_REGISTRY_PORT`` (management: ``STACK_REGISTRY_MGMT_PORT``)."""

    name = "registry"
    start_timeout = 180.0

    def ports(self) -> dict[str, int]:
        return {"http": self.settings.registry_port, "management": self.settings.registry_mgmt_port}

    def needs_jars(self) -> bool:
        return True

    def prepare(self) -> None:
        s = self.settings
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        registry_java(self.progress)
        (self.dir / "application.properties").write_text(render(s.infra_dir / "registry.properties", {
            "port": s.registry_port, "management_port": s.registry_mgmt_port, "data_dir": self.dir / "data"}))

    def launch(self) -> Launch:
        cmd = [str(registry_java(self.progress)), "-Xms128m", "-Xmx768m", *LEAN_JVM, gclog.option(self.dir),
               f"-Djava.io.tmpdir={self.dir / 'tmp'}",
               f"-Dquarkus.config.locations={self.dir / 'application.properties'}",
               "-jar", str(self.settings.jars_dir / "registry" / "quarkus-run.jar")]
        return Launch(cmd=cmd, cwd=self.dir)

    def healthy(self) -> bool:
        response = requests.get(f"{self.settings.registry_url()}{CCOMPAT}/subjects", timeout=3)
        return response.status_code == 200


def _ssha(password: str) -> str:
    """``{SSHA}`` (salted SHA-1, RFC 2307) hash that nginx's auth_basic_user_file accepts."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()  # the format nginx reads
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


class RegistryAuth(Component):
    """nginx on ``127.0.0.1:STACK_REGISTRY_AUTH_PORT``: the registry behind HTTP basic auth; the same over
    HTTPS on ``STACK_REGISTRY_TLS_PORT``, with the stack CA's certificate."""

    name = "registry-auth"
    requires = ("registry",)
    start_timeout = 30.0

    def ports(self) -> dict[str, int]:
        return {"http": self.settings.registry_auth_port, "https": self.settings.registry_tls_port}

    def prepare(self) -> None:
        s = self.settings
        ensure_nginx(self.progress)
        for sub in ("logs", "run", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        htpasswd = self.dir / "htpasswd"
        htpasswd.write_text(f"{s.registry_auth_user}:{_ssha(s.credentials.registry_auth_password)}\n")
        user_directive = ""
        if os.geteuid() == 0:  # workers drop to nobody: they must read the hashes and use tmp/
            user_directive = "user nobody nogroup;"
            htpasswd.chmod(0o644)
            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir / "tmp", nobody.pw_uid, nobody.pw_gid)
        (self.dir / "nginx.conf").write_text(render(s.infra_dir / "nginx.conf", {
            "user_directive": user_directive, "run_dir": self.dir / "run", "log_dir": self.dir / "logs",
            "tmp_dir": self.dir / "tmp", "port": s.registry_auth_port, "htpasswd": htpasswd,
            "upstream_port": s.registry_port, "tls_port": s.registry_tls_port,
            "tls_cert": tls.ensure(s.tls_dir, s.kafka_sasl_user).server_cert, "tls_key": s.tls_dir / "server-key.pem"}))

    def launch(self) -> Launch:
        cmd = [str(ensure_nginx(self.progress)), "-p", f"{self.dir}/", "-e", str(self.dir / "logs" / "error.log"),
               "-c", str(self.dir / "nginx.conf"), "-g", "daemon off;"]
        return Launch(cmd=cmd, cwd=self.dir)

    def healthy(self) -> bool:
        s = self.settings
        url = f"{s.registry_url(authenticated=True)}{CCOMPAT}/subjects"
        anonymous = requests.get(url, timeout=3)
        authed = requests.get(url, auth=(s.registry_auth_user, s.credentials.registry_auth_password), timeout=3)
        over_tls = requests.get(f"{s.registry_url(authenticated=True, tls=True)}{CCOMPAT}/subjects", timeout=3,
                                auth=(s.registry_auth_user, s.credentials.registry_auth_password),
                                verify=str(s.tls_dir / "ca.pem"))
        return anonymous.status_code == 401 and authed.status_code == 200 and over_tls.status_code == 200
