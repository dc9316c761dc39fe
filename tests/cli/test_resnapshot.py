"""``ingest resnapshot``'s signals (issue 43, point 3): to which connector, on which topic, for which
source tables. The live snapshot itself, on the real stack: tests/stack/test_resnapshot.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ingest.cli.commands import app
from ingest.config import load_config
from ingest.errors import ConfigError
from ingest.ops.resnapshot import signals_for


def _config(tmp_path: Path, source: dict[str, object]) -> Path:
    raw = {"workdir": str(tmp_path / "work"), "source": source,
           "tables": [{"name": "orders", "topic": "shop.public.orders"},
                      {"name": "customers", "topic": "shop.public.customers", "source_table": "crm.customers"},
                      {"name": "items", "topic": "erp.sales.items"},
                      {"name": "odd", "topic": "no-prefix"}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_one_signal_per_connector_naming_its_source_tables(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092"}}))
    signals = signals_for(config, ["orders", "items", "customers"])
    assert [(s.prefix, s.topic, s.collections, s.tables) for s in signals] == [
        ("erp", "erp-signal", ("sales.items",), ("items",)),
        ("shop", "shop-signal", ("public.orders", "crm.customers"), ("orders", "customers"))]
    assert json.loads(json.dumps(signals[1].value())) == {
        "type": "execute-snapshot", "data": {"data-collections": ["public.orders", "crm.customers"],
                                             "type": "incremental"}}
    with pytest.raises(ConfigError, match=r"not <prefix>\.<schema>\.<table>"):
        signals_for(config, ["odd"])
    renamed = load_config(_config(tmp_path, {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092",
                                                                         "signal_topic": "signals.{prefix}"}}))
    assert signals_for(renamed, ["orders"])[0].topic == "signals.shop"


def test_without_kafka_it_says_so_in_one_line(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["resnapshot", "orders", "-c", str(_config(tmp_path, {"kind": "embedded"}))])
    assert done.exit_code == 2 and "the source is not Kafka" in done.output
    assert len([line for line in done.output.splitlines() if line.strip()]) == 1


def test_a_signal_table_row_carries_the_same_signal(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092"}}))
    first, second = (signals_for(config, ["orders"])[0].row() for _ in range(2))
    assert first[0] != second[0]  # Debezium keys a signal by its id
    assert first[1] == "execute-snapshot"
    assert json.loads(first[2]) == {"data-collections": ["public.orders"], "type": "incremental"}


def test_where_asks_for_the_matching_rows_of_one_table(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092"}}))
    (signal,) = signals_for(config, ["customers"], "id IN (5, 9)")
    assert signal.value()["data"] == {
        "data-collections": ["crm.customers"], "type": "incremental",
        "additional-conditions": [{"data-collection": "crm.customers", "filter": "id IN (5, 9)"}]}
    assert json.loads(signal.row()[2]) == signal.value()["data"]  # the signal table's row says the same
    for tables, where in ((["orders", "items"], "id = 1"), (["orders"], " ")):
        with pytest.raises(ConfigError, match="--where selects rows of one table"):
            signals_for(config, tables, where)
    path = _config(tmp_path, {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092"}})
    done = CliRunner().invoke(app, ["resnapshot", "orders", "items", "--where", "id = 1", "-c", str(path)])
    assert done.exit_code == 2 and "name exactly one table" in done.output


@pytest.mark.parametrize(("options", "code", "says"), [
    (["--signal-table", "cdc.debezium_signal"], 2, "--signal-table and --source-db go together"),
    (["--source-db", "host=127.0.0.1 port=1"], 2, "--signal-table and --source-db go together"),
    (["--signal-table", "debezium_signal", "--source-db", "host=127.0.0.1 port=1"], 2, "is not <schema>.<table>"),
    (["--signal-table", "cdc.debezium_signal", "--source-db",
      "host=127.0.0.1 port=1 dbname=cdc user=u password=hunter2-secret connect_timeout=2"],
     3, "source database 127.0.0.1:1/cdc: connection failed"),
])
def test_a_signal_table_needs_its_database_and_says_what_failed_in_one_line(
        tmp_path: Path, options: list[str], code: int, says: str) -> None:
    config = _config(tmp_path, {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9092"}})
    done = CliRunner().invoke(app, ["resnapshot", "orders", "-c", str(config), *options])
    assert done.exit_code == code, done.output
    assert says in done.output and "hunter2-secret" not in done.output
    assert len([line for line in done.output.splitlines() if line.strip()]) == 1, done.output
