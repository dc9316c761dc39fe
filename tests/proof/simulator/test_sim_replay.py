"""The PostgreSQL ordering property: (lastCommittedLsn, lsn, phase) replays to the truth."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

TABLES = ("customers", "products", "orders")


@pytest.mark.parametrize("table", TABLES)
def test_replay_in_sequence_order_reproduces_the_truth(
    sim: SimpleNamespace, ref: SimpleNamespace, table: str
) -> None:
    events = sim.events(table)
    columns = sim.truth.tables[table].column_names
    expected = ref.truth_rows(sim.truth, table)
    assert ref.replay(events, columns) == expected
    # Delivery order (partitions, duplicates, skew) must not matter once sorted by position.
    shuffled = list(events)
    random.Random(3).shuffle(shuffled)
    assert ref.replay(shuffled, columns) == expected


def test_lsn_alone_is_not_an_order(sim: SimpleNamespace, ref: SimpleNamespace) -> None:
    # Interleaved transactions make lsn-only replay diverge somewhere: the reason the position
    # starts with the last committed LSN.
    wrong = [
        table
        for table in TABLES
        if ref.replay(sim.events(table), sim.truth.tables[table].column_names, order="lsn")
        != ref.truth_rows(sim.truth, table)
    ]
    assert wrong


def test_truth_values_have_decoder_types(sim_avro: SimpleNamespace) -> None:
    import datetime as dt
    from decimal import Decimal

    customer = sim_avro.truth.tables["customers"].to_pylist()[0]
    assert isinstance(customer["balance"], Decimal)
    assert isinstance(customer["created_at"], dt.datetime) and customer["created_at"].tzinfo is None
    assert isinstance(customer["updated_at"], dt.datetime) and customer[
        "updated_at"
    ].utcoffset() == dt.timedelta(0)
    weights = [
        r["weight_kg"] for r in sim_avro.truth.tables["products"].to_pylist() if r["weight_kg"] is not None
    ]
    assert weights and all(w.as_tuple().exponent == -18 for w in weights)
    orders = sim_avro.truth.tables["orders"].to_pylist()
    assert all(
        isinstance(o["quantity"], int) and o["amount"] == o["unit_price"] * o["quantity"] for o in orders
    )
