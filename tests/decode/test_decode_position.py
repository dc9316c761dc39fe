"""Source positions: PostgreSQL commit order, MySQL binlog order, snapshot before streaming."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.decode import MessageDecoder
from ingest.model import ChangeEvent, KafkaCoordinates, SourcePosition

from .fixtures import COORDS, envelope, json_message, mysql_source, pg_source


def position(source: dict[str, Any], op: str = "u", coords: KafkaCoordinates = COORDS) -> SourcePosition:
    value = json_message(envelope(op, before=None, after={"id": 1}, source=source))
    event = MessageDecoder(value_format="json", registry=None, key_columns=("id",)).decode(
        None, value, coords
    )
    assert isinstance(event, ChangeEvent)
    return event.position


def test_pg_later_transaction_with_lower_lsn_orders_after() -> None:
    # A long transaction wrote at LSN 900 but committed after one whose changes sit at LSN 500.
    earlier_commit = position(pg_source(lsn=900, committed=400))
    later_commit = position(pg_source(lsn=500, committed=1000))
    assert later_commit > earlier_commit
    assert later_commit.encode() > earlier_commit.encode()


def test_pg_same_transaction_orders_by_lsn() -> None:
    assert position(pg_source(lsn=510, committed=400)) > position(pg_source(lsn=505, committed=400))


def test_snapshot_read_orders_before_streamed_change_at_same_point() -> None:
    read = position(pg_source(lsn=700, committed=600, snapshot="true"), op="r")
    update = position(pg_source(lsn=700, committed=600), op="u")
    assert (read.phase, update.phase) == (0, 1)
    assert read < update
    assert read.encode() < update.encode()


def test_pg_lsn_taken_from_sequence_when_missing() -> None:
    source = pg_source(lsn=None, committed=10)
    source["sequence"] = '["10","77"]'
    assert position(source) == SourcePosition(10, 77, 0, 1)


def test_pg_sequence_with_nulls() -> None:
    source = pg_source(lsn=88, committed=None)
    assert source["sequence"] == '[null,"88"]'
    # No commit point (the first change after a start, or a snapshot read): its own LSN orders it.
    assert position(source) == SourcePosition(88, 88, 0, 1)


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        (
            mysql_source(file="mysql-bin.000003", pos=900, row=0),
            mysql_source(file="mysql-bin.000004", pos=4, row=0),
        ),
        (
            mysql_source(file="mysql-bin.000003", pos=154, row=0),
            mysql_source(file="mysql-bin.000003", pos=805, row=0),
        ),
        (
            mysql_source(file="mysql-bin.000003", pos=154, row=0),
            mysql_source(file="mysql-bin.000003", pos=154, row=1),
        ),
    ],
)
def test_mysql_binlog_order(earlier: dict[str, Any], later: dict[str, Any]) -> None:
    assert position(earlier) < position(later)


def test_mysql_position_components() -> None:
    assert position(mysql_source(file="mysql-bin.000003", pos=154, row=2)) == SourcePosition(3, 154, 2, 1)
    assert position(
        mysql_source(file="mysql-bin.000003", pos=154, row=2, snapshot="true"), op="r"
    ) == SourcePosition(3, 154, 2, 0)


def test_kafka_fallback_for_unknown_source() -> None:
    coords = KafkaCoordinates(topic="t", partition=5, offset=123)
    assert position({"connector": "spanner", "ts_ms": 5}, coords=coords) == SourcePosition.kafka(5, 123)
    assert position({}, op="r", coords=coords) == SourcePosition(5, 123, 0, 1, True)


def test_encoded_position_round_trips() -> None:
    pos = position(pg_source(lsn=2**40 + 3, committed=2**40))
    assert SourcePosition.decode(pos.encode()) == pos
