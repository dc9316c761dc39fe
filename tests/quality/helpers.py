"""Builders for the quality tests: suites on disk, configs, and real Debezium JSON messages.

Replay re-decodes raw bytes, so those tests need messages the decoder really reads: they are made
with the simulator's JsonConverter encoder for a small ``accounts`` table.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from harness.simulator.encode import DEBEZIUM_VERSION, Envelope, JsonChangeEncoder
from harness.simulator.model import Column, TableDef

from ingest.apply.journey import apply_parts
from ingest.config import IngestConfig, load_config
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.quality import QualityGate
from ingest.records import quarantine
from ingest.records.audit import AuditRecord
from tests.harness import current_writer

ACCOUNTS = TableDef(
    "accounts",
    (Column("id", "int32"), Column("email", "string"), Column("qty", "int32"),
     Column("status", "string", nullable=True)),
    ("id",),
    "full",
)
TOPIC = "shop.public.accounts"
KAFKA_SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("value", pa.binary())])

#: A suite for ``accounts`` (GX format): e-mail format, quantity range, allowed statuses, unique ids.
ACCOUNTS_SUITE = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
    {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "email", "regex": "^[^@ ]+@[^@ ]+$"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "qty", "min_value": 0, "max_value": 100}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "status", "value_set": ["ok", "vip"]}},
]


def write_suite(directory: Path, name: str, expectations: list[dict[str, Any]]) -> Path:
    """A suite file in GX's own format."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    doc = {"name": name, "expectations": [{"meta": {}, **e} for e in expectations],
           "meta": {"great_expectations_version": "1.24.1"}, "notes": None}
    path.write_text(json.dumps(doc, indent=1))
    return path


def make_config(workdir: Path, *, tables: list[dict[str, Any]], value_format: str = "json") -> IngestConfig:
    """A config in ``workdir`` with suites in ``workdir/expectations``."""
    workdir.mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {"workdir": ".", "source": {"value_format": value_format},
                           "quality": {"expectations_dir": "expectations"}, "tables": tables}
    engine = current_writer()
    if engine is not None:  # the apply_engine fixture's engine commits the config's tables (replays too)
        raw["target"] = {"engine": engine.name}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


class Accounts:
    """Debezium JSON change messages of ``accounts`` on partition 0, offsets counting up.

    Positions are PostgreSQL-like: ``sequence = [lsn, lsn]``; ``at`` picks the LSN (so a message can
    be older than one sent before it), default: one more than the last.
    """

    def __init__(self) -> None:
        self.encoder = JsonChangeEncoder("shop")
        self.offset = 0
        self.lsn = 1000

    def message(self, op: str, key: int, *, email: str = "a@x.io", qty: int = 1, status: str | None = "ok",
                at: int | None = None) -> dict[str, Any]:
        lsn = at if at is not None else self.lsn + 8
        self.lsn = max(self.lsn, lsn)
        row = {"id": key, "email": email, "qty": qty, "status": status}
        ts_us = 1_717_400_000_000_000 + lsn
        source = {"version": DEBEZIUM_VERSION, "connector": "postgresql", "name": "shop", "ts_ms": ts_us // 1000,
                  "snapshot": "false", "db": "shop", "sequence": f'["{lsn}","{lsn}"]', "ts_us": ts_us,
                  "ts_ns": ts_us * 1000, "schema": "public", "table": "accounts", "txId": lsn, "lsn": lsn,
                  "xmin": None}
        envelope = Envelope(op, row if op in ("u", "d") else None, None if op == "d" else row, source, ts_us + 5)
        out = {"topic": TOPIC, "partition": 0, "offset": self.offset, "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
               "key": self.encoder.key(ACCOUNTS, (key,)), "value": self.encoder.value(ACCOUNTS, envelope)}
        self.offset += 1
        return out

    def garbage(self) -> dict[str, Any]:
        """A message that does not decode."""
        out = {"topic": TOPIC, "partition": 0, "offset": self.offset, "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
               "key": b"{not json", "value": b"{not json"}
        self.offset += 1
        return out


def decoded(messages: list[dict[str, Any]]) -> list[pa.RecordBatch]:
    """The messages through the stream's own decode step."""
    return BatchDecoder(DecoderSpec("json", keep_before=False)).decode(
        pa.Table.from_pylist(messages, schema=KAFKA_SCHEMA))


def raw_of(messages: list[dict[str, Any]]) -> Any:
    """A ``fetch_raw`` that finds the messages' raw bytes again, as the engine does in the source."""
    raw = {(m["topic"], m["partition"], m["offset"]): (m["key"], m["value"], m["timestamp"]) for m in messages}
    return lambda coords: {c: raw[c] for c in coords}


def accounts_paths(config: IngestConfig) -> TablePaths:
    return TablePaths.of(config, "accounts")


def ingest(config: IngestConfig, messages: list[dict[str, Any]], batch_id: int) -> AuditRecord | None:
    """One stream batch of ``accounts`` through process_batch with the table's gate."""
    spec = config.table("accounts")
    return apply_parts(spec, accounts_paths(config), decoded(messages), batch_id=batch_id, run_id="stream",
                       gate=QualityGate.for_table(config, spec), fetch_raw=raw_of(messages),
                       writer=current_writer()).record


def live(config: IngestConfig) -> dict[int, dict[str, Any]]:
    table = open_table(accounts_paths(config).table)
    return {r["id"]: r for r in read_all(table).to_pylist()} if table is not None else {}


def pending(config: IngestConfig) -> list[dict[str, Any]]:
    return quarantine.read(accounts_paths(config).quarantine, pending=True).to_pylist()
