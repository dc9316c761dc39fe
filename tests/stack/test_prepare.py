"""``python -m harness.stack prepare``: what ``up`` does before it starts a component, starting nothing
(``make test`` runs it beside the class archive, so that the suite's first stack test does not wait)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from harness.stack.settings import StackSettings

pytestmark = pytest.mark.stack  # it installs PostgreSQL where it is missing, as the stack's tests do


def test_prepare_sets_up_a_fresh_stack_directory_and_starts_nothing() -> None:
    jars = StackSettings.from_env(os.environ, create=False).jars_dir  # the stack's own: no second Maven run
    with tempfile.TemporaryDirectory(dir="/tmp") as place:  # pytest's own are closed to the postgres user
        Path(place).chmod(0o755)
        stack = Path(place) / "stack"
        env = {**os.environ, "STACK_DIR": str(stack), "STACK_JARS_DIR": str(jars)}
        done = subprocess.run([sys.executable, "-m", "harness.stack", "prepare", "--components", "pg,kafka"],
                              env=env, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        _prepared(stack)


def _prepared(stack: Path) -> None:
    assert (stack / "pg" / "data" / "PG_VERSION").exists() and (stack / "kafka" / "data" / "meta.properties").exists()
    assert (stack / "pg" / "data" / "stack.conf").exists() and (stack / "kafka" / "server.properties").exists()
    assert not list(stack.rglob("*.pid")), list(stack.rglob("*.pid"))
    assert not (stack / "mariadb").exists()  # only what was asked for and what it requires
