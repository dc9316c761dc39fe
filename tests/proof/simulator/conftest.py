"""Shared fixtures for the simulator tests: small generated workloads and a reference reader.

The reference reader decodes the topics with nothing but fastavro/json and the registry, so the
tests check the simulator's bytes independently of the engine's decoder. It is deliberately
strict: anything that is not a well-formed Debezium change, a tombstone or a truncate counts
as malformed.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastavro
import pytest
from harness.simulator import Truth, WorkloadSpec, generate
from harness.simulator.model import LOYALTY_TIER, default_tables, ledger_table

from ingest.decode.registry import EmbeddedSchemaRegistry, unframe
from ingest.source.topiclog import TopicLog

PLACEHOLDER = "__debezium_unavailable_value"
_EPOCH = dt.datetime(1970, 1, 1)
_Q18 = Decimal(1).scaleb(-18)
_TABLES = {**default_tables(), **{t.name: t for t in map(ledger_table, range(1, 5))}}
_COLUMNS = {name: {c.name: c for c in (*t.columns, LOYALTY_TIER)} for name, t in _TABLES.items()}


@dataclass
class Rec:
    """One record as it sits in the log."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass
class Event:
    """A record as the reference reader understands it."""

    rec: Rec
    table: str
    kind: str  # "change" | "tombstone" | "malformed"
    reason: str = ""
    op: str | None = None
    key: tuple[Any, ...] | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    schema_id: int | None = None

    @property
    def position(self) -> tuple[int, int, int]:
        assert self.source is not None
        last, lsn = json.loads(self.source["sequence"])
        phase = 0 if self.op == "r" else 1
        return (int(last) if last is not None else 0, int(lsn), phase)


@dataclass
class Sim:
    """A generated workload on disk."""

    spec: WorkloadSpec
    root: Path
    log: TopicLog
    registry: EmbeddedSchemaRegistry
    truth: Truth

    def records(self, table: str) -> list[Rec]:
        topic = self.truth.topics[table]
        out = []
        for p, end in self.log.end_offsets(topic).items():
            rows = self.log.read(topic, p, 0, end).to_pylist()
            for r in rows:
                out.append(
                    Rec(topic, p, r["offset"], r["key"], r["value"], int(r["timestamp"].timestamp() * 1000))
                )
        return out

    def events(self, table: str) -> list[Event]:
        return [decode(self.spec.value_format, self.registry, table, r) for r in self.records(table)]


def make_sim(root: Path, **overrides: Any) -> Sim:
    spec = WorkloadSpec(
        **{
            "events": 2500,
            "initial_customers": 120,
            "initial_products": 30,
            "initial_orders": 200,
            "duplicate_fraction": 0.05,
            "reorder_fraction": 0.3,
            "toast_fraction": 0.6,
            **overrides,
        }
    )
    log = TopicLog(root / "log")
    registry = EmbeddedSchemaRegistry(root / "registry")
    truth = generate(spec, log, registry, root / "truth")
    return Sim(spec, root, log, registry, truth)


