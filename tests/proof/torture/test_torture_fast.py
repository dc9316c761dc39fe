"""The CI version of ``ingest torture``: a few real SIGKILLs and damaged checkpoints, then the full verdict.

The full proof (50+ kills) is ``ingest torture --seed 1 --kills 50``; see the README for its figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.torture.consistency import check
from harness.torture.run import Torture, TortureSpec
from typer.testing import CliRunner

from ingest.config import load_config
from ingest.lake.delta import open_table, read_all


@pytest.mark.spark
def test_kills_at_named_points_and_damaged_checkpoints_leave_every_table_equal_to_the_source(tmp_path: Path) -> None:
    spec = TortureSpec(workdir=tmp_path / "torture", seed=11, kills=3, events=700, batch=150,
                       damage_probability=0.0, timer_fraction=0.0,
                       schedule=("after-batch@2", "during-merge", "after-tombstones"),
                       damages=("claim-ahead", "truncate-offsets"), tables=("orders",))
    lines: list[str] = []
    result = Torture(spec, say=lines.append).run()
    c = result.consistency
    assert c is not None
    assert result.ok, (result.failure, c.problems, lines)
    assert sum(result.kills.values()) == 3, lines
    assert c.divergent_rows == 0 and c.duplicate_keys == 0 and c.unbalanced_audit_rows == 0
    assert c.received == c.records > 0  # every record accounted for exactly once
    assert c.quarantined == c.malformed > 0
    assert result.damages == {"claim-ahead": 1, "truncate-offsets": 1}, lines

    # The verdict can fail: a lost row and a duplicated key are both caught.
    config = load_config(spec.workdir / "config.yaml")
    orders = open_table(config.table_path("orders"))
    victim = read_all(orders, columns=["id"])["id"][0].as_py()
    orders.delete(f"id = {victim}")
    broken = check(config)
    assert broken.divergent_rows >= 1 and not broken.ok
    from deltalake import write_deltalake

    orders = open_table(config.table_path("orders"))  # the only table this run writes
    write_deltalake(orders, read_all(orders).slice(0, 1), mode="append")
    broken = check(config)
    assert broken.duplicate_keys == 1 and not broken.ok


@pytest.mark.spark
def test_kills_of_runs_the_driver_applies_alone_leave_the_table_equal_to_the_source(tmp_path: Path) -> None:
    """The same proof for runs that apply their backlog without Spark (``source.driver_seconds``):
    there is no Spark checkpoint to damage, and a crash anywhere in a batch still ends equal."""
    spec = TortureSpec(workdir=tmp_path / "torture", seed=12, kills=3, events=700, batch=150,
                       damage_probability=0.0, timer_fraction=0.0, driver_seconds=600,
                       schedule=("during-merge", "after-delta-commit@2", "after-tombstones"), tables=("orders",))
    lines: list[str] = []
    result = Torture(spec, say=lines.append).run()
    c = result.consistency
    assert c is not None
    assert result.ok, (result.failure, c.problems, lines)
    assert result.kills == {"during-merge": 1, "after-delta-commit": 1, "after-tombstones": 1}, lines
    assert c.divergent_rows == 0 and c.duplicate_keys == 0 and c.unbalanced_audit_rows == 0
    assert c.received == c.records > 0
    assert not (spec.workdir / "checkpoints").exists()  # no run started Spark's query


@pytest.mark.parametrize("divergent", [0, 3])
def test_the_torture_command_prints_its_figures_and_fails_on_divergence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, divergent: int) -> None:
    from collections import Counter

    from harness.torture import run as torture
    from harness.torture.consistency import ConsistencyReport

    from ingest.cli import app

    def fake_run(self: torture.Torture) -> torture.TortureResult:
        report = ConsistencyReport([], divergent_rows=divergent, commits=120, records=9000, received=9000,
                                   audit_rows=120, quarantined=90, malformed=90)
        return torture.TortureResult(kills=Counter({"after-batch": 2, "during-merge": 1}), runs=4, seconds=61.0,
                                     consistency=report)

    monkeypatch.setattr(torture.Torture, "run", fake_run)
    result = CliRunner().invoke(app, ["torture", "--kills", "3", "--workdir", str(tmp_path / "cli")])
    assert result.exit_code == (1 if divergent else 0), result.output
    for figure in ("kills at after-batch", "kills in total", "divergent rows", "duplicate keys",
                   "audit rows / unbalanced", "batches committed", "wall time"):
        assert figure in result.output
    assert ("DIVERGED" if divergent else "consistent") in result.output
