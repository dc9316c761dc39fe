"""Upgrading in place, as the runbook says (docs/operations.md, "Upgrading the framework"): a deployment
written by an earlier build carries on under this one, its tables, offsets and audit untouched.

The earlier build is commit :data:`FROM`, the first whose wheel ran outside the checkout. Since then the
audit table gained a column (``source_committed_at``), the commit info gained keys, and the writer
contract, the per-key rules and the start of a run were rewritten: what an upgrade meets.

1. the earlier build's wheel, built from that commit of this repository, into a fresh virtualenv;
2. a configuration with a delta-rs table and a delta-spark table, Debezium records, ``ingest run``;
3. this checkout's wheel installed over it (``--reinstall-package``: both carry version 0.1.0);
4. ``ingest check`` passes; ``ingest status``: the same Delta versions and offsets, nothing to apply;
5. more records (updates and a delete of rows the earlier build wrote, an insert), ``ingest run``;
6. the rows are what the source says, each table's new audit row received only the new records, and
   ``ingest status`` reads the audit both builds wrote.

Run it alone with ``pytest -m packaging``.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.packaging.wheels import ROOT, build_wheel, clean_env, debezium_json, install, new_venv, run

pytestmark = pytest.mark.packaging

#: The earlier build: 2026-11-28, "Tests that the wheel works outside the checkout".
FROM = "52c345a2b03c627cfbda0780f5a54cc3af883878"

TABLES = {"notes": "delta-rs", "notes_spark": "delta-spark"}
BEFORE = [("c", {"id": 1, "body": "one"}, 10), ("c", {"id": 2, "body": "two"}, 11),
          ("c", {"id": 3, "body": "three"}, 12), ("u", {"id": 1, "body": "one, edited"}, 13)]
AFTER = [("u", {"id": 3, "body": "three, edited"}, 20), ("d", {"id": 2}, 21), ("c", {"id": 4, "body": "four"}, 22)]


def earlier_source(into: Path) -> Path:
    """The project as it was at :data:`FROM`, unpacked from this repository's history."""
    found = subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{FROM}^{{commit}}"], capture_output=True,
                           check=False)
    if found.returncode != 0:
        pytest.fail(f"the upgrade test builds commit {FROM[:10]}, which this clone lacks "
                    "(a shallow clone? `git fetch --unshallow`)")
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", FROM], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def status(ingest: Path, config: Path, cwd: Path, env: dict[str, str]) -> dict[str, dict]:
    """``ingest status --format json`` by table."""
    out = run([ingest, "status", "-c", config, "--format", "json"], cwd=cwd, env=env)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {row["table"]: row for row in rows if "table" in row}


def produce(ingest: Path, config: Path, cwd: Path, env: dict[str, str], changes: list) -> None:
    lines = "\n".join(debezium_json(op, row, lsn) for op, row, lsn in changes)
    for table in TABLES:
        run([ingest, "produce", f"app.public.{table}", "-c", config, "--partitions", "1"], cwd=cwd, env=env,
            input=lines)


def rows(ingest: Path, config: Path, cwd: Path, env: dict[str, str], table: str) -> list[dict]:
    out = run([ingest, "query", "-c", config, "--format", "json", f"SELECT id, body FROM {table} ORDER BY id"],
              cwd=cwd, env=env)
    return [json.loads(line) for line in out.splitlines()]


def test_a_deployment_of_an_earlier_build_carries_on_after_an_upgrade(tmp_path_factory: pytest.TempPathFactory
                                                                      ) -> None:
    place = tmp_path_factory.mktemp("upgrade")
    old_wheel = build_wheel(earlier_source(tmp_path_factory.mktemp("earlier")), tmp_path_factory.mktemp("dist-old"))
    venv = new_venv(place)
    install(venv, old_wheel)
    env, ingest, work = clean_env(venv), venv / "bin" / "ingest", place / "deployment"
    work.mkdir()
    config = work / "ingest.yaml"
    config.write_text(yaml.safe_dump({
        "workdir": "work",
        "source": {"kind": "embedded", "value_format": "json", "max_records_per_batch": 100},
        "target": {"root": "tables", "checkpoint_dir": "checkpoints"},
        "spark": {"master": "local[1]", "shuffle_partitions": 1},
        "tables": [{"name": name, "topic": f"app.public.{name}", "writer": writer} for name, writer in TABLES.items()],
    }))
    produce(ingest, config, work, env, BEFORE)
    run([ingest, "run", "-c", config], cwd=work, env=env)
    written = {table: rows(ingest, config, work, env, table) for table in TABLES}
    first = [{"id": 1, "body": "one, edited"}, {"id": 2, "body": "two"}, {"id": 3, "body": "three"}]
    assert written == {table: first for table in TABLES}
    before = status(ingest, config, work, env)

    install(venv, build_wheel(ROOT, tmp_path_factory.mktemp("dist-new")), reinstall=True)
    probe = run([venv / "bin" / "python", "-c", "import ingest.ops.retype as m; print(m.__file__)"],
                cwd=work, env=env)  # a module the earlier build did not have: the new build is the one installed
    assert Path(probe.strip()).resolve().is_relative_to(venv.resolve())

    checked = run([ingest, "check", "-c", config], cwd=work, env=env)
    assert "fail" not in checked.lower(), checked
    upgraded = status(ingest, config, work, env)
    for table in TABLES:
        assert upgraded[table]["delta_version"] == before[table]["delta_version"]
        assert upgraded[table]["applied"] == before[table]["applied"]
        assert upgraded[table]["lag"] == 0

    produce(ingest, config, work, env, AFTER)
    run([ingest, "run", "-c", config], cwd=work, env=env)
    expected = [{"id": 1, "body": "one, edited"}, {"id": 3, "body": "three, edited"}, {"id": 4, "body": "four"}]
    assert {table: rows(ingest, config, work, env, table) for table in TABLES} == {table: expected for table in TABLES}
    after = status(ingest, config, work, env)
    for table in TABLES:
        assert after[table]["lag"] == 0
        assert after[table]["delta_version"] == before[table]["delta_version"] + 1
        last = after[table]["last_batch"]
        # the new build's audit row, appended to the table the earlier build created: only the new records
        assert (last["received"], last["updated"], last["deleted"], last["inserted"]) == (3, 1, 1, 1)
        assert last["source_committed_at"] is not None
