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

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
#: Variables a process of the new venv may inherit: none points at the checkout or its venv.
KEPT = ("HOME", "JAVA_HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_CACHE_HOME", "INGEST_JARS_CACHE",
        "INGEST_MAVEN_REPOSITORY", "INGEST_CLASS_ARCHIVE")


def uv() -> str:
    """The uv the Makefile installs beside pip in the development venv (or one on PATH)."""
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        pytest.fail("uv is needed to build and install the wheel (make install puts it in .venv/bin)")
    return found


def run(cmd: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None, input: str | None = None,
        timeout: float = 900) -> str:
    """Run ``cmd``; its stdout, or the test fails with its output."""
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, input=input, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user of the new venv: its bin first, the system's after, nothing of the checkout."""
    env = {k: os.environ[k] for k in KEPT if k in os.environ}
    system = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
              if p and not Path(p).resolve().is_relative_to(ROOT) and Path(p).resolve() != Path(sys.prefix) / "bin"]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *system])
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv outside the checkout with the wheel (and its dependencies) installed."""
    dist, place = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("installed")
    assert not place.resolve().is_relative_to(ROOT)
    # uv builds the sdist, then the wheel from the unpacked sdist: what the sdist forgets, the wheel lacks
    build_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run([uv(), "build", "--quiet", "--out-dir", dist, ROOT], cwd=ROOT, env=build_env)
    (wheel,) = dist.glob("cdc_lakehouse_ingest-*.whl")
    target = place / "venv"
    run([uv(), "venv", "--quiet", "--python", sys.executable, target], cwd=place, env=build_env)
    run([uv(), "pip", "install", "--quiet", "--python", target / "bin" / "python", "-c", ROOT / "requirements.lock",
         wheel], cwd=place, env=build_env)
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


def debezium_json(op: str, row: dict[str, Any], lsn: int) -> str:
    """One ``ingest produce`` line: a Debezium change of ``notes`` as JsonConverter writes it (no schema)."""
    value = {"before": None if op == "c" else row, "after": None if op == "d" else row,
             "source": {"connector": "postgresql", "lsn": lsn, "ts_ms": 1_767_225_600_000, "snapshot": "false"},
             "op": op, "ts_ms": 1_767_225_600_000}
    return json.dumps({"key": base64.b64encode(json.dumps({"id": row["id"]}).encode()).decode(),
                       "value": base64.b64encode(json.dumps(value).encode()).decode(), "partition": 0})


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
