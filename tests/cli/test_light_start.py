"""The command line starts light: loading it (every command and extension registered, as ``--help``
does, extensions such as the harness included) imports none of the heavy libraries; each command loads
what it uses when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Libraries that cost tenths of a second or more to import, and that no command needs to be listed.
HEAVY = ("pyspark", "py4j", "great_expectations", "pandas", "numpy", "pyarrow", "deltalake", "duckdb", "polars",
         "fastavro", "confluent_kafka", "boto3", "dagster")

_PROBE = """
import json, sys
from typer.testing import CliRunner
from ingest.cli import app
result = CliRunner().invoke(app, ["--help"])
assert result.exit_code == 0, result.output
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_loading_the_command_line_imports_no_heavy_library() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=False, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "ingest" in loaded and "typer" in loaded  # the probe saw the command line load
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
