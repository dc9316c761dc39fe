"""Hostile input end to end: every bad message quarantined with its reason, no crash, the rest flowing.

One engine run per value format, on the shared SparkSession, over a healthy table, a hostile table
(every kind of bad message between good ones, and a 50 MB value), hostile-but-legal names and keys,
and tables whose input must stop them with a named error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import IngestConfig, load_config
from ingest.decode import MessageDecoder
from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.errors import ConfigError
from ingest.lake.delta import open_table, read_all
from ingest.model import KafkaCoordinates
from ingest.records import audit, quarantine
from ingest.source.topiclog import TopicLog
from ingest.stream.report import RunReport
from ingest.stream.runner import Runner
from tests.proof.torture.corpus import AVRO_STOPPERS, HOSTILE_COLUMNS, JSON_STOPPERS, Topic, avro_corpus, json_corpus

Run = tuple[IngestConfig, RunReport, dict[str, Topic]]


def _config(workdir: Path, value_format: str, tables: dict[str, Topic], keys: dict[str, list[str]]) -> IngestConfig:
    raw = {"workdir": str(workdir), "source": {"value_format": value_format, "max_records_per_batch": 25},
           "tables": [{"name": name, "topic": t.name, **({"primary_key": keys[name]} if name in keys else {})}
                      for name, t in tables.items()]}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _run(workdir: Path, spark: Any, value_format: str, tables: dict[str, Topic],
         keys: dict[str, list[str]] | None = None) -> Run:
    config = _config(workdir, value_format, tables, keys or {})
    log = TopicLog(config.log_dir)
    for topic in tables.values():
        topic.produce(log)
    return config, Runner(config, spark=spark).run(), tables


@pytest.fixture(scope="module")
def avro_run(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Run:
    workdir = tmp_path_factory.mktemp("bad-avro")
    healthy, hostile, stoppers = avro_corpus(EmbeddedSchemaRegistry(workdir / "schemas"))
    return _run(workdir, spark, "avro", {"healthy": healthy, "hostile": hostile, **stoppers})


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Run:
    workdir = tmp_path_factory.mktemp("bad-json")
    healthy, hostile, legal, keys, stoppers = json_corpus()
    return _run(workdir, spark, "json", {"jhealthy": healthy, "jhostile": hostile, "jlegal": legal,
                                         "jkeys": keys, **stoppers})


@pytest.fixture(params=["avro", "json"])
def run(request: pytest.FixtureRequest) -> Run:
    return request.getfixturevalue(f"{request.param}_run")


def _live(config: IngestConfig, table: str, key: str) -> dict[Any, dict[str, Any]]:
    rows = read_all(open_table(config.table_path(table))).to_pylist()
    return {r[key]: {k: v for k, v in r.items() if not k.startswith("_cdc_")} for r in rows if not r["_cdc_deleted"]}


def test_the_corpus_has_at_least_twenty_kinds(avro_run: Run, json_run: Run) -> None:
    kinds = {f"avro:{b.kind}" for b in avro_run[2]["hostile"].bad.values()}
    kinds |= {f"json:{b.kind}" for b in json_run[2]["jhostile"].bad.values()}
    kinds |= {f"stop:{t}" for t in (*AVRO_STOPPERS, *JSON_STOPPERS)}
    assert len(kinds) >= 40, sorted(kinds)


def test_each_bad_message_is_quarantined_with_its_reason(run: Run) -> None:
    config, _, tables = run
    name = next(n for n in tables if n.endswith("hostile"))
    held = {(r["offset"]): r for r in quarantine.read(config.tables_root / "_cdc_quarantine", table=name).to_pylist()}
    wrong = []
    for offset, bad in tables[name].bad.items():
        row = held.get(offset)
        if (row is None or bad.reason not in row["reason"] or row["raw_value"] != bad.value
                or row["row_key"] != bad.row_key):
            wrong.append((bad.kind, row and row["reason"], row and row["row_key"]))
    assert not wrong, wrong
    assert len(held) == len(tables[name].bad)  # and nothing else was held back


def test_no_crash_only_the_stopped_tables_fail_with_named_errors(run: Run) -> None:
    _, report, tables = run
    stoppers = {**AVRO_STOPPERS, **JSON_STOPPERS}
    assert set(report.failed) == {n for n in tables if n in stoppers}
    for name in report.failed:
        error_class, words = stoppers[name]
        error = report.tables[name].error or ""
        assert error.startswith(error_class), error
        assert all(w in error for w in words), (name, error)


def test_good_rows_flow_in_every_other_table_including_a_50mb_value(run: Run) -> None:
    config, _, tables = run
    stoppers = {**AVRO_STOPPERS, **JSON_STOPPERS}
    for name, topic in tables.items():
        if name in stoppers:
            continue
        key = "code" if name == "jkeys" else "id"
        assert _live(config, name, key) == topic.expected, name
    if "hostile" in tables:
        assert len(_live(config, "hostile", "id")[100]["name"]) == 50 * 1024 * 1024


def test_stopped_tables_commit_nothing_of_what_stopped_them(run: Run) -> None:
    """Each stopping case ends its topic: nothing of it, nor after it, reaches the table.

    Records before it may have committed in an earlier micro-batch (the tables share one query, whose
    batches cut across topics), and they are exactly the good ones.
    """
    config, report, tables = run
    for name in report.failed:
        table = open_table(config.table_path(name))
        last = len(tables[name].records) - 1  # the record that stops the table
        offsets = read_all(table)["_cdc_offset"].to_pylist() if table is not None else []
        assert all(o < last for o in offsets), (name, offsets)


def test_every_audit_row_balances_and_accounts_for_every_record(run: Run) -> None:
    config, report, tables = run
    rows = audit.read(config.tables_root / "_cdc_audit").to_pylist()
    assert rows and all(r["balanced"] for r in rows)
    for name, topic in tables.items():
        if name not in report.failed:
            assert sum(r["received"] for r in rows if r["table"] == name) == len(topic.records), name


def test_hostile_but_legal_names_and_keys_are_applied_exactly(json_run: Run) -> None:
    config, _, _ = json_run
    table = open_table(config.table_path("jlegal"))
    assert set(HOSTILE_COLUMNS) <= {f.name for f in table.schema().fields}
    # The SQL in the names did nothing: both tables are still there.
    assert open_table(config.table_path("jkeys")) is not None


@pytest.mark.parametrize("name", ["../etc", "x; DROP TABLE y", 'a"b', "_cdc_audit", "a b", "", "ü"])
def test_hostile_table_names_are_rejected_by_config_validation(tmp_path: Path, name: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"tables": [{"name": name, "topic": "t"}]}))
    with pytest.raises(ConfigError, match=r"tables\[0\]\.name"):
        load_config(path)


@pytest.mark.parametrize("topic", ["../../etc/passwd", "t'; DROP TABLE x; --", 'a"b', "a/b", ".", "..", "x" * 250,
                                   "a:b", ""])
def test_hostile_topic_names_are_rejected_by_config_validation(tmp_path: Path, topic: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"tables": [{"name": "t", "topic": topic}]}))
    with pytest.raises(ConfigError, match=r"tables\[0\]\.topic"):
        load_config(path)


def test_connect_json_with_spaces_decodes(tmp_path: Path) -> None:
    """Regression: JSON from a producer that is not Kafka Connect (spaces after colons) was quarantined."""
    value = json.dumps({"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]},
                        "payload": {"id": 7}}).encode()
    decoder = MessageDecoder(value_format="json", registry=None)
    for _ in range(2):  # the second read takes the cached-plan path
        event = decoder.decode(b'{"id": 7}', value, KafkaCoordinates("t", 0, 0))
        assert event.after == {"id": 7}


def test_the_decode_step_ships_raw_bytes_only_for_what_did_not_decode() -> None:
    """Decoded changes travel as typed columns; only undecodable messages carry their raw bytes."""
    import pyarrow as pa

    from ingest.decode.columnar import BatchDecoder, DecoderSpec
    from ingest.decode.parts import read_parts
    from ingest.source.topiclog import KAFKA_ROW_SCHEMA

    value = json.dumps({"op": "c", "after": {"id": 1, "blob": "x" * 1000}, "source": {}}).encode()
    values = [value] * 39 + [b"{not json"]
    rows = {"key": [b'{"id": 1}'] * 40, "value": values, "topic": ["t"] * 40, "partition": [0] * 40,
            "offset": list(range(40)), "timestamp": [None] * 40, "timestampType": [0] * 40, "headers": [[]] * 40}
    out = list(BatchDecoder(DecoderSpec("json"))(iter([pa.RecordBatch.from_pydict(rows, schema=KAFKA_ROW_SCHEMA)])))
    parts = read_parts([blob for batch in out for blob in batch.column("part").to_pylist()])
    offsets = sorted(o for p in parts for o in p.column("_cdc_offset").to_pylist())
    assert offsets == list(range(40))
    raw = [(p.column("_cdc_kind").to_pylist(), p.column("_cdc_raw_value").to_pylist()) for p in parts]
    carried = [v for kinds, values in raw for k, v in zip(kinds, values, strict=True) if v is not None]
    assert carried == [b"{not json"]
    assert sum(p.nbytes for p in parts) < 39 * 1000 + 10_000  # the blob once per row, as a column value
