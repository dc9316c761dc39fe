"""The generated workload: determinism, counts, snapshot, truncate, schema change, faults."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from harness.simulator import WorkloadSpec, generate
from harness.simulator.encode import MALFORMED_KINDS

from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.errors import TopicLogError
from ingest.source.topiclog import TopicLog, partition_for_key

TABLES = ("customers", "products", "orders")
SMALL: dict[str, Any] = {"events": 600, "initial_customers": 40, "initial_products": 10, "initial_orders": 60}


def _log_contents(log: TopicLog) -> dict[tuple[str, int], list[dict[str, object]]]:
    return {
        (topic, p): log.read(topic, p, 0, end).to_pylist()
        for topic in log.topics()
        for p, end in log.end_offsets(topic).items()
    }


def test_same_seed_gives_identical_topics_and_truth(tmp_path: Path, ref: SimpleNamespace) -> None:
    a = ref.make_sim(tmp_path / "a", malformed_fraction=0.02, **SMALL)
    b = ref.make_sim(tmp_path / "b", malformed_fraction=0.02, **SMALL)
    c = ref.make_sim(tmp_path / "c", malformed_fraction=0.02, seed=8, **SMALL)
    assert _log_contents(a.log) == _log_contents(b.log)
    assert _log_contents(a.log) != _log_contents(c.log)
    for table in TABLES:
        assert a.truth.tables[table].equals(b.truth.tables[table])
    assert a.truth.counts == b.truth.counts
    assert (a.root / "truth" / "truth.json").read_bytes() == (b.root / "truth" / "truth.json").read_bytes()
    assert a.registry.subjects() == b.registry.subjects()


def test_counts_add_up(sim: SimpleNamespace, ref: SimpleNamespace) -> None:
    total_changes = 0
    for table in TABLES:
        counts = sim.truth.counts[table]
        records = sim.records(table)
        expected_records = sum(
            counts[k]
            for k in (
                "reads",
                "creates",
                "updates",
                "deletes",
                "truncates",
                "tombstones",
                "duplicates",
                "malformed",
            )
        )
        assert counts["records"] == expected_records == len(records)
        events = ref.unique(sim.events(table))
        ops = Counter(e.op for e in events if e.kind == "change")
        assert ops == Counter(
            {
                op: counts[name]
                for op, name in (
                    ("r", "reads"),
                    ("c", "creates"),
                    ("u", "updates"),
                    ("d", "deletes"),
                    ("t", "truncates"),
                )
                if counts[name]
            }
        )
        assert sum(e.kind == "tombstone" for e in events) == counts["tombstones"] == counts["deletes"]
        total_changes += sim.truth.changes(table)
    # Transactions are cut to the budget, so the change events add up exactly.
    assert total_changes == sim.spec.events


def test_snapshot_flags_and_position(sim: SimpleNamespace, ref: SimpleNamespace) -> None:
    reads = [e for t in TABLES for e in ref.unique(sim.events(t)) if e.kind == "change" and e.op == "r"]
    flags = Counter(e.source["snapshot"] for e in reads)
    assert flags["first"] == 1 and flags["last"] == 1
    assert flags["true"] == len(reads) - 2
    first = next(e for e in reads if e.source["snapshot"] == "first")
    last = next(e for e in reads if e.source["snapshot"] == "last")
    assert (first.table, first.key) == ("customers", (1,))
    assert last.table == "orders" and last.key == max(e.key for e in reads if e.table == "orders")
    lsns = {e.source["lsn"] for e in reads}
    assert len(lsns) == 1
    (lsn,) = lsns
    assert {e.source["sequence"] for e in reads} == {f'[null,"{lsn}"]'}
    assert len({e.source["txId"] for e in reads}) == 1
    streamed = [e for t in TABLES for e in sim.events(t) if e.kind == "change" and e.op != "r"]
    assert {e.source["snapshot"] for e in streamed} == {"false"}
    assert min(e.position for e in streamed) > max(e.position for e in reads)


def test_source_block_is_postgres_shaped(sim: SimpleNamespace, ref: SimpleNamespace) -> None:
    event = next(e for e in sim.events("orders") if e.kind == "change" and e.op == "u")
    source = event.source
    assert source["connector"] == "postgresql" and source["name"] == "demo"
    assert source["schema"] == "public" and source["table"] == "orders" and source["db"] == "shop"
    assert source["xmin"] is None and isinstance(source["txId"], int)
    last, lsn = json.loads(source["sequence"])
    assert lsn == str(source["lsn"]) and int(last) < source["lsn"] + 10**9


def test_lsns_increase_within_a_transaction_and_transactions_interleave(
    sim: SimpleNamespace, ref: SimpleNamespace
) -> None:
    streamed = [e for t in TABLES for e in ref.unique(sim.events(t)) if e.kind == "change" and e.op != "r"]
    by_txn: dict[int, list[tuple[int, int]]] = {}
    for e in streamed:
        by_txn.setdefault(e.source["txId"], []).append(e.position[:2])
    for positions in by_txn.values():
        assert len({p[0] for p in positions}) == 1  # one lastCommittedLsn per transaction
        assert len({p[1] for p in positions}) == len(positions)
    # Transactions in commit order (lastCommittedLsn), checking that some committed later but
    # wrote earlier: their smallest lsn is below the largest lsn of a transaction before them.
    txns = sorted(by_txn.values(), key=lambda ps: ps[0][0])
    interleaved = sum(
        min(p[1] for p in later) < max(p[1] for p in earlier) for earlier, later in itertools.pairwise(txns)
    )
    assert interleaved >= 5
    commit_points = [ps[0][0] for ps in txns]
    assert commit_points == sorted(set(commit_points))


def test_one_truncate_then_new_orders(sim: SimpleNamespace, ref: SimpleNamespace) -> None:
    events = ref.unique(sim.events("orders"))
    truncates = [e for e in events if e.kind == "change" and e.op == "t"]
    assert len(truncates) == 1
    (t,) = truncates
    assert t.rec.key is None and t.rec.partition == 0 and t.before is None and t.after is None
    creates_after = [e for e in events if e.kind == "change" and e.op == "c" and e.position > t.position]
    assert creates_after
    created_after = {e.key for e in creates_after}
    live = ref.truth_rows(sim.truth, "orders")
    assert live and set(live) <= created_after  # every surviving order was made after the truncate


def test_added_column_registers_a_new_schema(sim_avro: SimpleNamespace, ref: SimpleNamespace) -> None:
    subjects = sim_avro.registry.subjects()
    customer_ids = subjects["demo.public.customers-value"]
    assert len(customer_ids) == 2
    assert len(subjects["demo.public.orders-value"]) == 1 and len(subjects["demo.public.products-value"]) == 1
    old_id, new_id = customer_ids
    old_fields = [f["name"] for f in sim_avro.registry.get_schema(old_id)["fields"][0]["type"][1]["fields"]]
    new_fields = [f["name"] for f in sim_avro.registry.get_schema(new_id)["fields"][0]["type"][1]["fields"]]
    assert new_fields == [*old_fields, "loyalty_tier"]
    events = [e for e in sim_avro.events("customers") if e.kind == "change"]
    old = [e.position for e in events if e.schema_id == old_id]
    new = [e for e in events if e.schema_id == new_id]
    assert new and max(old) < min(e.position for e in new)
    tiers = sim_avro.truth.tables["customers"].column("loyalty_tier").to_pylist()
    assert None in tiers and any(t is not None for t in tiers)


def test_added_column_in_json_schema(sim_json: SimpleNamespace) -> None:
    def value_fields(rec: object) -> list[str]:
        doc = json.loads(rec.value)  # type: ignore[attr-defined]
        return [f["field"] for f in doc["schema"]["fields"][1]["fields"]]

    records = [r for r in sim_json.records("customers") if r.value is not None]
    with_tier = [r for r in records if b'"loyalty_tier"' in r.value]
    assert with_tier and len(with_tier) < len(records)
    assert value_fields(with_tier[0])[-1] == "loyalty_tier"


def test_without_schema_change_and_truncate(tmp_path: Path, ref: SimpleNamespace) -> None:
    s = ref.make_sim(tmp_path, add_column=False, truncate=False, **SMALL)
    assert len(s.registry.subjects()["demo.public.customers-value"]) == 1
    assert "loyalty_tier" not in s.truth.tables["customers"].column_names
    assert s.truth.counts["orders"]["truncates"] == 0


def test_redeliveries_are_exact_copies_later_in_the_same_partition(sim: SimpleNamespace) -> None:
    for table in TABLES:
        seen: dict[tuple[int, bytes | None, bytes | None], int] = {}
        copies = 0
        for rec in sorted(sim.records(table), key=lambda r: (r.partition, r.offset)):
            marker = (rec.partition, rec.key, rec.value)
            if marker in seen:
                copies += 1
                assert rec.offset > seen[marker]
            else:
                seen[marker] = rec.offset
        assert copies == sim.truth.counts[table]["duplicates"] > 0


def test_keys_decide_partitions(sim: SimpleNamespace) -> None:
    for table in TABLES:
        for rec in sim.records(table):
            expected = 0 if rec.key is None else partition_for_key(rec.key, sim.spec.partitions)
            assert rec.partition == expected


def test_malformed_messages_are_counted_per_topic(sim: SimpleNamespace) -> None:
    kinds = MALFORMED_KINDS[sim.spec.value_format]
    for table in TABLES:
        counts = sim.truth.counts[table]
        found = [e for e in sim.events(table) if e.kind == "malformed"]
        assert len(found) == counts["malformed"] == sum(counts[f"malformed_{k}"] for k in kinds)
        real = sim.truth.changes(table) - counts["truncates"]
        assert abs(counts["malformed"] - sim.spec.malformed_fraction * real) <= 1
    assert all(sum(sim.truth.counts[t][f"malformed_{k}"] for t in TABLES) > 0 for k in kinds)


def test_no_malformed_messages_by_default(tmp_path: Path, ref: SimpleNamespace) -> None:
    s = ref.make_sim(tmp_path, **SMALL)
    for table in TABLES:
        assert s.truth.counts[table]["malformed"] == 0
        assert not [e for e in s.events(table) if e.kind == "malformed"]


def test_toast_placeholder_only_when_notes_unchanged(sim: SimpleNamespace, ref: SimpleNamespace) -> None:
    events = ref.unique(sim.events("customers"))
    placeholders = [
        e for e in events if e.kind == "change" and e.after and e.after.get("notes") == ref.PLACEHOLDER
    ]
    assert len(placeholders) == sim.truth.counts["customers"]["toast_placeholders"] > 0
    assert all(e.op == "u" for e in placeholders)
    for e in placeholders:
        # REPLICA IDENTITY FULL: the old row carries the real (large) notes; it did not change.
        assert e.before is not None and len(e.before["notes"]) >= 2000
    changed = [
        e
        for e in events
        if e.kind == "change"
        and e.op == "u"
        and e.before["notes"] != e.after["notes"]
        and e.after["notes"] != ref.PLACEHOLDER
    ]
    assert changed  # real note changes arrive with their value


def test_progress_reports_the_total(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    generate(
        WorkloadSpec(**SMALL),
        TopicLog(tmp_path / "log"),
        EmbeddedSchemaRegistry(tmp_path / "reg"),
        tmp_path / "truth",
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls[-1] == (600, 600)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_refuses_a_log_that_already_has_records(tmp_path: Path) -> None:
    log, reg = TopicLog(tmp_path / "log"), EmbeddedSchemaRegistry(tmp_path / "reg")
    generate(WorkloadSpec(**SMALL), log, reg, tmp_path / "truth")
    with pytest.raises(TopicLogError, match="already holds records"):
        generate(WorkloadSpec(**SMALL), log, reg, tmp_path / "truth2")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("duplicate_fraction", 1.5),
        ("malformed_fraction", -0.1),
        ("partitions", 0),
        ("events", -1),
        ("value_format", "protobuf"),
    ],
)
def test_spec_validation_names_the_field(tmp_path: Path, field: str, value: object) -> None:
    spec = WorkloadSpec(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=field):
        generate(spec, TopicLog(tmp_path / "log"), EmbeddedSchemaRegistry(tmp_path / "reg"), tmp_path / "t")
