import json
import logging
import subprocess
import sys

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ingest.errors import SourceUnavailableError
from ingest.source.reader import TopicLogStreamReader
from ingest.source.sources import KAFKA_SCHEMA_DDL
from ingest.source.topiclog import ProducerRecord, TopicLog


@pytest.fixture
def log(tmp_path):
    log = TopicLog(tmp_path)
    log.create_topic("t", 3)
    log.append("t", [ProducerRecord(p, None, b"v", 1) for p, n in ((0, 60), (1, 30), (2, 10)) for _ in range(n)])
    return log


def reader(log, **options):
    return TopicLogStreamReader({"path": str(log.root), "subscribe": "t", **options})


def test_starting_offsets_take_kafka_json_with_earliest_and_latest(log):
    start = reader(log, startingOffsets=json.dumps({"t": {"0": 42, "1": -1}})).initialOffset()
    assert start == {"t": {"0": 42, "1": 30, "2": 0}}


def test_read_limit_is_shared_in_proportion_to_lag(log):
    r = reader(log, maxOffsetsPerTrigger="50")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert end == {"t": {"0": 30, "1": 15, "2": 5}}
    assert sum(end["t"].values()) == 50
    assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 60, "1": 30, "2": 10}}


def test_each_topic_takes_at_most_its_bound_and_the_batch_bound_still_holds(log):
    log.create_topic("u", 1)
    log.append("u", [ProducerRecord(0, None, b"v", 1) for _ in range(8)])
    r = reader(log, subscribe="t,u", maxRecordsPerTopic="20")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 12, "1": 6, "2": 2}, "u": {"0": 8}}  # t's 20 in proportion to lag; u all it has
    # The micro-batch's bound then shares what each topic may take.
    bounded = r.latestOffset(start, ReadMaxRows(14))
    assert bounded == {"t": {"0": 6, "1": 3, "2": 1}, "u": {"0": 4}}
    # Caught up in steps of at most 20 records of t: the bound holds at every step, nothing is skipped.
    steps, at = [], start
    while (nxt := r.latestOffset(at, ReadAllAvailable())) != at:
        steps.append(sum(nxt["t"].values()) - sum(at["t"].values()))
        at = nxt
    assert max(steps) <= 20 and at == {"t": {"0": 60, "1": 30, "2": 10}, "u": {"0": 8}}


def test_tiny_limit_still_makes_progress(log):
    r = reader(log)
    start = {"t": {"0": 59, "1": 29, "2": 9}}
    end = r.latestOffset(start, ReadMaxRows(1))
    assert sum(end["t"].values()) == sum(start["t"].values()) + 1


def test_available_now_freezes_the_target(log):
    r = reader(log)
    r.prepareForTriggerAvailableNow()
    log.append("t", [ProducerRecord(0, None, b"late", 2)])
    assert r.latestOffset(r.initialOffset(), ReadAllAvailable())["t"]["0"] == 60


def test_a_topic_created_again_under_a_running_stream_stops_it_instead_of_skipping_its_records(log):
    """The stream had read t up to its ends when t was deleted and created again with a few records: it
    waited with nothing to read and, once t grew past the old offsets, read on from there, skipping
    the new topic's first records."""
    from ingest.source.kafkalog import DataLossError

    r = reader(log)
    at = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    log.delete_topic("t")
    log.create_topic("t", 3)
    log.append("t", [ProducerRecord(0, None, b"new", 3) for _ in range(5)])
    with pytest.raises(DataLossError, match=r"^topic t partition 0 ends at offset 4, before offset 60 the stream "
                                            r"reads next: the topic was deleted and created again"):
        r.latestOffset(at, ReadAllAvailable())


def test_partitions_and_read_cover_exactly_the_range(log):
    r = reader(log)
    parts = r.partitions({"t": {"0": 10, "1": 30, "2": 0}}, {"t": {"0": 12, "1": 30, "2": 3}})
    assert [p.spans for p in parts] == [[("t", 0, 10, 12), ("t", 2, 0, 3)]]  # one core: one task
    rows = [row for p in parts for batch in r.read(p) for row in batch.to_pylist()]
    assert sorted((row["partition"], row["offset"]) for row in rows) == [(0, 10), (0, 11), (2, 0), (2, 1), (2, 2)]


