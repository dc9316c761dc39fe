"""The harness's own commands (``ingest demo-stack``, ``ingest pg-load``) get past their imports.

Both load their modules when they run; when the harness moved out of the runtime those imports went
on naming the runtime's old modules, and the commands failed with ModuleNotFoundError. Each case
here runs the command far enough to have imported everything, with input that makes it stop early.
"""

from __future__ import annotations

from tests.harness import ingest_cli


def test_demo_stack_reaches_its_configuration() -> None:
    done = ingest_cli("demo-stack", "--avro", "/nonexistent/stack.yaml", timeout=120)
    assert done.returncode != 0
    assert "configuration file not found" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr


def test_pg_load_reaches_the_database() -> None:
    done = ingest_cli("pg-load", "--source-db", "postgresql://cdc:not-a-secret@127.0.0.1:1/cdc", "--duration", "0.5",
                      timeout=120)
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, done.stderr
    assert "load on 127.0.0.1:1/cdc" in done.stdout
    assert "committed 0 changes" in done.stdout and "Connection refused" in done.stdout
    assert "not-a-secret" not in done.stdout + done.stderr
