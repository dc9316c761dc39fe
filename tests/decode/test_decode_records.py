"""Flattened rows (ExtractNewRecordState) and records that carry no row change."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.errors import DecodeError
from ingest.model import ControlRecord, SourcePosition

from .fixtures import (
    COORDS,
    ORDER_FIELDS,
    cfield,
    json_change,
    json_decoder,
    json_key,
    json_message,
    mysql_source,
    pg_source,
)

# --- flattened (ExtractNewRecordState) -----------------------------------------------------------

FLAT_FIELDS = [
    *ORDER_FIELDS[:2],
    cfield("__op", "string"),
    cfield("__lsn", "int64"),
    cfield("__source_ts_ms", "int64"),
    cfield("__table", "string"),
    cfield("__deleted", "string"),
]
FLAT_SCHEMA = {"type": "struct", "fields": FLAT_FIELDS, "optional": False, "name": "shop.public.orders.Value"}


@pytest.mark.parametrize(
    ("meta", "op", "is_delete"),
    [
        ({"__op": "c", "__deleted": "false"}, "c", False),
        ({"__op": "u", "__deleted": "false"}, "u", False),
        ({"__op": "r", "__deleted": "false"}, "r", False),
        ({"__op": "d", "__deleted": "true"}, "d", True),
        ({"__op": None, "__deleted": "true"}, "d", True),
        ({"__op": None, "__deleted": None}, "u", False),
    ],
)
@pytest.mark.parametrize("with_schema", [True, False])
def test_flattened(meta: dict[str, Any], op: str, is_delete: bool, with_schema: bool) -> None:
    row = {
        "id": 3,
        "customer": "Di",
        **meta,
        "__lsn": 777,
        "__source_ts_ms": 1_700_000_000_001,
        "__table": "orders",
    }
    event = json_change(json_message(row, FLAT_SCHEMA if with_schema else None), json_key(3))
    assert event.op == op
    assert event.key == {"id": 3}
    image = {"id": 3, "customer": "Di"}
    assert (event.before, event.after) == ((image, None) if is_delete else (None, image))
    assert event.position == SourcePosition(777, 777, 0, 0 if op == "r" else 1)
    assert event.flattened
    assert event.source_ts_ms == 1_700_000_000_001
    assert [c.name for c in event.columns] == ["id", "customer"]


def test_flattened_without_position_fields_uses_kafka_position() -> None:
    event = json_change(json_message({"id": 3, "__table": "orders"}), json_key(3))
    assert event.op == "u"
    assert event.position == SourcePosition.kafka(COORDS.partition, COORDS.offset)


def test_flattened_mysql_fields_give_binlog_position() -> None:
    row = {"id": 3, "__op": "c", "__file": "binlog.000007", "__pos": 99, "__row": 2}
    assert json_change(json_message(row), json_key(3)).position == SourcePosition(7, 99, 2, 1)


def test_flattened_unknown_op() -> None:
    with pytest.raises(DecodeError, match=r"^envelope: unknown op 'z' in '__op'$"):
        json_decoder().decode(json_key(3), json_message({"id": 3, "__op": "z"}), COORDS)


# --- control records -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ControlRecord("tombstone", key={"id": 3}, key_columns=("id",))),
        (json_message(None, wrap=True), ControlRecord("tombstone", key={"id": 3}, key_columns=("id",))),
        (json_message({"ts_ms": 1_700_000_000_000}), ControlRecord("heartbeat", "ts_ms=1700000000000")),
        (
            json_message(
                {"ts_ms": 5},
                {
                    "type": "struct",
                    "name": "io.debezium.connector.common.Heartbeat",
                    "fields": [cfield("ts_ms", "int64", optional=False)],
                },
            ),
            ControlRecord("heartbeat", "ts_ms=5"),
        ),
        (
            json_message(
                {
                    "status": "BEGIN",
                    "id": "901:3355",
                    "ts_ms": 1,
                    "event_count": None,
                    "data_collections": None,
                }
            ),
            ControlRecord("transaction", "BEGIN 901:3355"),
        ),
        (
            json_message(
                {
                    "status": "END",
                    "id": "901:3355",
                    "ts_ms": 2,
                    "event_count": 2,
                    "data_collections": [{"data_collection": "public.orders", "event_count": 2}],
                }
            ),
            ControlRecord("transaction", "END 901:3355"),
        ),
        (
            json_message(
                {
                    "source": mysql_source(),
                    "databaseName": "shop",
                    "schemaName": None,
                    "ddl": "ALTER TABLE stock ADD COLUMN bin INT",
                    "tableChanges": [],
                }
            ),
            ControlRecord("schema_change", "ALTER TABLE stock ADD COLUMN bin INT"),
        ),
        (
            json_message(
                {
                    "op": "m",
                    "ts_ms": 3,
                    "source": pg_source(lsn=9, committed=8),
                    "message": {"prefix": "audit", "content": "aGk="},
                }
            ),
            ControlRecord("message", "audit"),
        ),
    ],
)
def test_control_records(value: bytes | None, expected: ControlRecord) -> None:
    assert json_decoder().decode(json_key(3), value, COORDS) == expected


def test_flattened_source_ts_falls_back_to_envelope_ts() -> None:
    row = {"id": 3, "__op": "u", "__source_ts_ms": None, "__ts_ms": 1_700_000_000_777}
    assert json_change(json_message(row), json_key(3)).source_ts_ms == 1_700_000_000_777
