"""Validation results on demand: the full GX result of recent batches, one small JSON file each.

Data Docs are not rebuilt per batch (that would cost more than the validation); instead every
validated batch leaves ``<results_dir>/<table>/<UTC time>-<run id>-b<batch id>.json`` holding the
engine's summary and GX's own ``ExpectationSuiteValidationResult`` JSON, which GX tools and Data
Docs can render. The newest ``keep`` files per table are kept. ``ingest quality show`` reads them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^(?P<stamp>\d{8}T\d{12})-(?P<run>[^-]+)-b(?P<batch>-?\d+)\.json$")


@dataclass(frozen=True, slots=True)
class StoredResult:
    """One stored validation result file."""

    path: Path
    run_id: str
    batch_id: int
    at: datetime

    def load(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())


class ResultStore:
    """The validation results of one table.

    Args:
        directory: ``<results_dir>/<table>``.
        keep: how many results to keep (oldest pruned on write).
    """

    def __init__(self, directory: Path, keep: int = 200) -> None:
        self.directory = directory
        self.keep = keep

    def write(self, *, run_id: str, batch_id: int, document: dict[str, Any]) -> Path:
        """Write one batch's result (atomically: a reader never sees half a file) and prune."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        path = self.directory / f"{stamp}-{run_id.replace('-', '_')}-b{batch_id}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(document, default=str))
        os.replace(tmp, path)
        for old in self.list()[: -self.keep]:
            old.path.unlink(missing_ok=True)
        return path

    def list(self) -> list[StoredResult]:
        """Stored results, oldest first."""
        if not self.directory.is_dir():
            return []
        out = []
        for entry in self.directory.iterdir():
            m = _NAME.match(entry.name)
            if m:
                at = datetime.strptime(m["stamp"], "%Y%m%dT%H%M%S%f").replace(tzinfo=UTC)
                out.append(StoredResult(entry, m["run"], int(m["batch"]), at))
        return sorted(out, key=lambda r: r.path.name)

    def find(self, *, batch_id: int | None = None, run_id: str | None = None) -> StoredResult | None:
        """The newest result matching ``batch_id``/``run_id`` (any when ``None``)."""
        for result in reversed(self.list()):
            if (batch_id is None or result.batch_id == batch_id) and (run_id is None or result.run_id == run_id):
                return result
        return None
