"""The first three edges as a new user meets them: `ingest produce` then `ingest run`, on Spark."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ingest.cli import app
from ingest.config import load_config
from ingest.lake.delta import has_deletion_vectors, open_table, read_all
from tests.harness import flat, key, pg

pytestmark = pytest.mark.spark


def _config(tmp_path: Path, engine: str = "delta-rs") -> Path:
    path = tmp_path / "c.yaml"
    tables = [{"name": "hard", "topic": "app.hard"}, {"name": "soft", "topic": "app.soft", "delete_mode": "soft"},
              {"name": "flat", "topic": "app.flat"}, {"name": "resnap", "topic": "app.resnap"}]
    path.write_text(yaml.safe_dump({"workdir": str(tmp_path), "source": {"value_format": "json"},
                                    "target": {"engine": engine}, "tables": tables}))
    return path


def _produce(config: Path, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
    lines = "\n".join(json.dumps({"partition": p, "key": base64.b64encode(k).decode() if k else None,
                                  "value": base64.b64encode(v).decode() if v else None}) for p, k, v in records)
    result = CliRunner().invoke(app, ["produce", topic, "-c", str(config), "--partitions", "2"], input=lines)
    assert result.exit_code == 0, result.output


def _run(config: Path) -> None:
    result = CliRunner().invoke(app, ["run", "-c", str(config)])
    assert result.exit_code == 0, result.output


def _live(config: Path, table: str) -> dict[int, str | None]:
    delta = open_table(load_config(config).table_path(table))
    if delta is None:
        return {}
    return {r["id"]: r.get("v") for r in read_all(delta).to_pylist() if not r["_cdc_deleted"]}


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_edges_through_produce_and_run(tmp_path, spark, engine):
    config = _config(tmp_path, engine)
    # 1. The truncate (LSN 5, null key, partition 1) is ingested before the insert it follows (LSN 3).
    for topic in ("app.hard", "app.soft"):
        _produce(config, topic, [(1, None, pg("t", None, lsn=5))])
    # 2. ExtractNewRecordState with tombstone-only deletes.
    _produce(config, "app.flat", [(0, key(1), flat({"id": 1, "v": "a"}, lsn=10)),
                                  (0, key(2), flat({"id": 2, "v": "b"}, lsn=11)),
                                  (0, key(1), None)])
    # 3. A streamed update, then a re-snapshot after the slot was recreated.
    _produce(config, "app.resnap", [(0, key(1), pg("u", {"id": 1, "v": "old"}, lsn=1100, committed=1000))])
    _run(config)
    for topic in ("app.hard", "app.soft"):
        _produce(config, topic, [(0, key(1), pg("c", {"id": 1, "v": "late"}, lsn=3))])
    _produce(config, "app.resnap", [(0, key(1), pg("r", {"id": 1, "v": "re-read"}, lsn=5000, committed=None,
                                                   snapshot="true"))])
    _run(config)
    assert _live(config, "hard") == {} and _live(config, "soft") == {}
    assert _live(config, "flat") == {2: "b"}
    assert _live(config, "resnap") == {1: "re-read"}
    # the engine asked for wrote the tables (delta-spark's with deletion vectors)
    written = open_table(load_config(config).table_path("flat"))
    assert has_deletion_vectors(written) == (engine == "delta-spark")
    status = CliRunner().invoke(app, ["query", "-c", str(config), "SELECT count(*) AS n FROM hard"])
    assert status.exit_code == 0, status.output
