"""Building the engine's wheel and running it from a virtualenv outside the checkout, for the packaging
tests: what a user of ``pip install`` has, and nothing of the repository."""

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


def build_env() -> dict[str, str]:
    """This process's environment without what would point uv at the development venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def build_wheel(source: Path, dist: Path) -> Path:
    """The engine's wheel built from the project at ``source``. uv builds the sdist, then the wheel from
    the unpacked sdist: what the sdist forgets, the wheel lacks."""
    run([uv(), "build", "--quiet", "--out-dir", dist, source], cwd=source, env=build_env())
    (wheel,) = dist.glob("cdc_lakehouse_ingest-*.whl")
    return wheel


def new_venv(place: Path) -> Path:
    """An empty virtualenv at ``place/venv`` on this interpreter, outside the checkout."""
    assert not place.resolve().is_relative_to(ROOT)
    target = place / "venv"
    run([uv(), "venv", "--quiet", "--python", sys.executable, target], cwd=place, env=build_env())
    return target


def install(venv: Path, wheel: Path, *, reinstall: bool = False) -> None:
    """Install ``wheel`` and its dependencies into ``venv``, the locked versions as constraints (filled from
    uv's cache, so a re-run downloads nothing). ``reinstall`` replaces an installed engine even when the
    two carry the same version number, as an upgrade between two builds of one version must."""
    again = ["--reinstall-package", "cdc-lakehouse-ingest"] if reinstall else []
    run([uv(), "pip", "install", "--quiet", "--python", venv / "bin" / "python", *again,
         "-c", ROOT / "requirements.lock", wheel], cwd=venv.parent, env=build_env())


def debezium_json(op: str, row: dict[str, Any], lsn: int) -> str:
    """One ``ingest produce`` line: a Debezium change of ``notes`` as JsonConverter writes it (no schema)."""
    value = {"before": None if op == "c" else row, "after": None if op == "d" else row,
             "source": {"connector": "postgresql", "lsn": lsn, "ts_ms": 1_767_225_600_000, "snapshot": "false"},
             "op": op, "ts_ms": 1_767_225_600_000}
    return json.dumps({"key": base64.b64encode(json.dumps({"id": row["id"]}).encode()).decode(),
                       "value": base64.b64encode(json.dumps(value).encode()).decode(), "partition": 0})
