"""Every crash window of a batch, in process: crash at a named point, replay the batch, compare.

The in-process twin of ``ingest torture``: fast and deterministic. At each point of
:data:`ingest.crashpoints.POINTS` the batch stops as a SIGKILL would stop it (nothing after the point
runs); replaying the same batch -- as Spark does after a restart -- must leave the table, its
tombstones, the audit (after the start-up repair) and the quarantine exactly as one clean run does.
On delta-spark the same windows are crossed with the batch planned on the executors as well
(``target.plan_on: executors``), whose steps between the points differ.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ingest import crashpoints
from ingest.apply.journey import apply_parts
from ingest.config import TableSpec
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.model import ColumnSpec, ControlRecord
from ingest.records import audit, quarantine
from tests.factories import COLUMNS, change, decoded_rows
from tests.harness import current_writer

WIDE = (COLUMNS[0], COLUMNS[1], ColumnSpec("balance", "decimal(14,2)"), COLUMNS[3])
FIRST = [change("c", k, 10 + k, name=f"n{k}") for k in range(1, 7)]
SECOND: list[Any] = [
    change("u", 1, 30, name="updated"),
    change("d", 2, 31),
    "undecodable: quarantined",
    change("d", 3, 32),
    ControlRecord("tombstone"),
    change("c", 7, 33, name="new"),
    change("u", 4, 34, name="wider", balance="123456789012.34", columns=WIDE),  # decimal(12,2) -> (14,2)
    change("d", 2, 31),  # a redelivered delete
]


class _Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing on the way up handles it."""


def _paths(root: Path) -> TablePaths:
    return TablePaths(root / "t", root / "_cdc_tombstones" / "t", root / "_cdc_audit", root / "_cdc_quarantine")


def _apply(spec: TableSpec, paths: TablePaths, items: list[Any], first: int, batch: int) -> None:
    apply_parts(spec, paths, decoded_rows(items, first_offset=first), batch_id=batch, run_id=f"r{batch}",
                writer=current_writer())


def _state(paths: TablePaths) -> dict[str, Any]:
    audit.reconcile(paths.audit, "t", paths.table)  # what the engine does at start-up
    rows = read_all(open_table(paths.table)).to_pylist()
    tombs = open_table(paths.tombstones)
    records = audit.read(paths.audit, table="t").to_pylist()
    held = quarantine.read(paths.quarantine, table="t").to_pylist()
    keep = ("id", "name", "balance", "notes", "_cdc_position", "_cdc_deleted")
    return {
        "rows": sorted(tuple(r[k] for k in keep) for r in rows),
        # _cdc_recorded_at is when a tombstone was written: a wall clock, different in every run.
        "tombstones": sorted(read_all(tombs).drop_columns(["_cdc_recorded_at"]).to_pylist(), key=str) if tombs else [],
        "audit": sorted((r["received"], r["inserted"], r["updated"], r["deleted"], r["stale"], r["superseded"],
                         r["quarantined"], r["skipped"], r["balanced"]) for r in records),
        "quarantine": sorted((r["offset"], r["stage"]) for r in held),
        "types": {f.name: str(f.type) for f in open_table(paths.table).schema().fields},
    }


@pytest.fixture(scope="module")
def clean_runs() -> dict[tuple[str, str], dict[str, Any]]:
    """The state after one clean run, per (engine, delete mode), filled as the cases need it."""
    return {}


@pytest.fixture(scope="module")
def after_first(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., TablePaths]:
    """``place(key, root, apply)``: the tables at ``root`` as ``FIRST`` applied by ``apply`` leaves them --
    a copy of one such run per ``key`` (engine, path, mode), made once: a delta-spark batch costs
    seconds, and the crash windows are all in the second batch."""
    made: dict[str, Path] = {}

    def place(key: str, root: Path, apply: Callable[[TablePaths], Callable[[list[Any], int, int], None]]
              ) -> TablePaths:
        if key not in made:
            made[key] = tmp_path_factory.mktemp(f"first-{key}")
            apply(_paths(made[key]))(FIRST, 0, 0)
        shutil.copytree(made[key], root)
        return _paths(root)

    return place


# Soft mode keeps deleted rows and writes no tombstones, so it has no "after-tombstones" point.
@pytest.mark.parametrize(("point", "mode"), [(p, m) for m in ("hard", "soft") for p in crashpoints.POINTS
                                             if not (p == "after-tombstones" and m == "soft")])
@pytest.mark.hard_mode_on_delta_spark
def test_a_crash_at_any_point_then_replay_equals_a_clean_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             clean_runs: dict[tuple[str, str], dict[str, Any]],
                                                             after_first: Callable[..., TablePaths],
                                                             apply_engine: Any, point: str, mode: str) -> None:
    spec = TableSpec(name="t", topic="t", delete_mode=mode)

    def apply(paths: TablePaths) -> Callable[[list[Any], int, int], None]:
        return lambda items, first, batch: _apply(spec, paths, items, first, batch)

    _crash_case(monkeypatch, tmp_path, clean_runs, after_first, (apply_engine.name, mode), point, apply)


