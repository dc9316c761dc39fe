"""An S3 API server on loopback for a lake on object storage, started without Docker.

The server is moto's (``python -m moto.server``, from PyPI): it speaks the S3 REST API over HTTP,
signs nothing off (any key pair is accepted) and, like S3 and MinIO, refuses a conditional write
whose condition fails (``If-None-Match: *`` on an existing object, a stale ``If-Match``), which is
what delta-rs's commits and the writer lease rely on. It keeps its objects in memory: a restart
empties it. docs/s3-spike.md compares it with MinIO and s3proxy.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Final

import requests

from ingest.stack import process

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
    """One S3 API server process on ``127.0.0.1:port``, its log and pid under ``directory``."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.log = directory / "s3.log"
        self.pidfile = directory / "s3.pid"
        self.pid: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def environment(self) -> dict[str, str]:
        """What a client process needs in its environment (delta-rs, boto3 and polars read these)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start the server and wait until it answers.

        Raises:
            ingest.stack.errors.StackError: it exited or did not answer in time (with its log's tail).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        if process.port_in_use(self.port):
            from ingest.stack.errors import StackError

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
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                          aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
        if name not in existing:
            s3.create_bucket(Bucket=name)

    def storage(self) -> dict[str, object]:
        """The ``target.storage`` section of a configuration whose lake is on this server."""
        return {"endpoint_url": self.endpoint, "region": REGION, "path_style": True}