def test_one_task_per_core_of_about_equal_size_and_mix_covering_the_range(log, monkeypatch):
    import ingest.source.reader

    monkeypatch.setattr(ingest.source.reader, "MIN_PIECE", 20)
    r = reader(log, minPartitions="2")
    parts = r.partitions({"t": {"0": 0, "1": 0, "2": 0}}, {"t": {"0": 60, "1": 30, "2": 10}})
    # Partitions 0 and 1 are cut in halves, one for each task; partition 2 is too small to cut.
    assert [p.spans for p in parts] == [[("t", 0, 0, 30), ("t", 1, 0, 15), ("t", 2, 0, 10)],
                                        [("t", 0, 30, 60), ("t", 1, 15, 30)]]
    rows = [(row["partition"], row["offset"]) for p in parts for batch in r.read(p) for row in batch.to_pylist()]
    assert sorted(rows) == sorted((p, o) for p, n in ((0, 60), (1, 30), (2, 10)) for o in range(n))


def test_small_ranges_are_not_cut_and_fill_the_emptiest_task(log):
    r = reader(log, minPartitions="2")  # every range here is under MIN_PIECE
    parts = r.partitions({"t": {"0": 0, "1": 0, "2": 0}}, {"t": {"0": 60, "1": 30, "2": 10}})
    assert [p.spans for p in parts] == [[("t", 0, 0, 60)], [("t", 1, 0, 30), ("t", 2, 0, 10)]]


def test_a_task_reads_its_span_in_steps_and_covers_it_once(log, monkeypatch):
    import ingest.source.reader

    monkeypatch.setattr(ingest.source.reader, "READ_STEP", 7)
    r = reader(log)
    [task] = r.partitions({"t": {"0": 3, "1": 0, "2": 0}}, {"t": {"0": 60, "1": 30, "2": 10}})
    batches = list(r.read(task))
    assert max(b.num_rows for b in batches) == 7
    rows = sorted((row["partition"], row["offset"]) for batch in batches for row in batch.to_pylist())
    assert rows == sorted((p, o) for p, lo, n in ((0, 3, 60), (1, 0, 30), (2, 0, 10)) for o in range(lo, n))


def test_a_decoding_reader_yields_parts_and_the_log_gives_raw_messages_back(tmp_path, monkeypatch):
    from ingest.decode.columnar import BatchDecoder, DecoderSpec
    from ingest.decode.parts import read_parts
    from ingest.source import reader as module
    from ingest.source.embedded import EmbeddedSource
    from ingest.source.reader import encode_decoder

    log = TopicLog(tmp_path)
    log.create_topic("t", 1)
    log.append("t", [ProducerRecord(0, b"k", b"not json", 1), ProducerRecord(0, None, None, 2)])
    r = reader(log, decode=encode_decoder(BatchDecoder({"t": DecoderSpec("json")})))
    [task] = r.partitions({"t": {"0": 0}}, {"t": {"0": 2}})
    events: list[str] = []
    monkeypatch.setattr(module, "freeze_start_up", lambda: events.append("freeze"))
    read = r.read(task)
    batches = [next(read)]
    assert events == []  # the worker freezes what it holds once its first task has read everything
    batches += list(read)
    assert events == ["freeze"]
    parts = read_parts([blob for batch in batches for blob in batch.column("part").to_pylist()])
    meta = [row for part in parts for row in part.select(["_cdc_kind", "_cdc_offset"]).to_pylist()]
    assert sorted((m["_cdc_offset"], m["_cdc_kind"]) for m in meta) == [(0, "error"), (1, "tombstone")]
    raw = EmbeddedSource(tmp_path).fetch([("t", 0, 0)])
    assert list(raw) == [("t", 0, 0)] and raw[("t", 0, 0)][:2] == (b"k", b"not json")


@pytest.mark.spark
def test_stream_schema_is_the_kafka_source_schema(spark, log):
    from pyspark.sql.types import _parse_datatype_string

    frame = (spark.readStream.format("cdc_topiclog").option("path", str(log.root)).option("subscribe", "t").load())
    assert frame.isStreaming
    assert frame.schema == _parse_datatype_string(KAFKA_SCHEMA_DDL)


def test_an_unreachable_broker_is_reported_never_lag_zero(tmp_path):
    import yaml

    from ingest.config import KafkaSpec, load_config
    from ingest.errors import SourceUnavailableError
    from ingest.ops.status import table_status
    from ingest.source.kafka import KafkaSource

    source = KafkaSource(KafkaSpec(bootstrap_servers="127.0.0.1:1"), timeout=2)
    with pytest.raises(SourceUnavailableError, match=r"Kafka at 127\.0\.0\.1:1 did not answer for topic 'x'"):
        source.end_offsets("x")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"workdir": str(tmp_path), "tables": [{"name": "x", "topic": "x"}],
                                    "source": {"kind": "kafka", "kafka": {"bootstrap_servers": "127.0.0.1:1"}}}))
    [status] = table_status(load_config(path), source=source)
    assert status.lag is None and "did not answer" in (status.source_error or "")


