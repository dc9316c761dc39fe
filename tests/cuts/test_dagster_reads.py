"""The Dagster analytic and incremental assets read a transaction group at its latest cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from assets.analytics import daily_revenue
from assets.incremental import refresh
from ingest.apply.journey import apply_parts
from ingest.commit.state import OpenTables
from ingest.config import IngestConfig, load_config
from ingest.cuts.publish import Publisher
from ingest.decode.columnar import BatchDecoder, DecoderSpec
from ingest.lake.layout import TablePaths
from ingest.source.topiclog import ProducerRecord, TopicLog

TS = 1_700_000_000_000


def _config(workdir: Path, *, group: bool = True) -> IngestConfig:
    raw: dict[str, Any] = {"workdir": str(workdir), "source": {"value_format": "json"},
                           "tables": [{"name": "orders", "topic": "shop.public.orders"},
                                      {"name": "customers", "topic": "shop.public.customers"}]}
    if group:
        raw["source"]["transactions"] = {"topic": "shop.transaction"}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "c.yaml").write_text(yaml.safe_dump(raw))
    return load_config(workdir / "c.yaml")


def _shop(config: IngestConfig) -> None:
    """Two transactions: each inserts a customer and an order of theirs."""
    log = TopicLog(config.log_dir)
    for topic in ("shop.public.orders", "shop.public.customers", "shop.transaction"):
        log.create_topic(topic, 1)
    lsn = 100
    for xid, (customer, segment, amount) in enumerate([(1, "retail", 10), (2, "pro", 1000)], start=700):
        rows = [("shop.public.customers", {"id": customer, "segment": segment}),
                ("shop.public.orders", {"id": customer, "customer_id": customer, "status": "paid", "quantity": 1,
                                        "amount": amount, "ordered_at": "2026-11-20T10:00:00Z"})]
        for table, row in rows:
            lsn += 1
            source = {"connector": "postgresql", "schema": "public", "table": table.rsplit(".", 1)[1], "lsn": lsn,
                      "sequence": json.dumps([str(lsn - 1), str(lsn)]), "ts_ms": TS, "snapshot": "false"}
            value = {"op": "c", "before": None, "after": row, "source": source, "ts_ms": TS,
                     "transaction": {"id": f"{xid}:{lsn}", "total_order": 1, "data_collection_order": 1}}
            key = json.dumps({"id": row["id"]}).encode()
            log.append(table, [ProducerRecord(0, key, json.dumps(value).encode(), TS)])
        end = {"status": "END", "id": f"{xid}:{lsn + 1}", "event_count": 2, "ts_ms": TS + xid,
               "data_collections": [{"data_collection": "public.customers", "event_count": 1},
                                    {"data_collection": "public.orders", "event_count": 1}]}
        log.append("shop.transaction", [ProducerRecord(0, None, json.dumps(end).encode(), TS)])


def _apply(config: IngestConfig, table: str, start: int, end: int) -> None:
    spec = config.table(table)
    rows = TopicLog(config.log_dir).read(spec.topic, 0, start, end)
    paths = TablePaths.of(config, table)
    apply_parts(spec, paths, BatchDecoder(DecoderSpec("json")).decode(rows), opened=OpenTables(paths, table),
                run_id="test", batch_id=end)


def test_the_assets_read_the_group_at_its_latest_cut(tmp_path: Path):
    config = _config(tmp_path / "w")
    _shop(config)
    with pytest.raises(dg.Failure, match="no cut published yet"):
        daily_revenue(config)
    _apply(config, "customers", 0, 1)
    _apply(config, "orders", 0, 1)
    assert Publisher(config).attempt().published == 1  # after the first transaction
    _apply(config, "orders", 1, 2)  # the second order, without its customer yet
    at_cut = daily_revenue(config).to_pylist()
    assert [(r["segment"], r["orders"], r["revenue"]) for r in at_cut] == [("retail", 1, 10)]
    assert refresh(config)["orders"] == 1 and refresh(config)["to_version"] == 0
    # Without the group the latest versions are read: the second order, its customer unknown.
    latest = daily_revenue(_config(tmp_path / "w", group=False)).to_pylist()
    assert sorted((r["segment"], r["orders"]) for r in latest) == [("retail", 1), ("unknown", 1)]
