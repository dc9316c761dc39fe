"""S3 API servers on loopback for a lake on object storage, started without Docker.

* :class:`Minio` is the stack's (``make stack``): MinIO, the server people run on their own
  machines, built once from its Go module with the machine's Go into ``$STACK_DIR/bin`` (about six
  minutes the first time, seconds with a warm build cache), its objects on disk under
  ``$STACK_DIR/s3`` so that they survive a restart.
* :class:`S3Server` is the test suite's and the benchmarks': moto's server (``python -m
  moto.server``, from PyPI), ready in about a second on a free port. It keeps its objects in memory.
  The suite uses it because building MinIO on CI's fresh machine would cost more time than the
  whole suite may take.

Both speak the S3 REST API over HTTP and, like S3, refuse a conditional write whose condition
fails (``If-None-Match: *`` on an existing object, a stale ``If-Match``): delta-rs's commits and the
writer lease rely on that. docs/s3-spike.md compares them with s3proxy, which does not.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Final

import requests

from harness.stack import process
from harness.stack.component import Component, Launch
from harness.stack.errors import StackError

#: The MinIO server built by ``make stack``: its Go module at the pseudo-version the Go proxy serves here.
MINIO_MODULE: Final = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"

#: The key pair the server is started with (moto accepts any; these are what clients present).
ACCESS_KEY: Final = "lake-test-key"
SECRET_KEY: Final = "lake-test-secret"  # a local test server's, not a credential of anything real
REGION: Final = "us-east-1"


def free_port() -> int:
    """A port nothing listens on now, from the kernel's ephemeral range (away from the stack's fixed ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """One S3 API server process on ``127.0.0.1:port``, its log and pid under ``directory``.

    :meth:`external` stands for a server that runs already (the stack's MinIO), so that the same
    tests and benchmarks can run against it.
    """

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.log = directory / "s3.log"
        self.pidfile = directory / "s3.pid"
        self.pid: int | None = None
        self._endpoint: str | None = None
        self._keys = (ACCESS_KEY, SECRET_KEY)

    @classmethod
    def external(cls, endpoint: str, access_key: str, secret_key: str) -> S3Server:
        server = cls(Path("."), port=0)
        server._endpoint, server._keys = endpoint.rstrip("/"), (access_key, secret_key)
        return server

    @property
    def endpoint(self) -> str:
        return self._endpoint or f"http://127.0.0.1:{self.port}"

    @property
    def environment(self) -> dict[str, str]:
        """What a client process needs in its environment (delta-rs, boto3 and polars read these)."""
        return {"AWS_ACCESS_KEY_ID": self._keys[0], "AWS_SECRET_ACCESS_KEY": self._keys[1], "AWS_REGION": REGION}

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start the server and wait until it answers.

        Raises:
            harness.stack.errors.StackError: it exited or did not answer in time (with its log's tail).
        """
        if self._endpoint is not None:
            return self  # runs already
        self.directory.mkdir(parents=True, exist_ok=True)
        if process.port_in_use(self.port):
            raise StackError(f"s3: port {self.port} is already in use")
        self.pid = process.spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                 log=self.log, pidfile=self.pidfile, cwd=self.directory)
        process.wait_until(lambda: requests.get(f"{self.endpoint}/moto-api/", timeout=2).ok, what="s3 server",
                           timeout=timeout, pid=self.pid, log=self.log, interval=0.2)
        return self

    def stop(self) -> None:
        if self.pid is not None:
            process.stop(self.pid, timeout=10)
            self.pid = None

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (nothing happens if it exists already)."""
        create_bucket(self.endpoint, name, access_key=self._keys[0], secret_key=self._keys[1])

    def storage(self) -> dict[str, object]:
        """The ``target.storage`` section of a configuration whose lake is on this server."""
        return {"endpoint_url": self.endpoint, "region": REGION, "path_style": True}


def create_bucket(endpoint: str, name: str, *, access_key: str | None = None, secret_key: str | None = None) -> None:
    """Create bucket ``name`` at ``endpoint`` unless it exists (default keys: the environment's)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=access_key,
                      aws_secret_access_key=secret_key)
    if name not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=name)


class Minio(Component):
    """MinIO on ``127.0.0.1:STACK_S3_PORT`` (console: ``STACK_S3_CONSOLE_PORT``), bucket ``STACK_S3_BUCKET``."""

    name = "s3"
    start_timeout = 60.0

    @property
    def binary(self) -> Path:
        return self.settings.stack_dir / "bin" / "minio"

    def ports(self) -> dict[str, int]:
        return {"s3": self.settings.s3_port, "console": self.settings.s3_console_port}

    def prepare(self) -> None:
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        if self.binary.exists():
            return
        go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
        if go is None:
            raise StackError("s3: MinIO is built from source with Go (>= 1.24), and `go` is not on PATH: install "
                             "Go (apt-get install golang-go, or the machine's /usr/local/go)")
        self.progress(f"s3: building MinIO ({MINIO_MODULE}) with {go} into {self.binary.parent}; about six "
                      "minutes the first time on 2 cores (log: " + str(self.dir / "build.log") + ")")
        env = {**os.environ, "GOBIN": str(self.binary.parent), "GOFLAGS": "-mod=mod"}
        with (self.dir / "build.log").open("ab") as out:
            done = subprocess.run([go, "install", "-ldflags=-s -w", MINIO_MODULE], env=env, cwd=self.dir,
                                  stdout=out, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0 or not self.binary.exists():
            raise StackError(f"s3: building MinIO failed (exit {done.returncode}); see {self.dir / 'build.log'}\n"
                             + process.tail(self.dir / "build.log"))

    def launch(self) -> Launch:
        s = self.settings
        env = {**os.environ, "MINIO_ROOT_USER": s.s3_access_key, "MINIO_ROOT_PASSWORD": s.credentials.s3_secret_key,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off"}
        cmd = [str(self.binary), "server", str(self.dir / "data"), "--quiet", "--address", f"127.0.0.1:{s.s3_port}",
               "--console-address", f"127.0.0.1:{s.s3_console_port}"]
        return Launch(cmd=cmd, cwd=self.dir, env=env)

    def healthy(self) -> bool:
        return requests.get(f"{self.settings.s3_endpoint()}/minio/health/live", timeout=2).status_code == 200

    def after_start(self) -> None:
        s = self.settings
        create_bucket(s.s3_endpoint(), s.s3_bucket, access_key=s.s3_access_key, secret_key=s.credentials.s3_secret_key)
