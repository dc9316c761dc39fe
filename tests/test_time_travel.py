"""Time travel and history for analysts: ``ingest query --as-of`` and ``ingest history`` (issue 12, point 5).

The reference is what ``ingest query`` showed right after each batch: reading as of that batch's
version, or of its commit time, must show exactly that again, on both apply engines.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ingest.cli import app
from ingest.config import IngestConfig, load_config
from ingest.lake.delta import open_table
from ingest.lake.layout import TablePaths
from ingest.read.query import AsOf, TimeTravelError, history, run_sql
from ingest.records import audit
from tests.harness import Topic, current_writer, ingest_batch, key, pg

pytestmark = pytest.mark.usefixtures("apply_engine")

LIVE = "SELECT id, v FROM t ORDER BY id"


def _config(tmp_path: Path, tables: tuple[str, ...] = ("t",)) -> tuple[Path, IngestConfig]:
    engine = current_writer()
    raw: dict[str, Any] = {"workdir": str(tmp_path), "tables": [{"name": n, "topic": n} for n in tables],
                           "target": {"engine": engine.name if engine is not None else "delta-rs"}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def _three_batches(config: IngestConfig) -> list[tuple[int, list[tuple[Any, ...]]]]:
    """Three batches into ``t``; after each: (table version, live rows as ``ingest query`` shows them)."""
    paths, topic = TablePaths.of(config, "t"), Topic()
    batches = [
        [topic.send(key(1), pg("c", {"id": 1, "v": "a"}, lsn=10)),
         topic.send(key(2), pg("c", {"id": 2, "v": "b"}, lsn=11))],
        [topic.send(key(1), pg("u", {"id": 1, "v": "a2"}, lsn=20)),
         topic.send(key(2), pg("d", {"id": 2}, lsn=21))],
        [topic.send(key(3), pg("c", {"id": 3, "v": "c"}, lsn=30))],
    ]
    seen = []
    for batch_id, messages in enumerate(batches):
        ingest_batch(config.table("t"), paths, topic, messages, batch_id=batch_id)
        table = open_table(paths.table)
        assert table is not None
        seen.append((table.version(), [tuple(r.values()) for r in run_sql(config, LIVE).to_pylist()]))
    return seen


def _rows(config: IngestConfig, sql: str, *points: str) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in run_sql(config, sql, [AsOf.parse(p) for p in points]).to_pylist()]


def test_as_of_a_version_or_a_time_shows_the_table_as_it_was(tmp_path: Path) -> None:
    _, config = _config(tmp_path)
    seen = _three_batches(config)
    assert [rows for _, rows in seen] == [[(1, "a"), (2, "b")], [(1, "a2")], [(1, "a2"), (3, "c")]]
    times = {c.version: c.time for c in history(config, "t")}
    for version, rows in seen:
        assert _rows(config, LIVE, str(version)) == rows
        assert _rows(config, LIVE, f"t@{version}") == rows
        assert _rows(config, LIVE, times[version].isoformat()) == rows
    # Between two commits, a time reads the earlier one.
    (v1, first), (v2, _) = seen[0], seen[1]
    if times[v2] - times[v1] > timedelta(milliseconds=2):
        assert _rows(config, LIVE, (times[v1] + timedelta(milliseconds=1)).isoformat()) == first


@pytest.mark.one_writer
def test_history_of_a_table_says_whether_it_is_configured_or_not_yet_created(tmp_path: Path) -> None:
    """Both said "no table 'x' under <root>", for a misspelled name and for a table before its first run."""
    _, config = _config(tmp_path, tables=("t", "u"))
    _three_batches(config)
    assert history(config, "t")
    with pytest.raises(TimeTravelError, match=r"^table u: no run has created it yet \(under "):
        history(config, "u")
    with pytest.raises(TimeTravelError, match=r"^no table 'nope' in the configuration \(its tables: t, u, _cdc_"):
        history(config, "nope")


@pytest.mark.one_writer
def test_an_as_of_outside_the_history_is_a_clear_error(tmp_path: Path) -> None:
    _, config = _config(tmp_path)
    seen = _three_batches(config)
    latest = seen[-1][0]
    with pytest.raises(TimeTravelError, match=rf"t: no version {latest + 1} \(versions 0\.\.{latest}\)"):
        _rows(config, LIVE, str(latest + 1))
    before = min(c.time for c in history(config, "t")) - timedelta(hours=1)
    with pytest.raises(TimeTravelError, match="t: the table did not exist yet at"):
        _rows(config, LIVE, f"t@{before.isoformat()}")
    first = min(c.time for c in history(config, "t"))
    with pytest.raises(TimeTravelError, match=rf"^t: the table did not exist yet at .*\(first commit "
                                              rf"{re.escape(first.isoformat())}\)$"):
        _rows(config, LIVE, before.isoformat())  # a time for every table: said "no commit yet at the point asked for"
    with pytest.raises(TimeTravelError, match="no table 'nope'"):
        _rows(config, LIVE, "nope@1")
    with pytest.raises(TimeTravelError, match="expected a version"):
        AsOf.parse("yesterday")


@pytest.mark.one_writer
def test_a_bare_version_must_name_its_table_when_a_query_reads_two(tmp_path: Path) -> None:
    _, config = _config(tmp_path, ("t", "u"))
    _three_batches(config)
    paths, topic = TablePaths.of(config, "u"), Topic("u")
    ingest_batch(config.table("u"), paths, topic, [topic.send(key(9), pg("c", {"id": 9, "v": "z"}, lsn=5))])
    both = "SELECT t.id, u.id AS uid FROM t CROSS JOIN u ORDER BY 1"
    with pytest.raises(TimeTravelError, match=r"a version belongs to one table.*reads t, u.*--as-of t@0"):
        _rows(config, both, "0")
    # One table pinned by name, the other by the bare version: each gets its own.
    first = history(config, "t")[-1].version
    assert _rows(config, both, f"t@{first}", "0") == [(1, 9), (2, 9)]


def test_history_lists_each_batch_with_its_offsets_counts_and_quality(tmp_path: Path) -> None:
    _, config = _config(tmp_path)
    seen = _three_batches(config)
    commits = history(config, "t")
    assert [c.version for c in commits] == sorted((c.version for c in commits), reverse=True)
    batches = [c for c in commits if c.kind == "cdc"]
    assert [c.version for c in reversed(batches)] == [v for v, _ in seen]
    records = {r["batch_id"]: r for r in audit.read(TablePaths.of(config, "t").audit).to_pylist()}
    for commit in batches:
        record = records[commit.batch_id]
        assert (commit.received, commit.inserted, commit.updated, commit.deleted, commit.quarantined,
                commit.quality_status, commit.engine) == (
            record["received"], record["inserted"], record["updated"], record["deleted"],
            record["quarantined"], record["quality_status"], record["engine"])
        assert commit.version == record["delta_version"]
    assert batches[0].offsets == {"t:0": 4} and batches[-1].offsets == {"t:0": 1}
    assert (batches[-1].inserted, batches[1].updated, batches[1].deleted) == (2, 1, 1)


@pytest.mark.one_writer
def test_the_cli_prints_history_and_reads_as_of(tmp_path: Path) -> None:
    path, config = _config(tmp_path)
    seen = _three_batches(config)
    runner = CliRunner()
    listed = runner.invoke(app, ["history", "t", "-c", str(path), "--format", "json"])
    assert listed.exit_code == 0, listed.output
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [c["batch_id"] for c in lines if c["kind"] == "cdc"] == [2, 1, 0]
    shown = runner.invoke(app, ["history", "t", "-c", str(path)])
    assert shown.exit_code == 0 and "commits, newest first" in shown.stdout
    version = seen[0][0]
    old = runner.invoke(app, ["query", LIVE, "-c", str(path), "--as-of", f"t@{version}", "--format", "json"])
    assert old.exit_code == 0, old.output
    assert [(r["id"], r["v"]) for r in map(json.loads, old.stdout.splitlines())] == seen[0][1]
    bad = runner.invoke(app, ["query", LIVE, "-c", str(path), "--as-of", "99"])
    assert bad.exit_code == 2 and "no version 99" in bad.output
