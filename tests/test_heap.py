"""A long run's processes freeze what their start-up built, so full collections skip it (ingest.heap).

In a fresh interpreter each, as a Spark worker or the driver starts: freezing in the test process
would keep the suite's own objects from ever being collected.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_FREEZE_TWICE = textwrap.dedent("""
    import gc, json
    import pyarrow  # noqa: F401  (a start-up's worth of modules)
    from ingest.heap import freeze_start_up

    tracked = len(gc.get_objects())
    freeze_start_up()
    frozen, left = gc.get_freeze_count(), len(gc.get_objects())
    later = [[i] for i in range(1000)]  # what the run builds after: tracked, not frozen
    freeze_start_up()
    print(json.dumps({"tracked": tracked, "frozen": frozen, "left": left,
                      "again": gc.get_freeze_count(), "after": len(gc.get_objects())}))
""")

_WARM_UP = textwrap.dedent("""
    import gc
    from ingest.spark.session import _import_decode

    assert gc.get_freeze_count() == 0
    list(_import_decode(iter([])))
    print(gc.get_freeze_count(), len(gc.get_objects()))
""")


_EXIT = textwrap.dedent("""
    import atexit, gc
    from ingest.heap import freeze_start_up

    atexit.register(lambda: print("at exit", gc.get_freeze_count()))  # runs after handlers registered later
    freeze_start_up()
    print("running", gc.get_freeze_count())
""")


def _run(script: str) -> str:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip().splitlines()[-1]


def test_start_up_is_frozen_once_and_what_comes_after_is_still_collected():
    got = json.loads(_run(_FREEZE_TWICE))
    assert got["frozen"] >= 0.9 * got["tracked"] and got["left"] < 100  # a full collection walks nothing of it
    assert got["again"] == got["frozen"]  # the second call froze nothing
    assert got["after"] >= 1000  # the later objects are the collector's, as before


def test_the_frozen_objects_are_the_collectors_again_at_exit():
    """Native bindings that count their objects (DuckDB's) report those never collected as leaked."""
    out = subprocess.run([sys.executable, "-c", _EXIT], capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    running, at_exit = (line.split()[-1] for line in out)
    assert int(running) > 1000 and int(at_exit) == 0


def test_a_workers_warm_up_freezes_what_it_imported():
    frozen, left = map(int, _run(_WARM_UP).split())
    assert frozen > 10_000 and left < 0.01 * frozen  # the decoders' imports, nearly all of what is tracked


def test_mapinarrows_decode_freezes_once_it_has_decoded_its_first_task(monkeypatch):
    import pyarrow as pa

    from ingest.decode import columnar
    from ingest.source.topiclog import KAFKA_ROW_SCHEMA

    events: list[str] = []
    monkeypatch.setattr(columnar, "freeze_start_up", lambda: events.append("freeze"))
    rows = pa.table({"key": [None], "value": [b"not json"], "topic": ["t"], "partition": [0], "offset": [0],
                     "timestamp": [0], "timestampType": [0], "headers": [[]]}).cast(KAFKA_ROW_SCHEMA)
    decoded = columnar.BatchDecoder({"t": columnar.DecoderSpec("json")})(iter(rows.to_batches()))
    assert next(decoded).num_rows and events == []
    assert list(decoded) == [] and events == ["freeze"]