@pytest.fixture(scope="session")
def sim_avro(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    return make_sim(tmp_path_factory.mktemp("sim-avro"), malformed_fraction=0.02)


@pytest.fixture(scope="session")
def sim_json(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    return make_sim(tmp_path_factory.mktemp("sim-json"), value_format="json", malformed_fraction=0.02)


@pytest.fixture(scope="session", params=["avro", "json"])
def sim(request: pytest.FixtureRequest) -> Sim:
    return request.getfixturevalue(f"sim_{request.param}")


# -- reference decoding ---------------------------------------------------------------------------
_PARSED: dict[tuple[str, int], Any] = {}


def _avro_read(registry: EmbeddedSchemaRegistry, message: bytes) -> tuple[int, Any]:
    schema_id, payload = unframe(message)
    cache_key = (str(registry.root), schema_id)
    if cache_key not in _PARSED:
        _PARSED[cache_key] = fastavro.parse_schema(registry.get_schema(schema_id))
    return schema_id, fastavro.schemaless_reader(io.BytesIO(bytes(payload)), _PARSED[cache_key], None)


def _unscaled(raw: bytes) -> int:
    return int.from_bytes(raw, "big", signed=True)


def to_source_value(table: str, column: str, value: Any, value_format: str) -> Any:
    """A decoded datum back in the simulator's (and the truth's) Python types."""
    if value is None or value == PLACEHOLDER:
        return value
    col = _COLUMNS[table][column]
    kind = col.kind
    if kind == "date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=value)
    if kind == "micro_timestamp":
        return _EPOCH + dt.timedelta(microseconds=value)
    if kind == "zoned_timestamp":
        parsed = dt.datetime.fromisoformat(value)
        assert parsed.tzinfo is not None, value
        return parsed.astimezone(dt.UTC)
    if kind == "variable_decimal":
        raw = value["value"] if value_format == "avro" else base64.b64decode(value["value"])
        return Decimal(_unscaled(raw)).scaleb(-value["scale"]).quantize(_Q18)
    if kind == "decimal" and value_format == "json":
        return Decimal(_unscaled(base64.b64decode(value))).scaleb(-(col.scale or 0))
    return value


def _image(table: str, image: dict[str, Any] | None, value_format: str) -> dict[str, Any] | None:
    if image is None:
        return None
    return {k: to_source_value(table, k, v, value_format) for k, v in image.items()}


def decode(value_format: str, registry: EmbeddedSchemaRegistry, table: str, rec: Rec) -> Event:
    """Classify and decode one record, strictly."""
    try:
        if rec.value is None:
            if rec.key is None:
                return Event(rec, table, "malformed", "null key and value")
            return Event(rec, table, "tombstone")
        schema_id = None
        if value_format == "avro":
            schema_id, envelope = _avro_read(registry, rec.value)
            key = _avro_read(registry, rec.key)[1] if rec.key is not None else None
        else:
            envelope = json.loads(rec.value)["payload"]
            key = json.loads(rec.key)["payload"] if rec.key is not None else None
    except Exception as exc:  # every failure is a reason to quarantine, not a test error
        return Event(rec, table, "malformed", f"{type(exc).__name__}: {exc}")
    op = envelope.get("op")
    if op not in ("r", "c", "u", "d", "t"):
        return Event(rec, table, "malformed", f"unknown op {op!r}")
    if op != "t" and (key is None or any(v is None for v in key.values())):
        return Event(rec, table, "malformed", "null primary key")
    return Event(
        rec,
        table,
        "change",
        op=op,
        key=tuple(key.values()) if key is not None else None,
        before=_image(table, envelope.get("before"), value_format),
        after=_image(table, envelope.get("after"), value_format),
        source=envelope["source"],
        schema_id=schema_id,
    )


def unique(events: list[Event]) -> list[Event]:
    """Drop exact redeliveries (same partition, key and value bytes)."""
    seen: set[tuple[int, bytes | None, bytes | None]] = set()
    out = []
    for e in events:
        marker = (e.rec.partition, e.rec.key, e.rec.value)
        if marker not in seen:
            seen.add(marker)
            out.append(e)
    return out


def replay(
    events: list[Event], columns: list[str], *, order: str = "sequence"
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Apply every change of one table in position order; the TOAST placeholder keeps the old value."""
    changes = [e for e in events if e.kind == "change"]
    if order == "sequence":
        changes.sort(key=lambda e: e.position)
    else:  # lsn alone, the order the design warns against
        changes.sort(key=lambda e: (e.position[1], e.position[2]))
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in changes:
        if e.op == "t":
            state.clear()
        elif e.op == "d":
            assert e.key is not None
            state.pop(e.key, None)
        else:
            assert e.key is not None and e.after is not None
            row = {c: e.after.get(c) for c in columns}
            for c, v in row.items():
                if v == PLACEHOLDER:
                    row[c] = state[e.key][c] if e.key in state else PLACEHOLDER
            state[e.key] = row
    return state


def truth_rows(truth: Truth, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    keys = truth.key_columns[table]
    return {tuple(r[k] for k in keys): r for r in truth.tables[table].to_pylist()}


@pytest.fixture(scope="session")
def ref() -> SimpleNamespace:
    """The reference reader's helpers (a fixture, so tests need no import path tricks)."""
    return SimpleNamespace(
        PLACEHOLDER=PLACEHOLDER,
        Rec=Rec,
        decode=decode,
        unique=unique,
        replay=replay,
        truth_rows=truth_rows,
        make_sim=make_sim,
        to_source_value=to_source_value,
    )
