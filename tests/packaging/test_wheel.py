"""The wheel works without the checkout: built from the repository, installed into a fresh virtualenv
outside it (the locked versions as constraints, no extra), and run from a directory outside it.

One ingestion per writer: a configuration written there (embedded topic log, one table), Debezium
JSON records appended with ``ingest produce``, ``ingest run`` with ``target.writer: delta-rs``, then
with ``delta-spark`` (whose jars the installed engine resolves into its jars cache, not from the
repository), and the rows read back with ``ingest query``. Nothing may come from the checkout: the
processes get no PYTHONPATH and a PATH without the development venv, and the test checks that every
module the CLI loads lives in the new venv.

Run it alone with ``pytest -m packaging``. The virtualenv is filled from uv's cache, so a re-run
downloads nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.packaging.wheels import ROOT, build_wheel, clean_env, debezium_json, install, new_venv, run

pytestmark = pytest.mark.packaging


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv outside the checkout with the wheel (and its dependencies) installed."""
    dist, place = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("installed")
    target = new_venv(place)
    install(target, build_wheel(ROOT, dist))
    return target


def test_the_installed_engine_is_the_venvs_own(venv: Path, tmp_path: Path) -> None:
    probe = ("import json, sys, importlib.util, ingest.cli.commands, ingest.spark.session\n"
             "files = [getattr(m, '__file__', None) or '' for m in list(sys.modules.values())]\n"
             "optional = ('harness', 'dagster', 'boto3', 'psycopg')\n"
             "missing = [n for n in optional if importlib.util.find_spec(n) is None]\n"
             "print(json.dumps({'ingest': ingest.__file__, 'path': sys.path, 'files': files, 'missing': missing}))")
    found = json.loads(run([venv / "bin" / "python", "-c", probe], cwd=tmp_path, env=clean_env(venv)))
    assert Path(found["ingest"]).resolve().is_relative_to(venv.resolve())
    assert not [p for p in found["path"] if p and Path(p).resolve().is_relative_to(ROOT)]
    assert not [f for f in found["files"] if f and Path(f).resolve().is_relative_to(ROOT)]
    # the harness is not part of the distribution; the extras were not asked for
    assert found["missing"] == ["harness", "dagster", "boto3", "psycopg"]
    from importlib.metadata import version

    shown = run([venv / "bin" / "ingest", "--version"], cwd=tmp_path, env=clean_env(venv))
    assert shown.strip() == f"cdc-lakehouse-ingest {version('cdc-lakehouse-ingest')}"


CHANGES = [("c", {"id": 1, "body": "one"}, 10), ("c", {"id": 2, "body": "two"}, 11),
           ("c", {"id": 3, "body": "three"}, 12), ("u", {"id": 1, "body": "one, edited"}, 13), ("d", {"id": 2}, 14)]


@pytest.mark.parametrize("writer", ["delta-rs", "delta-spark"])
def test_an_ingestion_from_outside_the_checkout(venv: Path, tmp_path: Path, writer: str) -> None:
    from ingest.spark.jars import cache_dir

    env = clean_env(venv)
    assert not cache_dir(env).is_relative_to(ROOT)  # the delta-spark writer's jars come from the jars cache
    config = tmp_path / "ingest.yaml"
    config.write_text(yaml.safe_dump({
        "workdir": "work",
        "source": {"kind": "embedded", "value_format": "json", "max_records_per_batch": 100},
        "target": {"root": "tables", "checkpoint_dir": "checkpoints", "writer": writer},
        "spark": {"master": "local[1]", "shuffle_partitions": 1},
        "tables": [{"name": "notes", "topic": "app.public.notes"}],
    }))
    ingest = venv / "bin" / "ingest"
    lines = "\n".join(debezium_json(op, row, lsn) for op, row, lsn in CHANGES)
    run([ingest, "produce", "app.public.notes", "-c", config, "--partitions", "1"], cwd=tmp_path, env=env, input=lines)
    report = run([ingest, "run", "-c", config], cwd=tmp_path, env=env)
    assert "notes" in report
    rows = run([ingest, "query", "-c", config, "--format", "json", "SELECT id, body FROM notes ORDER BY id"],
               cwd=tmp_path, env=env)
    assert [json.loads(line) for line in rows.splitlines()] == [{"id": 1, "body": "one, edited"},
                                                              {"id": 3, "body": "three"}]
    assert (tmp_path / "work" / "tables" / "notes" / "_delta_log").is_dir()