def _crash_case(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clean_runs: dict[tuple[str, str], dict[str, Any]],
                after_first: Callable[..., TablePaths], key: tuple[str, str], point: str,
                apply: Callable[[TablePaths], Callable[[list[Any], int, int], None]]) -> dict[str, Any]:
    """One crash window on ``apply``'s path: the tables ``FIRST`` left, ``SECOND`` stopped at ``point``
    and replayed, must equal one clean run of both (made once per ``key``); that clean state."""
    if key not in clean_runs:
        clean = _paths(tmp_path / "clean")
        apply(clean)(FIRST, 0, 0)
        apply(clean)(SECOND, len(FIRST), 1)
        clean_runs[key] = _state(clean)
    paths = after_first("-".join(key), tmp_path / "crashed", apply)
    _crash_then_replay(monkeypatch, point, apply(paths))
    assert _state(paths) == clean_runs[key]
    _assert_live_rows(paths)
    return clean_runs[key]


def _crash_then_replay(monkeypatch: pytest.MonkeyPatch, point: str,
                       apply: Callable[[list[Any], int, int], None]) -> None:
    """On the tables ``FIRST`` left (:func:`after_first`), ``SECOND`` stopped at ``point`` as a SIGKILL
    would stop it, then ``SECOND`` again (the replay after the restart), each applied by
    ``apply(items, first offset, batch id)``."""
    real, hit = crashpoints.point, []

    def crash(name: str) -> None:
        if name == point:
            hit.append(name)
            raise _Killed(name)

    monkeypatch.setattr(crashpoints, "point", crash)
    with pytest.raises(_Killed):
        apply(SECOND, len(FIRST), 1)
    monkeypatch.setattr(crashpoints, "point", real)
    assert hit == [point]
    apply(SECOND, len(FIRST), 2)


def _assert_live_rows(paths: TablePaths) -> None:
    rows = {r["id"]: r for r in read_all(open_table(paths.table)).to_pylist() if not r["_cdc_deleted"]}
    assert sorted(rows) == [1, 4, 5, 6, 7] and rows[1]["name"] == "updated"


def _apply_on_executors(spark: Any, engine: Any, paths: TablePaths, items: list[Any], first: int, batch: int,
                        spec: TableSpec | None = None) -> None:
    """``_apply`` with ``target.plan_on: executors``: the decoded parts as a DataFrame, the table's
    handles opened afresh (a restarted process)."""
    import pyarrow as pa

    from ingest.apply.journey import apply_batch, placement_for
    from ingest.commit.state import OpenTables
    from ingest.decode.parts import write_parts
    from ingest.spark.session import arrow_frame

    blobs = pa.Table.from_batches([write_parts(decoded_rows(items, first_offset=first))])
    apply_batch(spec or TableSpec(name="t", topic="t"), paths, arrow_frame(spark, blobs),
                placement=placement_for("executors", engine, paths.table), writer=engine,
                opened=OpenTables(paths, "t"), batch_id=batch, run_id=f"r{batch}")


#: The points whose steps differ on the executors: quarantine after validation there, remembered
#: deletes as a delta-spark MERGE, the commit from a DataFrame. The widening and the audit row are the
#: driver path's steps with delta-spark (crossed above).
EXECUTOR_POINTS = [p for p in crashpoints.POINTS if p not in ("before-widen", "after-widen", "after-batch")]


@pytest.mark.spark
@pytest.mark.parametrize("point", EXECUTOR_POINTS)
def test_a_crash_on_the_executor_path_then_replay_equals_a_clean_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_runs: dict[tuple[str, str], dict[str, Any]],
        after_first: Callable[..., TablePaths], spark: Any, point: str) -> None:
    """The same windows with the batch planned on the executors (``target.plan_on: executors``),
    where quarantine follows validation and the remembered deletes are a delta-spark MERGE."""
    from ingest.apply import journey
    from ingest.commit.delta_spark import DeltaSparkWriter

    engine = DeltaSparkWriter(spark)
    monkeypatch.setattr(journey, "_collected", None)  # every batch must stay on the executors

    def apply(paths: TablePaths) -> Callable[[list[Any], int, int], None]:
        return lambda items, first, batch: _apply_on_executors(spark, engine, paths, items, first, batch)

    _crash_case(monkeypatch, tmp_path, clean_runs, after_first, ("executors", "hard"), point, apply)


@pytest.mark.spark
@pytest.mark.parametrize("point", ["after-widen"])  # the others' steps are the scd1 executor path's
def test_a_crash_while_history_is_kept_on_the_executor_path_then_replay_equals_a_clean_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_runs: dict[tuple[str, str], dict[str, Any]],
        after_first: Callable[..., TablePaths], spark: Any, point: str) -> None:
    """A ``history_mode: scd2`` table on that path, stopped with the table widened but not yet
    holding the batch's versions: the replay derives and writes the same versions from the
    executors (every version compared, not only the live rows)."""
    from ingest.apply import journey
    from ingest.commit.delta_spark import DeltaSparkWriter

    engine = DeltaSparkWriter(spark)
    spec = TableSpec(name="t", topic="t", history_mode="scd2")
    monkeypatch.setattr(journey, "_collected", None)  # every batch must stay on the executors

    def apply(paths: TablePaths) -> Callable[[list[Any], int, int], None]:
        return lambda items, first, batch: _apply_on_executors(spark, engine, paths, items, first, batch, spec)

    clean = _crash_case(monkeypatch, tmp_path, clean_runs, after_first, ("executors", "scd2"), point, apply)
    assert len(clean["rows"]) > 7  # past versions kept beside the current ones
