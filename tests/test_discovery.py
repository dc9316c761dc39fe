"""Tables found by topic name: the mapping, the refusals, a run over discovered tables, new topics while running."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.cli.outcome import Exit
from ingest.config import KafkaSpec, load_config
from ingest.errors import ConfigError, SourceUnavailableError
from ingest.lake.delta import has_deletion_vectors, open_table, read_all
from ingest.source.discovery import discovered, table_name, with_discovered
from ingest.source.sources import EmbeddedSource, KafkaSource
from ingest.source.topiclog import ProducerRecord, TopicLog
from ingest.stream.runner import Runner
from tests.harness import TS, key, pg

PATTERN = r"shop\.public\.[^.]+"


def write_config(workdir: Path, *, pattern: str = PATTERN, tables: list[dict[str, Any]] | None = None,
                 defaults: dict[str, Any] | None = None, refresh: float = 30.0) -> Path:
    raw = {"workdir": str(workdir), "source": {"value_format": "json", "max_records_per_batch": 400},
           "discover": {"topic_pattern": pattern, "defaults": defaults or {}, "refresh_seconds": refresh},
           "tables": tables or []}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def produce(log: TopicLog, topic: str, changes: list[tuple[str, dict[str, Any], int]]) -> None:
    if not log.exists(topic):
        log.create_topic(topic, 2)
    log.append(topic, [ProducerRecord(0, key(row["id"]), pg(op, row, lsn=lsn), TS) for op, row, lsn in changes])


def rows(config: Any, table: str) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in read_all(open_table(config.table_path(table))).to_pylist()}


# --- the mapping -------------------------------------------------------------------------------

@pytest.mark.parametrize(("topic", "template", "name"), [
    ("shop.public.orders", "{schema}_{table}", "public_orders"),
    ("shop.public.order-lines", "{schema}_{table}", "public_order_lines"),
    ("eu.shop.inventory.items", "{prefix}_{table}", "eu_shop_items"),  # the prefix may hold dots
    ("shop.public.2024_sales", "{table}", "t_2024_sales"),
])
def test_topic_names_map_to_table_names(topic, template, name):
    assert table_name(template, topic) == name


@pytest.mark.parametrize("topic", ["shop", "shop.transaction", "shop..orders"])
def test_a_topic_that_is_no_tables_is_refused_with_the_way_out(topic):
    with pytest.raises(ConfigError, match="narrow the pattern"):
        table_name("{schema}_{table}", topic)


def test_listed_tables_override_and_names_never_collide(tmp_path):
    config = load_config(write_config(tmp_path, defaults={"delete_mode": "soft"}, tables=[
        {"name": "crm_customers", "topic": "shop.public.customers", "delete_mode": "hard"}]))
    found = discovered(config, ["shop.public.customers", "shop.public.orders", "shop.audit.orders", "other.public.x"])
    assert [(t.name, t.topic, t.delete_mode) for t in found] == [("public_orders", "shop.public.orders", "soft")]

    clash = load_config(write_config(tmp_path / "clash", pattern=r"shop\..+", tables=[]))
    with pytest.raises(ConfigError, match="both give table 'public_order_lines'"):
        discovered(clash, ["shop.public.order-lines", "shop.public.order_lines"])
    taken = load_config(write_config(tmp_path / "taken", tables=[{"name": "public_orders", "topic": "legacy.orders"}]))
    with pytest.raises(ConfigError, match=r"'legacy\.orders' and 'shop\.public\.orders' both give"):
        discovered(taken, ["shop.public.orders"])


def test_bad_discovery_settings_are_refused_at_load(tmp_path):
    path = write_config(tmp_path, defaults={"delete_mode": "sometimes"})
    with pytest.raises(ConfigError, match=r"discover\.defaults\.delete_mode"):
        load_config(path)
    raw = yaml.safe_load(path.read_text())
    raw.pop("discover")
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="no tables"):
        load_config(path)


def test_readers_keep_the_listed_tables_when_kafka_cannot_list_topics(tmp_path):
    config = load_config(write_config(tmp_path, tables=[{"name": "listed", "topic": "shop.public.listed"}]))
    kafka = KafkaSource(KafkaSpec(bootstrap_servers="127.0.0.1:9"), timeout=2)  # nothing listens there
    assert [t.name for t in with_discovered(config, kafka, strict=False).tables] == ["listed"]
    with pytest.raises(SourceUnavailableError, match="did not list its topics"):
        with_discovered(config, kafka)


def test_a_run_whose_kafka_cannot_list_topics_says_so_in_one_line(tmp_path):
    path = write_config(tmp_path, tables=[{"name": "listed", "topic": "shop.public.listed"}])
    raw = yaml.safe_load(path.read_text())
    raw["source"].update(kind="kafka", kafka={"bootstrap_servers": "127.0.0.1:9"})  # nothing listens there
    path.write_text(yaml.safe_dump(raw))
    done = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "-c", str(path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == Exit.UNAVAILABLE, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: Kafka at 127.0.0.1:9 did not list its topics"), lines


def test_embedded_topics_are_discovered(tmp_path):
    config = load_config(write_config(tmp_path))
    log = TopicLog(config.log_dir)
    for topic in ("shop.public.b", "shop.public.a", "crm.public.c"):
        log.create_topic(topic, 1)
    resolved = with_discovered(config, EmbeddedSource(config.log_dir))
    assert [(t.name, t.topic) for t in resolved.tables] == [("public_a", "shop.public.a"),
                                                            ("public_b", "shop.public.b")]
    assert with_discovered(resolved).tables == resolved.tables  # a second look adds nothing twice


# --- through the engine ------------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.parametrize(("discovered_engine", "listed_engine"), [("delta-rs", "delta-spark"),
                                                                  ("delta-spark", "delta-rs")])
def test_a_run_ingests_every_matching_topic_with_defaults_and_overrides(tmp_path, spark, discovered_engine,
                                                                         listed_engine):
    # One pipeline, both apply engines: the discovered tables take the default's, the listed one its own.
    path = write_config(tmp_path, defaults={"delete_mode": "soft", "engine": discovered_engine}, tables=[
        {"name": "crm", "topic": "shop.public.customers", "delete_mode": "hard", "engine": listed_engine}])
    config = load_config(path)
    log = TopicLog(config.log_dir)
    produce(log, "shop.public.orders", [("c", {"id": i, "qty": i}, 10 + i) for i in range(5)] +
            [("d", {"id": 0, "qty": 0}, 40)])
    produce(log, "shop.public.order-lines", [("c", {"id": 1, "sku": "a"}, 10)])
    produce(log, "shop.public.customers", [("c", {"id": 1, "name": "x"}, 10), ("d", {"id": 1, "name": "x"}, 20)])
    produce(log, "elsewhere.public.noise", [("c", {"id": 1}, 10)])

    report = Runner(config, spark=spark).run()
    assert sorted(report.tables) == ["crm", "public_order_lines", "public_orders"] and not report.failed
    orders = rows(config, "public_orders")
    assert len(orders) == 5 and orders[0]["_cdc_deleted"] is True  # the default: soft deletes
    assert rows(config, "crm") == {}  # the listed table's own setting: hard deletes
    assert list(rows(config, "public_order_lines")) == [1]
    # The three tables' audit rows went into one commit of the audit table (one per micro-batch).
    audit_table = open_table(config.tables_root / config.target.audit_table)
    assert sorted(r["table"] for r in read_all(audit_table).to_pylist()) == ["crm", "public_order_lines",
                                                                          "public_orders"]
    assert len(audit_table.history()) == 1
    deletion_vectors = {name: has_deletion_vectors(open_table(config.table_path(name)))
                        for name in ("crm", "public_orders", "public_order_lines")}
    assert deletion_vectors == {"crm": listed_engine == "delta-spark",
                                "public_orders": discovered_engine == "delta-spark",
                                "public_order_lines": discovered_engine == "delta-spark"}

    from typer.testing import CliRunner

    from ingest.cli import app

    status = CliRunner().invoke(app, ["status", "-c", str(path)])
    assert status.exit_code == 0, status.output
    for name in ("crm", "public_orders", "public_order_lines"):
        assert name in status.output


@pytest.mark.spark
def test_a_topic_that_appears_while_running_is_picked_up(tmp_path, spark):
    config = load_config(write_config(tmp_path, refresh=2))
    log = TopicLog(config.log_dir)
    produce(log, "shop.public.first", [("c", {"id": 1, "v": "a"}, 10)])
    reports = []
    engine = Runner(config, spark=spark)
    runner = threading.Thread(target=lambda: reports.append(engine.run(mode="continuous", stop_after=90)))
    runner.start()
    deadline = time.monotonic() + 40
    while not (config.table_path("public_first") / "_delta_log").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    produce(log, "shop.public.late", [("c", {"id": i, "v": "b"}, 20 + i) for i in range(3)])
    while not (config.table_path("public_late") / "_delta_log").exists() and time.monotonic() < deadline + 20:
        time.sleep(0.5)
    engine.stop()  # once the late table is written: the run settles its last batch, then ends
    runner.join(timeout=120)
    (report,) = reports
    assert not report.failed
    assert report.tables["public_first"].total("inserted") == 1
    assert report.tables["public_late"].total("inserted") == 3
    assert sorted(rows(config, "public_late")) == [0, 1, 2]


@pytest.mark.spark
def test_one_failing_table_among_many_stops_alone_and_resumes_from_its_own_log(tmp_path, spark):
    from tests.quality.helpers import write_suite

    write_suite(tmp_path / "work" / "expectations", "small_qty", [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "qty", "min_value": 0, "max_value": 10}}])
    guarded = {"name": "guarded", "topic": "shop.public.t3", "expectations": "small_qty", "quality_policy": "fail"}
    path = write_config(tmp_path / "work", tables=[guarded])
    raw = yaml.safe_load(path.read_text())
    raw["quality"] = {"expectations_dir": "expectations"}
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    log = TopicLog(config.log_dir)
    topics = [f"shop.public.t{i}" for i in range(6)]
    for topic in topics:
        produce(log, topic, [("c", {"id": k, "qty": 1}, 10 + k) for k in range(4)])
    first = Runner(config, spark=spark).run()
    assert len(first.tables) == 6 and not first.failed

    for topic in topics:  # the guarded table's batch breaks its suite; the others' is fine
        produce(log, topic, [("u", {"id": 1, "qty": 99 if topic.endswith("t3") else 2}, 100),
                             ("c", {"id": 9, "qty": 3}, 101)])
    second = Runner(config, spark=spark).run()
    assert second.failed == ["guarded"] and "policy 'fail'" in second.tables["guarded"].error
    for name in ("public_t0", "public_t1", "public_t2", "public_t4", "public_t5"):
        assert second.tables[name].total("updated") == 1 and second.tables[name].total("inserted") == 1
        assert rows(config, name)[1]["qty"] == 2 and len(rows(config, name)) == 5
    assert rows(config, "guarded")[1]["qty"] == 1 and 9 not in rows(config, "guarded")  # nothing of the batch

    # The operator relaxes the gate: the guarded table resumes from its own Delta log, although the
    # shared query's checkpoint moved past its records; the others apply nothing twice.
    relaxed = {**guarded, "quality_policy": "warn"}
    raw["tables"] = [relaxed]
    path.write_text(yaml.safe_dump(raw))
    third = Runner(load_config(path), spark=spark).run()
    assert not third.failed
    assert third.tables["guarded"].total("updated") == 1 and third.tables["guarded"].total("inserted") == 1
    assert rows(config, "guarded")[1]["qty"] == 99 and len(rows(config, "guarded")) == 5
    for name in ("public_t0", "public_t1", "public_t2", "public_t4", "public_t5"):
        assert third.tables[name].total("received") == 0 and len(rows(config, name)) == 5


@pytest.mark.spark
def test_in_a_continuous_run_a_transient_stop_catches_up_alone_and_a_terminal_one_stays(tmp_path, spark, monkeypatch):
    from ingest.errors import RegistryUnavailableError, TableError
    from ingest.lake.layout import TablePaths
    from ingest.records import audit
    from ingest.stream import callback as handler

    path = write_config(tmp_path / "work")
    raw = yaml.safe_load(path.read_text())
    raw["source"]["retry_stopped_seconds"] = 1
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    log = TopicLog(config.log_dir)
    for name in ("ok", "flaky", "broken"):
        produce(log, f"shop.public.{name}", [("c", {"id": k, "v": "a"}, 10 + k) for k in range(4)])

    outage = threading.Event()
    outage.set()
    calls: dict[str, int] = {}
    real = handler.apply_batch

    def faulty(spec: Any, *args: Any, **kwargs: Any) -> Any:
        calls[spec.name] = calls.get(spec.name, 0) + 1
        if spec.name == "public_flaky" and outage.is_set():
            raise RegistryUnavailableError("the registry did not answer (test)")
        if spec.name == "public_broken" and calls[spec.name] > 1:
            raise TableError(spec.name, "cannot take this batch (test)")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(handler, "apply_batch", faulty)
    engine = Runner(config, spark=spark)
    reports: list[Any] = []
    runner = threading.Thread(target=lambda: reports.append(engine.run(mode="continuous", stop_after=240)))
    runner.start()
    lsn, last, deadline = 100, 10**9, time.monotonic() + 200
    try:
        # The source keeps changing while the flaky table is down: its gap grows past several micro-batches.
        while time.monotonic() < deadline:
            lsn += 1
            for name in ("ok", "flaky", "broken"):
                produce(log, f"shop.public.{name}", [("c", {"id": lsn, "v": "b"}, lsn),
                                                     ("u", {"id": 1, "v": str(lsn)}, lsn)])
            if outage.is_set() and calls.get("public_flaky", 0) >= 2 * 3:  # two stops, three tries each
                outage.clear()
                last = lsn
            if not outage.is_set() and lsn > last + 3:
                break
            time.sleep(1.0)
        time.sleep(6)  # two more micro-batches for the rows produced last
    finally:
        engine.stop()
        runner.join(timeout=120)
    (report,) = reports
    flaky, broken = report.tables["public_flaky"], report.tables["public_broken"]
    # Stopped twice (each after three tries in its batch), then caught up once.
    assert flaky.error is None and len(flaky.recovered) == 1 and calls["public_flaky"] > 6, (flaky, calls)
    assert "RegistryUnavailableError" in flaky.recovered[0]
    assert broken.error and "cannot take this batch" in broken.error
    assert calls["public_broken"] == 2  # terminal: never tried again
    expected = {0, 1, 2, 3, *range(101, lsn + 1)}
    for name in ("public_ok", "public_flaky"):
        table = rows(config, name)
        assert set(table) == expected, (name, sorted(expected - set(table)))
        assert table[1]["v"] == str(lsn), name
        # Every record received once: the catch-up's and the stream's audit rows never overlap.
        received = sum(r["received"] for r in audit.read(TablePaths.of(config, name).audit, table=name).to_pylist())
        assert received == sum(log.end_offsets(f"shop.public.{name.removeprefix('public_')}").values()), name
