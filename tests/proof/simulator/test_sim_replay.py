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


@pytest.mark.parametrize("value_format", ["avro", "json"])
def test_extra_tables_get_their_share_and_replay_to_the_truth(
        tmp_path_factory: pytest.TempPathFactory, ref: SimpleNamespace, value_format: str) -> None:
    sim = ref.make_sim(tmp_path_factory.mktemp(f"extra-{value_format}"), value_format=value_format, events=3000,
                       extra_tables=4, initial_extra_rows=15)
    ledgers = [f"ledger_{n:03d}" for n in range(1, 5)]
    assert sorted(sim.truth.topics) == sorted([*TABLES, *ledgers])
    streamed = {t: sum(sim.truth.counts[t][k] for k in ("creates", "updates", "deletes")) for t in sim.truth.topics}
    shop, extra = sum(streamed[t] for t in TABLES), sum(streamed[t] for t in ledgers)
    assert 0.7 < extra / shop < 1.4, streamed  # the extras together weigh about as much as the shop
    for table in ledgers:
        assert sim.truth.counts[table]["reads"] == 15 and sim.truth.counts[table]["deletes"] > 0, table
        events = sim.events(table)
        shuffled = list(events)
        random.Random(5).shuffle(shuffled)
        assert ref.replay(shuffled, sim.truth.tables[table].column_names) == ref.truth_rows(sim.truth, table)
    # Odd ledgers use REPLICA IDENTITY DEFAULT: updates without a before image.
    assert all(e.before is None for e in sim.events("ledger_001") if e.kind == "change" and e.op == "u")
    assert any(e.before is not None for e in sim.events("ledger_002") if e.kind == "change" and e.op == "u")