def test_the_admin_client_gets_the_sasl_credentials_of_the_jaas_config(monkeypatch):
    from ingest.config import KafkaSpec
    from ingest.source.kafka_admin import admin_config

    spec = KafkaSpec(bootstrap_servers="b:9095", reader="spark",
                     options={"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "SCRAM-SHA-512",
                              "kafka.ssl.truststore.location": "/x.jks"})
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="cdc" password="p\\"w";'
    monkeypatch.setenv(spec.credentials_env, jaas)
    conf = admin_config(spec, None)
    assert {k: conf[k] for k in ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username")} == {
        "bootstrap.servers": "b:9095", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cdc"}
    assert conf["sasl.password"] == 'p"w'
    assert "ssl.truststore.location" not in conf  # a Java-only option librdkafka would refuse
    # a plaintext connection gets no credentials (librdkafka would warn about each)
    plain = admin_config(KafkaSpec(bootstrap_servers="b:9092"), None)
    assert not {k for k in plain if k.startswith("sasl.")}


def test_a_range_read_is_exactly_the_asked_offsets_in_the_stream_shape(spark, log):
    from pyspark.sql.types import _parse_datatype_string

    from ingest.source.sources import EmbeddedSource

    source = EmbeddedSource(log.root)
    assert source.start_offsets("t") == {0: 0, 1: 0, 2: 0} and source.start_offsets("absent") == {}
    frame = source.read_range(spark, "t", {0: 5, 2: 0}, {0: 9, 2: 10})
    assert frame.schema == _parse_datatype_string(KAFKA_SCHEMA_DDL)
    got = sorted((r.partition, r.offset) for r in frame.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(5, 9)] + [(2, o) for o in range(10)]


def test_a_catch_up_is_read_in_pieces_of_the_batch_size_covering_the_gap_once():
    from ingest.stream.caught_up import chunks

    start, end = {0: 5, 1: 0, 2: 7}, {0: 105, 1: 30, 2: 7}
    pieces = list(chunks(start, end, 40))
    covered = [(p, o) for lo, hi in pieces for p in lo for o in range(lo[p], hi[p])]
    assert sorted(covered) == [(0, o) for o in range(5, 105)] + [(1, o) for o in range(30)]  # once each
    assert all(sum(hi[p] - lo[p] for p in lo) <= 40 for lo, hi in pieces)
    assert list(chunks({0: 3}, {0: 3}, 10)) == []  # nothing missed, nothing to read


class _Reader:
    """Records what a source asks of Spark's reader."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}
        self.format_name = ""

    def format(self, name: str) -> "_Reader":
        self.format_name = name
        return self

    def option(self, key: str, value: str) -> "_Reader":
        self.options[key] = value
        return self

    def load(self) -> "_Reader":
        return self


def _kafka_stream_options(options: dict[str, str], reader_kind: str = "spark") -> dict[str, str]:
    from types import SimpleNamespace

    from ingest.config import KafkaSpec
    from ingest.source.kafka import KafkaSource

    reader = _Reader()
    spark = SimpleNamespace(readStream=reader, sparkContext=SimpleNamespace(defaultParallelism=2))
    spec = KafkaSpec(bootstrap_servers="127.0.0.1:9092", options=options, reader=reader_kind)
    # the python reader passes the secrets file's path on; the Spark source reads it here
    KafkaSource(spec, secrets_file="/s.yaml" if reader_kind == "python" else None).stream(spark, ["t"], "earliest", 500)
    assert reader.format_name == ("kafka" if reader_kind == "spark" else "cdc_topiclog")
    return reader.options


def test_the_python_reader_gets_the_connection_and_its_consumer_waits_briefly(monkeypatch):
    from ingest.config import KafkaSpec
    from ingest.source.kafkalog import KafkaLog

    monkeypatch.setenv("KAFKA_SASL_JAAS_CONFIG", 'ScramLoginModule required username="u" password="s3cret";')
    options = _kafka_stream_options({"kafka.security.protocol": "SASL_PLAINTEXT"}, "python")
    spec = KafkaSpec.model_validate_json(options["kafka"])
    assert spec.bootstrap_servers == "127.0.0.1:9092" and spec.reader == "python"
    assert options["secretsFile"] == "/s.yaml" and options["minPartitions"] == "2"
    assert "s3cret" not in json.dumps(options)  # looked up in the worker, never in Spark's plan
    conf = KafkaLog(spec).consumer_config()
    assert conf["sasl.password"] == "s3cret" and conf["security.protocol"] == "SASL_PLAINTEXT"
    assert conf["fetch.wait.max.ms"] == 50 and conf["isolation.level"] == "read_uncommitted"
    assert conf["auto.offset.reset"] == "error" and conf["enable.auto.commit"] is False
    tuned = KafkaLog(KafkaSpec(bootstrap_servers="b:1", options={"kafka.fetch.max.wait.ms": "200",
                                                                 "kafka.isolation.level": "read_committed"}))
    assert tuned.consumer_config()["fetch.wait.max.ms"] == 200
    assert tuned.consumer_config()["isolation.level"] == "read_committed"


def test_the_kafka_stream_waits_briefly_for_fetches_unless_configured(monkeypatch):
    monkeypatch.delenv("KAFKA_SASL_JAAS_CONFIG", raising=False)
    defaults = _kafka_stream_options({})
    assert defaults["kafka.fetch.max.wait.ms"] == "50"
    assert defaults["maxOffsetsPerTrigger"] == "500" and defaults["subscribe"] == "t"
    configured = _kafka_stream_options({"kafka.fetch.max.wait.ms": "400", "kafka.client.id": "x"})
    assert configured["kafka.fetch.max.wait.ms"] == "400" and configured["kafka.client.id"] == "x"


def test_java_only_kafka_options_are_refused_for_the_python_reader() -> None:
    from ingest.config import KafkaSpec

    with pytest.raises(ValueError, match=r"kafka\.ssl\.truststore\.location"):
        KafkaSpec(bootstrap_servers="x:9092", options={"kafka.ssl.truststore.location": "/t.jks"})
    spark = KafkaSpec(bootstrap_servers="x:9092", reader="spark", options={"kafka.ssl.truststore.location": "/t.jks"})
    assert spark.options == {"kafka.ssl.truststore.location": "/t.jks"}
    shared = KafkaSpec(bootstrap_servers="x:9092", options={"kafka.isolation.level": "read_committed"})
    assert shared.reader == "python"


@pytest.mark.parametrize("reader_kind", ["python", "spark"])
@pytest.mark.parametrize(("option", "value", "message"), [
    ("kafka.fetch.max.wait.ms", "0.5", "whole number of milliseconds"),
    ("kafka.fetch.max.wait.ms", "-1", "whole number of milliseconds"),
    ("kafka.fetch.max.wait.ms", "300001", "from 0 to 300000"),
    ("kafka.isolation.level", "READ_COMMITTED", "read_uncommitted, read_committed"),
])
def test_a_wrong_fetch_wait_or_isolation_level_is_refused_when_the_configuration_loads(reader_kind, option, value,
                                                                                        message) -> None:
    """Both clients would refuse these only once the stream runs (librdkafka in every Python worker)."""
    from pydantic import ValidationError

    from ingest.config import KafkaSpec

    with pytest.raises(ValidationError, match=message) as caught:
        KafkaSpec(bootstrap_servers="x:9092", reader=reader_kind, options={option: value})
    assert repr(value) in str(caught.value)
    ok = {"kafka.fetch.max.wait.ms": "0", "kafka.isolation.level": "read_committed"}
    assert KafkaSpec(bootstrap_servers="x:9092", reader=reader_kind, options=ok).options == ok


def test_a_micro_batch_asks_the_log_for_its_end_once(log):
    r = reader(log)
    asked = []
    ends = r.log.end_offsets
    r.log.end_offsets = lambda topic: asked.append(topic) or ends(topic)  # type: ignore[method-assign]
    start = r.initialOffset()
    asked.clear()
    latest = r.latestOffset(start, ReadAllAvailable())
    assert r.reportLatestOffset() == {"t": {"0": 60, "1": 30, "2": 10}} and latest["t"]["0"] == 60
    assert asked == ["t"]  # the report reuses what latestOffset saw


def test_the_kafka_log_asks_whether_a_topic_exists_until_it_does():
    from ingest.config import KafkaSpec
    from ingest.source.kafkalog import KafkaLog

    kafka = KafkaLog(KafkaSpec(bootstrap_servers="127.0.0.1:9"))
    answers = iter([{}, {0: 5}])
    calls = []
    kafka.source.end_offsets = lambda topic: calls.append(topic) or next(answers)  # type: ignore[method-assign]
    assert not kafka.exists("t")
    assert kafka.exists("t") and kafka.exists("t")
    assert calls == ["t", "t"]  # not asked again once it existed


def test_a_kafka_read_fetches_ahead_no_more_than_its_range(monkeypatch):
    import confluent_kafka

    from ingest.config import KafkaSpec
    from ingest.source.kafkalog import KEPT_READ, KafkaLog

    made = []

    class Consumer:
        def __init__(self, conf):
            made.append(conf)
            raise RuntimeError("no broker here")

    monkeypatch.setattr(confluent_kafka, "Consumer", Consumer)
    kafka = KafkaLog(KafkaSpec(bootstrap_servers="127.0.0.1:9"))
    for start, end in ((100, 2_600), (0, 10**9)):
        with pytest.raises(RuntimeError):
            kafka.read("t", 0, start, end)
    # librdkafka keeps fetching until its queue holds queued.min.messages: at most the range
    assert [conf["queued.min.messages"] for conf in made] == [2_500, 100_000]

    # The driver's reader keeps a consumer for small ranges only; a catch-up's gets one of its own.
    made.clear()
    kept = KafkaLog(KafkaSpec(bootstrap_servers="127.0.0.1:9"), keep_open=True)
    for start, end in ((0, KEPT_READ), (0, KEPT_READ + 1)):
        with pytest.raises(RuntimeError):
            kept.read("t", 0, start, end)
    assert [(conf["queued.min.messages"], conf["fetch.wait.max.ms"]) for conf in made] == [(KEPT_READ, 1),
                                                                                          (KEPT_READ + 1, 50)]


def test_the_readers_partitions_find_the_secrets_file_whatever_case_spark_gives_its_name(tmp_path):
    """Spark lower-cases a data source's option names; a partition's plain copy of them must still
    lead the workers to the secrets file (else SASL credentials kept there never reach librdkafka)."""
    from ingest.config import KafkaSpec
    from ingest.source.reader import open_log

    spec = KafkaSpec(bootstrap_servers="b:9095").model_dump_json()
    for name in ("secretsFile", "secretsfile"):
        log = open_log({"kafka": spec, name: str(tmp_path / "secrets.yaml")})
        assert log.source.secrets_file == str(tmp_path / "secrets.yaml")  # type: ignore[union-attr]


class _Outage:
    """The embedded log behind a source that can stop answering, as a restarting broker does."""

    def __init__(self, log: TopicLog) -> None:
        self.log, self.away = log, False

    def __getattr__(self, name: str):
        return getattr(self.log, name)

    def end_offsets(self, topic: str) -> dict[int, int]:
        if self.away:
            raise SourceUnavailableError("Kafka at 127.0.0.1:9092 did not answer for topic 't': Connection refused")
        return self.log.end_offsets(topic)


def test_a_source_that_does_not_answer_has_nothing_new_and_the_stream_goes_on(log, caplog, monkeypatch):
    r = reader(log)
    outage = _Outage(log)
    opened = []  # the clients the reader opened again: each is the same outage here
    monkeypatch.setattr("ingest.source.reader.open_log", lambda _options: opened.append(1) or outage)
    r.log = outage
    start = r.initialOffset()
    first = r.latestOffset(start, ReadAllAvailable())
    assert first == {"t": {"0": 60, "1": 30, "2": 10}}
    log.append("t", [ProducerRecord(1, None, b"v", 1)] * 4)
    outage.away = True
    with caplog.at_level(logging.WARNING, logger="ingest.source.reader"):
        # the query keeps its offsets, trigger after trigger, and says so once
        assert r.latestOffset(first, ReadAllAvailable()) == first
        assert r.latestOffset(first, ReadAllAvailable()) == first
        assert [m for m in caplog.messages if "did not answer" in m and "waits for it" in m] != []
        assert len(caplog.messages) == 1 and len(opened) == 2  # a new client for each next trigger
        outage.away = False
        assert r.latestOffset(first, ReadAllAvailable()) == {"t": {"0": 60, "1": 34, "2": 10}}
        assert "answers again" in caplog.messages[-1]


def test_a_kafka_client_dropped_after_the_broker_did_not_answer_ends_its_threads(refused_port):
    """During an outage the reader drops its Kafka client after each failed request and asks with a
    new one (one about every 15 s): each dropped client must end librdkafka's threads. On the real
    broker, kept away 4 minutes, the stream's process had grown from 7 to 75 threads (by hand)."""
    import gc
    import os

    from ingest.config import KafkaSpec
    from ingest.source.kafka_admin import KafkaAdmin

    spec = KafkaSpec(bootstrap_servers=f"127.0.0.1:{refused_port}")

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    def one_failed_request() -> None:
        with pytest.raises(SourceUnavailableError, match="did not answer"):
            KafkaAdmin(spec, timeout=0.5).end_offsets("t")

    one_failed_request()  # librdkafka's own process-wide threads, once
    before = threads()
    gc.disable()  # the clients must end when dropped, not at some later collection
    try:
        for _ in range(4):
            one_failed_request()
        assert threads() <= before
    finally:
        gc.enable()


def test_a_kafka_log_sent_to_spark_workers_leaves_its_kept_consumer_behind():
    """Spark pickles a stream's reader, and the log in it, for its Python workers: a copy holds the
    settings, not the consumer (or lock) a driver's reads keep, and opens its own when it reads."""
    import pickle

    from ingest.config import KafkaSpec
    from ingest.source.kafkalog import KafkaLog

    kept = KafkaLog(KafkaSpec(bootstrap_servers="127.0.0.1:9"), keep_open=True)
    kept._kept = object()  # as after a read: what no other process can use
    copy = pickle.loads(pickle.dumps(kept))
    assert copy._kept is None and copy._keep_open and copy.source.spec == kept.source.spec
    with copy._reading:  # a lock of its own
        assert not kept._reading.locked()
    assert kept._kept is not None  # the original keeps its consumer


@pytest.mark.parametrize(("servers", "says"), [
    ("127.0.0.1:9", "Kafka at 127.0.0.1:9 did not list its topics: 127.0.0.1:9: Connection refused"),
    ("no-such-broker.invalid:9092", "Kafka at no-such-broker.invalid:9092 did not list its topics: "
                                    "no-such-broker.invalid:9092: the name does not resolve ("),
])
def test_a_broker_that_takes_no_connection_is_named_with_the_systems_own_words(servers, says):
    """It read "_TRANSPORT: Failed to get metadata: Local: Broker transport failure (_TRANSPORT:
    127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state
    CONNECT))"."""
    from ingest.config import KafkaSpec
    from ingest.source.kafka_admin import KafkaAdmin

    with pytest.raises(SourceUnavailableError) as info:
        KafkaAdmin(KafkaSpec(bootstrap_servers=servers), timeout=3).topics()
    assert str(info.value).startswith(says), str(info.value)


def test_the_lag_counts_the_records_after_the_last_applied_offset():
    """A partition applied up to offset 0 counted that record as lag too (``0 or -1``)."""
    from ingest.ops.status import TableStatus

    def lag(applied: dict[int, int | None], end: dict[int, int]) -> int | None:
        return TableStatus("t", "t", applied, end, 0, 0, None).lag

    assert lag({0: 0, 1: None, 2: 4}, {0: 1, 1: 3, 2: 9}) == 0 + 3 + 4


_READ_FROM_NOWHERE = """
import sys
from ingest import logs
from ingest.config import KafkaSpec
from ingest.errors import SourceUnavailableError
from ingest.source.kafkalog import KafkaLog
logs.configure("text", sys.argv[2])
try:
    KafkaLog(KafkaSpec(bootstrap_servers="127.0.0.1:" + sys.argv[1]), timeout=3).read("t", 0, 0, 10)
except SourceUnavailableError as exc:
    print("engine:", exc)
"""


@pytest.mark.parametrize("level", ["warning", "debug"])
def test_the_readers_librdkafka_lines_show_only_when_debugging(refused_port: int, level: str) -> None:
    """The engine says once why a read failed; librdkafka's own lines (each failed connection, and on a
    SASL cluster a consumer closed while it still logs in to the group coordinator it never uses:
    "SASL authentication error" after a read that succeeded) are for ``--log-level debug``, as the
    admin client's are."""
    done = subprocess.run([sys.executable, "-c", _READ_FROM_NOWHERE, str(refused_port), level],
                          capture_output=True, text=True, timeout=120, check=False)
    assert "engine: Kafka at 127.0.0.1:" in done.stdout and "nothing from t[0]" in done.stdout, done
    raw = [line for line in done.stderr.splitlines() if line.startswith("%")]
    assert (raw != []) == (level == "debug"), done.stderr[-2000:]
