"""bench_latency's probe of full garbage collections, in real interpreters started with its environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_latency
import gc_probe


def _python(env: dict[str, str], *argv: str) -> None:
    subprocess.run([sys.executable, "-c", "import gc; gc.collect(0); gc.collect(); gc.collect()", *argv],
                   env={**os.environ, **env}, check=True, timeout=60)


def test_full_collections_of_the_engines_processes_are_counted_in_their_window(tmp_path) -> None:
    env = gc_probe.environment(tmp_path / "probe")
    before = time.time()
    _python(env, "pyspark.worker")  # a command line naming pyspark: one of Spark's Python processes
    _python(env, "pyspark.worker")
    _python(env)  # any other process: not probed
    after = time.time()
    seen = gc_probe.collections(tmp_path / "probe", before, after)
    assert set(seen) == {"worker"}  # the third process wrote nothing
    # each process's two full collections (gc.collect(0) is not one); its exit may add one more
    assert seen["worker"].processes == 2 and 4 <= seen["worker"].count <= 6 and seen["worker"].milliseconds > 0
    assert gc_probe.collections(tmp_path / "probe", after, after + 60) == {}  # outside the window
    (tmp_path / "probe" / "gc-1.log").write_text("1.0 1 driver 5.0\n2.0 1 dri")  # a line left half written
    assert gc_probe.collections(tmp_path / "probe", 0, 3)["driver"] == gc_probe.Collections(1, 5.0, 1)


def test_the_table_shows_rate_mean_and_each_processs_share_of_the_window() -> None:
    assert bench_latency._pauses(None, 60) == "none"
    # 120 collections of 2 processes in 60 s, 6 s in all: 2/s, 50 ms each, 5 % of each process's time
    assert bench_latency._pauses(gc_probe.Collections(120, 6000.0, 2), 60) == "2.00/s, 50 ms, 5%"
