"""Kafka-shaped messages through the engine's own decode and apply, without Spark.

Tests that pin the engine's semantics write Debezium messages as bytes (what Kafka holds), give
them partitions and offsets, and hand batches of them to :func:`ingest_batch`, which runs the same
decode and apply steps as a streaming micro-batch. How the stream is cut into batches is the test's
choice, so batching-independence can be checked directly.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from ingest.apply.batch import BatchResult
from ingest.apply.journey import apply_parts
from ingest.columns import FRAMEWORK_NAMES
from ingest.commit.writer import Writer
from ingest.config import IngestConfig, TableSpec, load_config
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.read.changes import CHANGE_COLUMNS

#: The writer the harness commits with (``None``: apply_parts's default, delta-rs); set by the
#: ``apply_engine`` fixture (tests/conftest.py), which runs a module's tests with both writers.
_ENGINE: list[Writer | None] = [None]


def use_engine(engine: Writer | None) -> None:
    _ENGINE[0] = engine


def current_writer() -> Writer | None:
    return _ENGINE[0]


class Race:
    """Another writer, run once when this writer reaches a named fault point (see :func:`race_at`)."""

    def __init__(self, point: str, other_writer: Callable[[], object]) -> None:
        from ingest import crashpoints

        self.point, self.other_writer, self.ran = point, other_writer, False
        self._real_point = crashpoints.point

    def __call__(self, name: str) -> None:
        if name == self.point and not self.ran:
            self.ran = True
            self.other_writer()
        self._real_point(name)


def race_at(monkeypatch: Any, point: str, other_writer: Callable[[], object]) -> Race:
    """Run ``other_writer`` once, the first time this process reaches fault point ``point``
    (:func:`ingest.crashpoints.point`), then go on: a race at an exact step of the commit.

    ``monkeypatch`` (pytest's) puts the real fault points back after the test; ``.ran`` tells whether
    the race happened.
    """
    from ingest import crashpoints

    race = Race(point, other_writer)
    monkeypatch.setattr(crashpoints, "point", race)
    return race


KAFKA_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])
TS = 1_700_000_000_000


@dataclass(frozen=True)
class Message:
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int = TS
    headers: tuple[tuple[str, bytes], ...] = ()


class Topic:
    """Messages of one topic; offsets are assigned per partition in the order they are sent."""

    def __init__(self, name: str = "t") -> None:
        self.name = name
        self.messages: list[Message] = []
        self._next: dict[int, int] = defaultdict(int)

    def send(self, key: bytes | None, value: bytes | None, *, partition: int = 0, ts_ms: int = TS,
             headers: tuple[tuple[str, bytes], ...] = ()) -> Message:
        message = Message(key, value, partition, self._next[partition], ts_ms, headers)
        self._next[partition] += 1
        self.messages.append(message)
        return message


def paths_in(tmp_path: Path, name: str = "t") -> TablePaths:
    root = tmp_path / "tables"
    return TablePaths(root / name, root / "_cdc_tombstones" / name, root / "_cdc_audit", root / "_cdc_quarantine")


def kafka_rows(topic: str, messages: list[Message]) -> pa.Table:
    return pa.Table.from_pylist([
        {"key": m.key, "value": m.value, "topic": topic, "partition": m.partition, "offset": m.offset,
         "timestamp": datetime.fromtimestamp(m.timestamp_ms / 1000, UTC), "timestampType": 0,
         "headers": [{"key": k, "value": v} for k, v in m.headers]}
        for m in messages], schema=KAFKA_SCHEMA)


def ingest_batch(spec: TableSpec, paths: TablePaths, topic: Topic, messages: list[Message], *,
                 batch_id: int = 0, writer: Writer | None = None, **options: Any) -> BatchResult:
    """Decode ``messages`` as the executors do and apply them as one micro-batch, committed by
    ``writer`` (default: the ``apply_engine`` fixture's); ``options`` go to the journey."""
    rows = kafka_rows(topic.name, messages)
    parts = BatchDecoder(DecoderSpec("json", key_columns=spec.primary_key, keep_before=False)).decode(rows)
    raw = {(topic.name, m.partition, m.offset): (m.key, m.value, None) for m in messages}
    return apply_parts(spec, paths, parts, batch_id=batch_id, run_id="test",
                       fetch_raw=lambda coords: {c: raw[c] for c in coords}, writer=writer or current_writer(),
                       **options)


def ingest_in_batches(spec: TableSpec, paths: TablePaths, topic: Topic, cuts: list[int]) -> list[BatchResult]:
    """Apply the topic's messages (in send order) in batches ending before each index of ``cuts``."""
    results, start = [], 0
    for batch_id, end in enumerate([*cuts, len(topic.messages)]):
        if end > start:
            results.append(ingest_batch(spec, paths, topic, topic.messages[start:end], batch_id=batch_id))
        start = end
    return results


def rows(paths: TablePaths, *, live_only: bool = True) -> dict[Any, dict[str, Any]]:
    """The table's rows by ``id`` (live ones only, unless asked)."""
    table = open_table(paths.table)
    if table is None:
        return {}
    out = {}
    for row in read_all(table).to_pylist():
        if live_only and row.get("_cdc_deleted"):
            continue
        out[row.get("id")] = row
    return out


def fold_feed(feed: pa.Table, key_columns: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """A table's live rows rebuilt from its change data feed alone (user columns, by key).

    ``feed`` is :func:`ingest.read.changes.changes`' result, ordered by version, key and change type: each
    key's last insert or update post-image stands, a delete removes it, and a soft-deleted row is
    not live.
    """
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for change in feed.to_pylist():
        key_of = tuple(change[k] for k in key_columns)
        if change["_change_type"] == "delete":
            rows.pop(key_of, None)
        elif change["_change_type"] in ("insert", "update_postimage"):
            rows[key_of] = change
    return {k: user_columns(r) for k, r in rows.items() if not r.get("_cdc_deleted")}


def live_by_key(table: Any, key_columns: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The Delta table's live rows (user columns, by key), to compare with :func:`fold_feed`."""
    return {tuple(r[k] for k in key_columns): user_columns(r) for r in read_all(table).to_pylist()
            if not r.get("_cdc_deleted")}


def history_problems(table: Any, key_columns: list[str]) -> list[str]:
    """What is wrong with a ``history_mode: scd2`` table's versions (empty: nothing).

    Per key: at most one current version, and it alone is open and not deleted; validity never runs
    backwards; a version ended by the next one ends when it starts, one ended by a delete or a
    truncate no later; delete markers are zero-length and deleted.
    """
    problems: list[str] = []
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in read_all(table).to_pylist():
        by_key[tuple(row[k] for k in key_columns)].append(row)
    for key_of, versions in by_key.items():
        markers = [v for v in versions if v["_cdc_op"] == "d"]
        if any(not m["_cdc_deleted"] or m["_cdc_is_current"] or m["_cdc_valid_from"] != m["_cdc_valid_to"]
               for m in markers):
            problems.append(f"{key_of}: a delete marker is not a closed zero-length row")
        rows = sorted((v for v in versions if v["_cdc_op"] != "d"),
                      key=lambda v: (v["_cdc_valid_from"], v["_cdc_position"]))
        if sum(v["_cdc_is_current"] for v in rows) > 1:
            problems.append(f"{key_of}: more than one current version")
        for v in rows:
            open_ = v["_cdc_valid_to"] is None and v["_cdc_end_op"] is None
            if v["_cdc_is_current"] != open_ or v["_cdc_is_current"] == v["_cdc_deleted"]:
                problems.append(f"{key_of}@{v['_cdc_position']}: current, open and deleted disagree")
            if v["_cdc_valid_to"] is not None and v["_cdc_valid_to"] < v["_cdc_valid_from"]:
                problems.append(f"{key_of}@{v['_cdc_position']}: valid_to before valid_from")
        for a, b in itertools.pairwise(rows):
            if a["_cdc_is_current"]:
                problems.append(f"{key_of}: a current version is followed by another")
            elif a["_cdc_end_op"] not in ("d", "t") and a["_cdc_valid_to"] != b["_cdc_valid_from"]:
                problems.append(f"{key_of}@{a['_cdc_position']}: not ended when the next version starts")
            elif a["_cdc_end_op"] in ("d", "t") and a["_cdc_valid_to"] > b["_cdc_valid_from"]:
                problems.append(f"{key_of}@{a['_cdc_position']}: ended after the next version starts")
    return problems


def versions_of_history(history: pa.Table, key_columns: list[str]) -> dict[tuple[Any, ...], list[tuple]]:
    """Each key's versions ``(row, valid_from, valid_to, end_op)`` from a source's changes in source order
    (the simulator's :attr:`~harness.simulator.truth.Truth.history`): a change that alters the
    row opens a version, one that does not leaves it; a delete ends it, a truncate ends them all."""
    current: dict[tuple[Any, ...], dict[str, Any]] = {}
    out: dict[tuple[Any, ...], list[tuple]] = defaultdict(list)

    def end(key_of: tuple[Any, ...], version: dict[str, Any], at: datetime, op: str) -> None:
        out[key_of].append((version["row"], version["from"], at, op))

    for change in history.to_pylist():
        op, at = change.pop("_op"), datetime.fromtimestamp(change.pop("_source_ts_ms") / 1000, UTC)
        if op == "t":
            for key_of, version in current.items():
                end(key_of, version, at, "t")
            current.clear()
            continue
        key_of = tuple(change[k] for k in key_columns)
        version = current.get(key_of)
        if op == "d":
            if version is not None:
                end(key_of, current.pop(key_of), at, "d")
        elif version is None or version["row"] != change:
            if version is not None:
                end(key_of, version, at, op)
            current[key_of] = {"row": change, "from": at}
    for key_of, version in current.items():
        out[key_of].append((version["row"], version["from"], None, None))
    return dict(out)


def stored_versions(table: Any, key_columns: list[str]) -> dict[tuple[Any, ...], list[tuple]]:
    """A scd2 table's versions as :func:`versions_of_history` gives them (delete markers left out)."""
    out: dict[tuple[Any, ...], list[tuple]] = defaultdict(list)
    rows = sorted((r for r in read_all(table).to_pylist() if r["_cdc_op"] != "d"),
                  key=lambda r: (r["_cdc_valid_from"], r["_cdc_position"]))
    for r in rows:
        out[tuple(r[k] for k in key_columns)].append(
            (user_columns(r), r["_cdc_valid_from"], r["_cdc_valid_to"], r["_cdc_end_op"]))
    return dict(out)


def user_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The row without the framework's columns and the change feed's."""
    return {k: v for k, v in row.items() if k not in FRAMEWORK_NAMES and k not in CHANGE_COLUMNS}


# -- Debezium messages (JsonConverter, schemaless unless a schema is given) -------------------------

def key(id_: Any, schema: dict[str, Any] | None = None) -> bytes:
    return _json({"id": id_}, schema)


def pg_source(lsn: int, committed: int | None, *, snapshot: str = "false", ts_ms: int = TS) -> dict[str, Any]:
    return {"connector": "postgresql", "name": "db", "db": "app", "schema": "public", "table": "t",
            "snapshot": snapshot, "ts_ms": ts_ms, "lsn": lsn,
            "sequence": json.dumps([None if committed is None else str(committed), str(lsn)])}


def pg(op: str, row: dict[str, Any] | None, *, lsn: int, committed: int | None = -1,
       before: dict[str, Any] | None = None, snapshot: str = "false", ts_ms: int = TS,
       schema: dict[str, Any] | None = None) -> bytes:
    """A PostgreSQL envelope; ``committed`` defaults to ``lsn - 1`` (a commit point before it)."""
    source = pg_source(lsn, lsn - 1 if committed == -1 else committed, snapshot=snapshot, ts_ms=ts_ms)
    after = None if op in ("d", "t") else row
    payload = {"op": op, "before": before if before is not None else (row if op == "d" else None),
               "after": after, "source": source, "ts_ms": ts_ms}
    return _json(payload, schema)


def envelope(op: str, row: dict[str, Any] | None, source: dict[str, Any], *, ts_ms: int = TS) -> bytes:
    """A full envelope with any connector's ``source`` block."""
    after = None if op in ("d", "t") else row
    return _json({"op": op, "before": row if op == "d" else None, "after": after, "source": source,
                  "ts_ms": ts_ms}, None)


def flat(row: dict[str, Any], *, op: str = "c", lsn: int | None = None, deleted: bool = False,
         ts_ms: int = TS) -> bytes:
    """An ``ExtractNewRecordState`` row with ``add.fields=op,lsn,source.ts_ms`` (no ``lsn``: not added)."""
    meta: dict[str, Any] = {"__op": op, "__deleted": "true" if deleted else "false", "__source_ts_ms": ts_ms}
    if lsn is not None:
        meta["__lsn"] = lsn
    return _json({**row, **meta}, None)


def _json(payload: Any, schema: dict[str, Any] | None) -> bytes:
    if schema is None:
        return json.dumps(payload).encode()
    return json.dumps({"schema": schema, "payload": payload}).encode()


def make_config(workdir: Path, *, batch: int = 400, table_batch: int | None = None,
                extra_tables: list[dict] | None = None, value_format: str = "avro", engine: str = "delta-rs",
                history_mode: str = "scd1", plan_on: str = "driver", suites: bool = True,
                spark_only: bool = False) -> IngestConfig:
    """The demo's configuration (``configs/demo.yaml``) written into ``workdir``, with the given batch
    size (and per table: ``table_batch``), value format, apply engine, history mode and
    ``target.plan_on`` for every table, plus ``extra_tables``; ``suites``: the tables keep their
    expectations suites; ``spark_only``: every run goes through Spark's queries
    (``source.driver_seconds: 0``), for a test whose subject they are."""
    raw = yaml.safe_load(Path("configs/demo.yaml").read_text())
    raw["workdir"] = str(workdir)
    for table in raw["tables"]:
        table["history_mode"] = history_mode
        if not suites:
            for key in ("expectations", "expectation_policies", "quality_policy"):
                table.pop(key, None)
    raw["target"]["writer"] = engine
    raw["target"]["plan_on"] = plan_on
    # The config is written elsewhere: keep its suites where demo.yaml points.
    raw["quality"]["expectations_dir"] = str(Path("expectations").resolve())
    raw["source"]["max_records_per_batch"] = batch
    raw["source"]["value_format"] = value_format
    if table_batch is not None:
        raw["source"]["max_records_per_table"] = table_batch
    if spark_only:
        raw["source"]["driver_seconds"] = 0
    raw["tables"] += extra_tables or []
    path = workdir / "config.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def ingest_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``ingest <args>`` as a user runs it, in a process of its own (this environment plus ``env``);
    its exit code and output, whatever they are."""
    return subprocess.run([sys.executable, "-m", "ingest.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})
