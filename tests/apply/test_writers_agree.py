"""Both writers leave the same tables after the same batches.

The per-key rules (ordering, deletes and their memory, truncates, TOAST and null fill, primary-key
moves, history versions) are code both writers share: they plan each batch (:mod:`ingest.rules`),
and its MERGE is one SQL text (:mod:`ingest.commit.merge_sql`). What differs is who runs it:
DataFusion in delta-rs, Spark in delta-spark (which reads the stored rows on the executors here),
each with its own commit and change data feed.

So one seeded story holding every edge those rules know goes through both writers, for every table
shape, cut into the same batches, its last batch replayed; after each batch the two writers' tables,
remembered deletes and moved rows, and at the end their change data feeds, must be equal row by row.
That is what lets a test of one rule (marked ``one_writer``) run on delta-rs alone; a test of what a
writer does itself (schema changes, commit state, deletion vectors) still runs on both.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.delta_spark import DeltaSparkWriter
from ingest.commit.writer import Writer
from ingest.config import IngestConfig, load_config
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.read.changes import ChangeRange, changes
from tests.apply.test_moves import PLACEHOLDER, move
from tests.harness import TS, Message, Topic, ingest_batch, key, pg

pytestmark = pytest.mark.spark

#: Every table shape the rules plan differently: delete modes, null fill, history with all or some
#: columns tracked.
SHAPES: dict[str, dict[str, Any]] = {
    "hard": {}, "soft": {"delete_mode": "soft"}, "ignore_nulls": {"ignore_null_updates": True},
    "scd2": {"history_mode": "scd2"},
    "scd2_tracked": {"history_mode": "scd2", "track_history": {"include": ["v"]}},
}
#: Columns that say when a row was written, not what it holds.
WRITTEN_AT = ("_cdc_ingested_at", "_cdc_recorded_at", "recorded_at", "_commit_timestamp")


def story(seed: int) -> tuple[list[Message], dict[int, tuple[Any, str]], Counter[str]]:
    """A snapshot of six rows, then 40 source changes a second apart on two partitions (keys split
    by parity): inserts, updates that leave the TOASTed ``note`` unchanged (its placeholder) or null
    ``v``, deletes with their tombstones, primary-key moves across and within partitions, one
    truncate, and redeliveries of earlier messages. Delivered with the odd keys' partition five
    messages behind, as a lagging partition is, and one message in five later still, so that a
    key's changes also arrive out of order. Returns the delivered messages, the live rows the source
    holds at the end (``(v, note)`` by key), and how many of each edge the story holds."""
    rng, topic, edges = random.Random(seed), Topic(), Counter[str]()
    live: dict[int, tuple[Any, str]] = {}

    def send(k: int | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()) -> None:
        topic.send(None if k is None else key(k), value, partition=0 if k is None else k % 2, headers=headers)

    for k in range(1, 7):
        live[k] = (k, f"snapshot note {k} " * 40)
        send(k, pg("r", {"id": k, "v": k, "note": live[k][1]}, lsn=100, committed=None, snapshot="true"))
    lsn = 100
    for step in range(40):
        lsn += 10
        at = TS + lsn * 100
        absent, present = [k for k in range(1, 15) if k not in live], sorted(live)
        roll = rng.random()
        if not present or roll < 0.2:
            k, v = rng.choice(absent), rng.randint(0, 99)
            live[k] = (v, f"note {k}@{lsn} " * 40)
            send(k, pg("c", {"id": k, "v": v, "note": live[k][1]}, lsn=lsn, ts_ms=at))
            edges["insert"] += 1
        elif roll < 0.55:
            k = rng.choice(present)
            v = None if rng.random() < 0.25 else rng.randint(0, 99)
            unchanged = rng.random() < 0.6
            note = live[k][1] if unchanged else f"note {k}@{lsn} " * 40
            send(k, pg("u", {"id": k, "v": v, "note": PLACEHOLDER if unchanged else note}, lsn=lsn, ts_ms=at))
            live[k] = (v, note)
            edges["update, note unchanged" if unchanged else "update"] += 1
            edges["update, v null"] += v is None
        elif roll < 0.7:
            k = rng.choice(present)
            send(k, pg("d", {"id": k, "v": None, "note": None}, lsn=lsn, ts_ms=at))
            send(k, None)
            del live[k]
            edges["delete"] += 1
        elif roll < 0.85:
            old, new = rng.choice(present), rng.choice(absent)
            v = live[old][0] if rng.random() < 0.5 else rng.randint(0, 99)
            move(topic, old, new, {"v": v, "note": PLACEHOLDER}, lsn=lsn, old_partition=old % 2,
                 new_partition=new % 2, ts_ms=at)
            live[new] = (v, live.pop(old)[1])
            edges["move across partitions" if (old - new) % 2 else "move"] += 1
        elif roll < 0.9 and step > 15 and not edges["truncate"]:
            send(None, pg("t", None, lsn=lsn, ts_ms=at))
            live.clear()
            edges["truncate"] += 1
        else:
            again = rng.choice(topic.messages)
            topic.send(again.key, again.value, partition=again.partition, headers=again.headers)
            edges["redelivery"] += 1
    sent, delivered = topic.messages, Topic()
    late = [rng.choice([0, 0, 0, 0, 9]) for _ in sent]
    for i in sorted(range(len(sent)), key=lambda i: i + (5 if sent[i].partition == 1 else 0) + late[i]):
        delivered.send(sent[i].key, sent[i].value, partition=sent[i].partition, headers=sent[i].headers)
    return delivered.messages, live, edges


def _config(workdir: Path, writer: str) -> IngestConfig:
    tables = [{"name": name, "topic": f"t.{name}", "primary_key": ["id"], **options}
              for name, options in SHAPES.items()]
    path = workdir / "config.yaml"
    workdir.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"workdir": str(workdir), "target": {"writer": writer}, "tables": tables}))
    return load_config(path)


def _rows(table: pa.Table | None) -> list[str]:
    """A table's rows, without when they were written, as sorted JSON lines."""
    if table is None:
        return []
    kept = table.drop_columns([c for c in WRITTEN_AT if c in table.column_names])
    return sorted(json.dumps(row, sort_keys=True, default=str) for row in kept.to_pylist())


