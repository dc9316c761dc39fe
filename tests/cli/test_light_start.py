"""The command line starts light: loading it (every command and extension registered, as ``--help``
does, extensions such as the harness included) imports none of the heavy libraries; each command loads
what it uses when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

#: Libraries that cost tenths of a second or more to import, and that no command needs to be listed.
HEAVY = ("pyspark", "py4j", "great_expectations", "pandas", "numpy", "pyarrow", "deltalake", "duckdb", "polars",
         "fastavro", "confluent_kafka", "boto3", "dagster")

#: Runs one command in-process and prints the top-level packages loaded by then.
_PROBE = """
import json, sys
from typer.testing import CliRunner
from ingest.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
assert result.exit_code == 0, result.output
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _loaded(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=False,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "ingest" in loaded and "typer" in loaded  # the probe saw the command line load
    return loaded


def test_loading_the_command_line_imports_no_heavy_library() -> None:
    loaded = _loaded("--help")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_status_asks_the_catalogue_without_spark(tmp_path: Path) -> None:
    """``ingest status`` reads the Delta logs (delta-rs, Arrow) and the source's end offsets, nothing more."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"workdir": str(tmp_path / "work"), "source": {"value_format": "json"},
                                      "tables": [{"name": "notes", "topic": "app.notes"}]}))
    loaded = _loaded("status", "-c", str(config))
    assert "deltalake" in loaded  # it read the (missing) table's log
    assert not loaded & {"pyspark", "py4j", "great_expectations", "pandas", "duckdb"}, sorted(loaded)
