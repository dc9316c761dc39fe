"""The change data feed and ``ingest changes`` (issue 12, point 4), on both apply engines (the
feed's difference check on delta-rs; ``tests/apply/test_writers_agree.py`` shows delta-spark's feed
is the same, commit by commit).

The reference does not come from Delta's feed: it is the difference between the table read as of
each commit and as of the one before (time travel), row by row. Every commit's changes in the feed
must be exactly that difference, and their counts what the audit says the batch did.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from typer.testing import CliRunner

from ingest.apply.journey import apply_parts
from ingest.cli import app
from ingest.commit.writers import build
from ingest.config import IngestConfig, load_config
from ingest.lake.delta import read_all, records_change_feed
from ingest.lake.layout import TablePaths
from ingest.model import ColumnSpec
from ingest.read.changes import ChangeFeedError, ChangeRange, changes
from ingest.records import audit
from tests.factories import COLUMNS, change, decoded_rows
from tests.harness import Topic, current_writer, ingest_batch, key, pg, use_engine

pytestmark = pytest.mark.usefixtures("apply_engine")


def _config(tmp_path: Path, delete_mode: str = "hard", **target: Any) -> tuple[Path, IngestConfig]:
    engine = current_writer()
    raw: dict[str, Any] = {"workdir": str(tmp_path),
                           "tables": [{"name": "t", "topic": "t", "delete_mode": delete_mode}],
                           "target": {"engine": engine.name if engine is not None else "delta-rs", **target}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, load_config(path)


def _workload(config: IngestConfig, seed: int = 3, batches: int = 5) -> None:
    """Random creates, updates and deletes of a few keys, one batch with a redelivery and a reorder,
    then a truncate and new rows after it."""
    rng, topic, paths = random.Random(seed), Topic(), TablePaths.of(config, "t")
    live: set[int] = set()
    lsn = 100
    for batch_id in range(batches):
        messages = []
        for _ in range(rng.randint(3, 7)):
            lsn += 10
            k = rng.randint(1, 6)
            op = "c" if k not in live else rng.choice(["u", "u", "d"])
            row = {"id": k, "v": f"v{lsn}", "n": rng.randint(0, 9)}
            messages.append(topic.send(key(k), pg(op, row if op != "d" else {"id": k}, lsn=lsn)))
            live.discard(k) if op == "d" else live.add(k)
        if batch_id == 2:
            messages = [*messages[1:], messages[0], messages[-1]]  # reordered, and the last one twice
        ingest_batch(config.table("t"), paths, topic, messages, batch_id=batch_id)
    lsn += 10
    truncate = [topic.send(None, pg("t", None, lsn=lsn)),
                topic.send(key(9), pg("c", {"id": 9, "v": "after", "n": 1}, lsn=lsn + 5))]
    ingest_batch(config.table("t"), paths, topic, truncate, batch_id=batches)


def _snapshot(path: Path, version: int) -> dict[Any, tuple[Any, ...]]:
    rows = read_all(DeltaTable(str(path), version=version)).to_pylist()
    return {r["id"]: tuple(sorted(r.items())) for r in rows}


def _difference(before: dict[Any, tuple[Any, ...]], after: dict[Any, tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for k in before.keys() - after.keys():
        out["delete", before[k]] += 1
    for k in after.keys() - before.keys():
        out["insert", after[k]] += 1
    for k in before.keys() & after.keys():
        if before[k] != after[k]:
            out["update_preimage", before[k]] += 1
            out["update_postimage", after[k]] += 1
    return out


@pytest.mark.one_writer
@pytest.mark.parametrize("delete_mode", ["hard", "soft"])
def test_each_commits_changes_are_the_difference_between_its_snapshots(tmp_path: Path, delete_mode: str) -> None:
    _, config = _config(tmp_path, delete_mode)
    _workload(config)
    path = config.table_path("t")
    feed = changes(config, "t", ChangeRange(from_version=0))
    assert feed.column_names[:3] == ["_commit_version", "_change_type", "_commit_timestamp"]
    by_version: dict[int, Counter[tuple[Any, ...]]] = {}
    for row in feed.to_pylist():
        version, kind = row.pop("_commit_version"), row.pop("_change_type")
        row.pop("_commit_timestamp")
        by_version.setdefault(version, Counter())[kind, tuple(sorted(row.items()))] += 1
    latest = DeltaTable(str(path)).version()
    previous: dict[Any, tuple[Any, ...]] = {}
    for version in range(latest + 1):
        current = _snapshot(path, version)
        assert by_version.get(version, Counter()) == _difference(previous, current), f"version {version}"
        previous = current
    seen = Counter(kind for kinds in by_version.values() for kind, _ in kinds)
    assert seen["insert"] and seen["update_postimage"] and seen["delete" if delete_mode == "hard" else "insert"]
    if delete_mode == "soft":  # deletes flag their rows
        assert any(dict(row)["_cdc_deleted"] for kinds in by_version.values() for kind, row in kinds
                   if kind == "update_postimage")
    # What the audit says each batch did is what the feed shows. A delete of a key the batch itself
    # created counts as deleted (it is remembered as a tombstone) but removes no stored row; in soft
    # mode a delete is an update of ``_cdc_deleted``.
    for record in audit.read(TablePaths.of(config, "t").audit).to_pylist():
        kinds = Counter(kind for (kind, _), c in by_version.get(record["delta_version"], Counter()).items()
                        for _ in range(c))
        deletes = record["deleted"] + record["rows_truncated"]
        if delete_mode == "hard":
            assert (kinds["insert"], kinds["update_postimage"]) == (record["inserted"], record["updated"])
            assert kinds["delete"] <= deletes
        else:  # a delete of a key not stored yet writes it, flagged: an insert
            assert record["inserted"] <= kinds["insert"] <= record["inserted"] + record["deleted"]
            assert record["updated"] <= kinds["update_postimage"] <= record["updated"] + deletes
            assert kinds["insert"] + kinds["update_postimage"] == record["inserted"] + record["updated"] + deletes


def test_a_widening_is_not_reported_as_changed_rows(tmp_path: Path) -> None:
    _, config = _config(tmp_path)
    spec, paths = config.table("t"), TablePaths.of(config, "t")
    wide = (COLUMNS[0], COLUMNS[1], ColumnSpec("balance", "decimal(14,2)"), COLUMNS[3])
    apply_parts(spec, paths, decoded_rows([change("c", k, 10 + k) for k in (1, 2, 3)]), batch_id=0, run_id="r",
                writer=current_writer())
    widened = [change("u", 1, 50, name="wider", balance="123456789012.34", columns=wide)]  # (12,2) -> (14,2)
    apply_parts(spec, paths, decoded_rows(widened, first_offset=3), batch_id=1, run_id="r", writer=current_writer())
    feed = changes(config, "t", ChangeRange(from_version=1))
    assert [(r["_change_type"], r["id"], r["name"], str(r["balance"])) for r in feed.to_pylist()] == [
        ("update_preimage", 1, "x", "1.00"), ("update_postimage", 1, "wider", "123456789012.34")]
    assert any("cdc.schema_change" in json.dumps(c) for c in DeltaTable(str(paths.table)).history())


def test_a_table_created_without_the_feed_records_it_from_its_next_batch(tmp_path: Path) -> None:
    _, off = _config(tmp_path, change_data_feed=False)
    spec, paths = off.table("t"), TablePaths.of(off, "t")
    use_engine(build(off.writer_of(spec), off))
    apply_parts(spec, paths, decoded_rows([change("c", k, 10 + k) for k in (1, 2, 3)]), batch_id=0, run_id="r",
                writer=current_writer())
    assert not records_change_feed(DeltaTable(str(paths.table)))
    _, on = _config(tmp_path)  # the default: change_data_feed on
    use_engine(build(on.writer_of(spec), on))
    later = [change("u", 1, 50, name="later"), change("d", 2, 60)]
    apply_parts(spec, paths, decoded_rows(later, first_offset=3), batch_id=1, run_id="r", writer=current_writer())
    table = DeltaTable(str(paths.table))
    assert records_change_feed(table)
    switched = table.version() - 1  # the property's commit, then the batch's
    feed = changes(on, "t", ChangeRange(from_version=switched))
    assert [(r["_commit_version"], r["_change_type"], r["id"], r["name"]) for r in feed.to_pylist()] == [
        (switched + 1, "update_preimage", 1, "x"), (switched + 1, "update_postimage", 1, "later"),
        (switched + 1, "delete", 2, "x")]
    assert sorted(read_all(table, columns=["id"])["id"].to_pylist()) == [1, 3]


@pytest.mark.one_writer
def test_a_table_without_the_feed_and_a_bad_range_are_clear_errors(tmp_path: Path) -> None:
    _, config = _config(tmp_path, change_data_feed=False)
    use_engine(build(config.writer_of(config.table("t")), config))  # the config's engines: feed off
    _workload(config, batches=1)
    with pytest.raises(ChangeFeedError, match="change data feed is not enabled"):
        changes(config, "t", ChangeRange(from_version=0))
    with pytest.raises(ChangeFeedError, match="no table 'nope'"):
        changes(config, "nope", ChangeRange(from_version=0))


@pytest.mark.one_writer
def test_the_cli_exports_changes_from_a_version_or_a_time(tmp_path: Path) -> None:
    path, config = _config(tmp_path)
    _workload(config, batches=2)
    runner = CliRunner()
    every = runner.invoke(app, ["changes", "t", "-c", str(path), "--from-version", "0", "--format", "json"])
    assert every.exit_code == 0, every.output
    # Reading through Spark is announced on stderr; stdout holds only the export.
    assert ("readChangeFeed" in every.stderr) == (current_writer().name == "delta-spark"), every.stderr
    rows = [json.loads(line) for line in every.stdout.splitlines()]
    feed = changes(config, "t", ChangeRange(from_version=0)).to_pylist()
    assert [(r["_commit_version"], r["_change_type"], r["id"], r["v"]) for r in rows] == [
        (r["_commit_version"], r["_change_type"], r["id"], r["v"]) for r in feed]
    latest = max(r["_commit_version"] for r in rows)
    since = next(r["_commit_timestamp"] for r in rows if r["_commit_version"] == latest)
    recent = runner.invoke(app, ["changes", "t", "-c", str(path), "--since", since, "--format", "csv"])
    assert recent.exit_code == 0, recent.output
    header, *lines = recent.stdout.splitlines()
    assert header.startswith('"_commit_version","_change_type"') and lines
    assert all(line.startswith(str(latest)) for line in lines)
    shown = runner.invoke(app, ["changes", "t", "-c", str(path), "--from-version", "0"])
    assert shown.exit_code == 0 and f"t: {len(rows)} changes" in shown.stdout
    neither = runner.invoke(app, ["changes", "t", "-c", str(path)])
    assert neither.exit_code == 2 and "--from-version" in neither.output
