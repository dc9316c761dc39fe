"""Validation results on demand: one GX result JSON per batch, pruned, readable by `ingest quality ...`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ingest.cli import app
from ingest.quality import ResultStore
from tests.quality.helpers import ingest

runner = CliRunner()


def test_every_validated_batch_leaves_its_gx_result(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1), src.message("c", 2, email="b at x.io")], 0)
    ingest(config, [src.message("u", 1, qty=3)], 1)
    store = ResultStore(config.quality_results_dir / "accounts")
    assert [r.batch_id for r in store.list()] == [0, 1]
    doc = store.find(batch_id=0).load()
    assert doc["status"] == "quarantined" and doc["rows_held"] == 1 and doc["rows_validated"] == 2
    result = doc["validation_result"]  # GX's ExpectationSuiteValidationResult, as GX serializes it
    assert result["success"] is False and result["statistics"]["evaluated_expectations"] == 5
    failed = [r for r in result["results"] if not r["success"]]
    assert [r["expectation_config"]["type"] for r in failed] == ["expect_column_values_to_match_regex"]
    assert failed[0]["result"]["unexpected_list"] == ["b at x.io"]
    assert "unexpected_index_query" not in failed[0]["result"]


def test_results_are_pruned_to_the_newest(tmp_path):
    store = ResultStore(tmp_path, keep=3)
    for batch in range(5):
        store.write(run_id="r", batch_id=batch, document={"n": batch})
    assert [r.batch_id for r in store.list()] == [2, 3, 4]
    assert store.find().load() == {"n": 4} and store.find(batch_id=9) is None


def test_cli_quality_and_quarantine_commands(accounts):
    config, src = accounts
    ingest(config, [src.message("c", 1), src.message("c", 2, email="b at x.io"), src.garbage()], 0)
    cfg = ["-c", str(config.workdir / "config.yaml")]

    shown = runner.invoke(app, ["quality", "show", "-t", "accounts", "--batch", "0", *cfg])
    assert shown.exit_code == 0, shown.output
    assert "quarantined" in shown.output and "expect_column_values_to_match_regex(email)" in shown.output
    full = runner.invoke(app, ["quality", "show", "-t", "accounts", "--json", *cfg])
    assert json.loads(full.output)["statistics"]["unsuccessful_expectations"] == 1
    assert runner.invoke(app, ["quality", "check", *cfg]).exit_code == 0

    listed = runner.invoke(app, ["quarantine", "list", *cfg])
    assert listed.exit_code == 0 and "2 quarantined messages pending replay" in listed.output
    one = runner.invoke(app, ["quarantine", "show", "shop.public.accounts:0:1", *cfg])
    assert one.exit_code == 0 and "b at x.io" in one.output and '"op": "c"' in one.output

    replayed = runner.invoke(app, ["quarantine", "replay", "-t", "accounts", "--stage", "quality", "--no-recheck",
                                   *cfg])
    assert replayed.exit_code == 0 and "1 replayed" in replayed.output
    listed = runner.invoke(app, ["quarantine", "list", *cfg])
    assert "1 quarantined messages pending replay" in listed.output
