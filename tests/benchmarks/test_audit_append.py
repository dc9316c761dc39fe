"""bench_audit_append times each append of both modes, and each appends its rows."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_audit_append

from ingest.records import audit


def test_each_mode_times_every_append_and_appends_its_row(tmp_path: Path) -> None:
    with Progress(transient=True, disable=True) as progress:
        for name, append in bench_audit_append.modes().items():
            path = tmp_path / name.replace(" ", "-") / "_cdc_audit"
            times = bench_audit_append.appended(append, path, 3, progress, name)
            assert len(times) == 3 and all(t > 0 for t in times)
            assert sorted(audit.read(path)["batch_id"].to_pylist()) == [0, 1, 2]
    assert set(bench_audit_append.modes()) == {"afresh", "kept open"}