def _stored(paths: TablePaths) -> dict[str, list[str]]:
    return {what: _rows(None if (t := open_table(getattr(paths, what))) is None else read_all(t))
            for what in ("table", "tombstones", "moves")}


def _feed(config: IngestConfig, name: str, spark: Any) -> list[list[str]]:
    """The table's change data feed, commit by commit (commits without changes left out)."""
    feed = changes(config, name, ChangeRange(from_version=0), spark=lambda: spark)
    versions = feed["_commit_version"].to_pylist()
    return [_rows(feed.filter(pc.equal(feed["_commit_version"], v)).drop_columns(["_commit_version"]))
            for v in sorted(set(versions))]


def test_both_writers_leave_the_same_tables_in_every_shape(tmp_path: Path, spark: Any) -> None:
    messages, source, edges = story(seed=43)
    assert all(edges[edge] for edge in ("insert", "update", "update, note unchanged", "update, v null", "delete",
                                        "move", "move across partitions", "truncate", "redelivery")), edges
    cuts = [0, *sorted(random.Random(43).sample(range(1, len(messages)), 3)), len(messages)]
    batches = [messages[a:b] for a, b in itertools.pairwise(cuts)]
    writers: dict[str, Writer] = {"delta-rs": DeltaRsWriter(),
                                  "delta-spark": DeltaSparkWriter(spark, driver_lookup_rows=0)}
    configs = {name: _config(tmp_path / name, name) for name in writers}
    for name in SHAPES:
        topic, seen = Topic(f"t.{name}"), []
        for batch_id, batch in [*enumerate(batches), (len(batches) - 1, batches[-1])]:  # the last one replayed
            stored = {}
            for writer_name, writer in writers.items():
                config = configs[writer_name]
                paths = TablePaths.of(config, name)
                ingest_batch(config.table(name), paths, topic, batch, batch_id=batch_id, writer=writer)
                stored[writer_name] = _stored(paths)
            assert stored["delta-spark"] == stored["delta-rs"], f"{name}, after batch {batch_id}"
            seen.append(stored["delta-rs"])
        assert seen[-1] == seen[-2], f"{name}: the replay changed the table"
        assert _feed(configs["delta-spark"], name, spark) == _feed(configs["delta-rs"], name, spark), name
    # The source's rows are what the plain table holds: the story reached the tables as it was told.
    live = {r["id"]: r for r in read_all(open_table(TablePaths.of(configs["delta-rs"], "hard").table)).to_pylist()}
    assert {k: r["v"] for k, r in live.items()} == {k: v for k, (v, _) in source.items()}
    assert all(r["note"] == source[k][1] for k, r in live.items() if not r["_cdc_unknown_columns"])
