"""A Confluent-compatible schema registry on loopback for tests: basic auth, the ``schemas/ids/<id>``
lookup (a path outside ``schemas/`` and ``subjects/`` is not found as a web server says it, without a
registry's error code), and an outage mode that answers every request with one status (nginx's 502 while the
registry behind it restarts, say). It serves what is registered in a local embedded registry once
:meth:`FakeRegistry.publish` is called, and records the paths it was asked."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from ingest.decode.registry import EmbeddedSchemaRegistry


class _Handler(BaseHTTPRequestHandler):
    registry: ClassVar[FakeRegistry]

    def do_GET(self) -> None:
        fake = self.registry
        fake.asked.append(self.path)
        if fake.answer is not None:
            return self._reply(fake.answer, {"error_code": fake.answer, "message": "the registry is not there"})
        expected = "Basic " + base64.b64encode(f"{fake.user}:{fake.password}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            return self._reply(401, {"error_code": 40101, "message": "Unauthorized"})
        parts = urlsplit(self.path).path.strip("/").split("/")
        if parts[0] not in ("schemas", "subjects"):  # no registry API here: a web server's own 404
            return self._reply(404, {"status": 404, "title": f"Could not find resource for {self.path}"})
        if parts[:2] == ["schemas", "ids"] and parts[2].isdigit() and int(parts[2]) in fake.schemas:
            return self._reply(200, {"schema": json.dumps(fake.schemas[int(parts[2])])})
        return self._reply(404, {"error_code": 40403, "message": "Schema not found"})

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class FakeRegistry:
    """A basic-auth registry for ``user``/``password`` at :attr:`url`; ``answer`` (a status) makes it
    answer every request with that status instead. :meth:`close` stops it."""

    def __init__(self, tmp_path: Path, *, user: str, password: str, answer: int | None = None) -> None:
        self.local = EmbeddedSchemaRegistry(tmp_path / "registry-source")
        self.schemas: dict[int, dict[str, Any]] = {}
        self.user, self.password, self.answer = user, password, answer
        self.asked: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"registry": self}))
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self) -> None:
        for ids in self.local.subjects().values():
            for schema_id in ids:
                self.schemas[schema_id] = self.local.get_schema(schema_id)

    def close(self) -> None:
        self.server.shutdown()
