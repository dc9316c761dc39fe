"""Parts of the stack torture and the latency benchmark that need no stack: schedules, offsets spans, configs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from harness.latency import STAGES, CommitIndex, latencies_of, nearest_rank, stages_of, summarize
from harness.stack.process import wait_until
from harness.stack.tls import TlsFiles
from harness.stack_proofs.faults import KINDS, kill_at, schedule
from harness.stack_proofs.setup import stack_config, topics_of
from harness.torture.process import IngestProcess

from ingest.commit.state import BATCH_KEY
from ingest.config import load_config


def test_schedule_is_seeded_balanced_and_covers_every_kind() -> None:
    kinds = len(KINDS)
    plan = schedule(random.Random(1), 5 * kinds)
    assert Counter(plan) == {k: 5 for k in KINDS}
    assert plan == schedule(random.Random(1), 5 * kinds) != schedule(random.Random(2), 5 * kinds)
    assert plan != sorted(plan)  # shuffled
    small = schedule(random.Random(3), kinds)
    assert sorted(small) == sorted(KINDS)
    odd = Counter(schedule(random.Random(4), kinds + 1))
    assert sum(odd.values()) == kinds + 1 and set(odd) == set(KINDS) and max(odd.values()) == 2
    without = schedule(random.Random(5), 10, tuple(k for k in KINDS if k != "mariadb"))  # a JSON torture
    assert "mariadb" not in without and len(without) == 10


def test_kill_points_are_valid_fault_specs() -> None:
    rng = random.Random(5)
    assert kill_at(rng, "after-batch") == "after-batch:1"
    point, hit, delay = kill_at(rng, "during-merge").split(":")
    assert point == "before-commit" and hit == "1" and 5 <= int(delay) <= 250


def _commit(version: int, ts: int, offsets: dict[str, list[int]]) -> dict[str, object]:
    return {"version": version, "timestamp": ts, BATCH_KEY: {"offsets": json.dumps(offsets)}}


def test_a_row_is_visible_at_the_first_commit_whose_span_holds_its_offset() -> None:
    index = CommitIndex.from_commits([
        _commit(1, 10_000, {"t:0": [0, 99], "t:1": [0, 9]}),
        _commit(2, 12_000, {"t:0": [100, 149]}),
        _commit(3, 15_000, {"t:0": [150, 150], "t:1": [10, 19]}),
    ])
    assert index.visible("t", 0, 0) == (1, 10_000)
    assert index.visible("t", 0, 99) == (1, 10_000)
    assert index.visible("t", 0, 100) == (2, 12_000)
    assert index.visible("t", 0, 150) == (3, 15_000)
    assert index.visible("t", 1, 15) == (3, 15_000)
    assert index.visible("t", 0, 151) is None  # not committed yet
    assert index.visible("other", 0, 1) is None


def test_a_replayed_span_does_not_move_a_row_to_a_later_version() -> None:
    index = CommitIndex.from_commits([_commit(4, 20_000, {"t:0": [0, 50]}), _commit(7, 30_000, {"t:0": [40, 60]})])
    assert index.visible("t", 0, 45) == (4, 20_000)
    assert index.visible("t", 0, 55) == (7, 30_000)


def test_latencies_take_the_rows_in_the_window_and_subtract_the_source_commit() -> None:
    index = CommitIndex.from_commits([_commit(1, 1_700_000_010_500, {"t:0": [0, 9]})])
    ts = [datetime.fromtimestamp(1_700_000_010 - s, UTC) for s in (0, 1, 2, 30)]
    rows = pa.table({"_cdc_source_ts": ts, "_cdc_topic": ["t", "t", "t", "t"], "_cdc_partition": [0, 0, 0, 0],
                     "_cdc_offset": [1, 2, 12, 3]})
    lat = latencies_of(rows, index, since=datetime.fromtimestamp(1_700_000_000, UTC))
    assert sorted(lat.values) == [500.0, 1500.0]  # offset 12 is not committed; the row 30 s back is outside
    assert lat.unmatched == 1
    assert summarize(list(range(1, 101))) == {50: 50, 95: 95, 99: 99}
    assert summarize([]) == {50: None, 95: None, 99: None}


def test_nearest_rank_is_the_smallest_value_a_share_does_not_exceed() -> None:
    hundred = [float(v) for v in range(100, 0, -1)]  # unsorted on purpose
    assert [nearest_rank(hundred, s) for s in (0.01, 0.5, 0.95, 0.99, 1.0)] == [1, 50, 95, 99, 100]
    twenty = [float(v) for v in range(1, 21)]
    assert nearest_rank(hundred, 0.07) == 7  # 0.07 * 100 is 7.000000000000001 in floating point
    assert nearest_rank(twenty, 0.951) == 20 and nearest_rank(twenty, 0.0) == 1
    assert nearest_rank([7.0], 0.5) == 7
    with pytest.raises(ValueError, match="no values"):
        nearest_rank([], 0.5)


def test_stages_split_a_rows_latency_where_its_change_carried_times() -> None:
    t0 = 1_700_000_000_000  # the source commit, ms
    index = CommitIndex.from_commits([_commit(3, t0 + 3_100, {"t:0": [0, 9]})])
    audit_rows = {3: {"started_at": datetime.fromtimestamp((t0 + 2_400) / 1000, UTC), "decode_ms": 300,
                      "apply_ms": 500, "total_ms": 1_000}}
    rows = pa.table({"_cdc_source_ts": [datetime.fromtimestamp(t0 / 1000, UTC)] * 3, "_cdc_topic": ["t"] * 3,
                     "_cdc_partition": [0] * 3, "_cdc_offset": [1, 2, 12]})
    # offset 1: Debezium at +150 ms, in Kafka at +400 ms; offset 2 was not read from the topic; 12 not committed
    stages = stages_of(rows, index, {("t", 0, 1): (t0 + 150, t0 + 400), ("t", 0, 12): (t0, t0)}, audit_rows)
    assert stages == {
        "capture": [150.0], "broker": [250.0], "waiting": [1_700.0], "decode": [300.0], "plan": [200.0],
        "apply + commit": [500.0]}
    assert sum(v[0] for v in stages.values()) == 3_100  # the row's latency, exactly
    assert tuple(stages) == STAGES


class _FakeStack:
    def bootstrap_servers(self, *, sasl: bool = False, tls: bool = False) -> str:
        return "127.0.0.1:9096" if tls else "127.0.0.1:9095" if sasl else "127.0.0.1:9092"

    def registry_url(self, *, authenticated: bool = False, tls: bool = False) -> str:
        if tls:
            return "https://127.0.0.1:8443"
        return "http://127.0.0.1:8082" if authenticated else "http://127.0.0.1:8081"

    def tls_files(self) -> TlsFiles:
        return TlsFiles(Path("/stack/tls"))


@pytest.mark.parametrize("listener", ["plaintext", "sasl", "tls"])
def test_stack_config_is_valid_and_holds_no_secret(tmp_path: Path, listener: str) -> None:
    sasl, tls = listener == "sasl", listener == "tls"
    path = stack_config(_FakeStack(), tmp_path / "w", schema="shopx", sasl=sasl, tls=tls, max_records_per_batch=500)
    config = load_config(path)
    assert [t.topic for t in config.tables] == [f"pgavro.shopx.{t}" for t in ("customers", "products", "orders",
                                                                               "order_items")]
    kafka = config.source.kafka
    assert kafka is not None and kafka.bootstrap_servers.endswith({"plaintext": "9092", "sasl": "9095",
                                                                   "tls": "9096"}[listener])
    assert (kafka.options.get("kafka.sasl.mechanism") == "SCRAM-SHA-512") is (sasl or tls)
    assert kafka.options.get("kafka.security.protocol") == {"plaintext": None, "sasl": "SASL_PLAINTEXT",
                                                             "tls": "SASL_SSL"}[listener]
    if tls:
        assert kafka.tls is not None and kafka.tls.ca_file == Path("/stack/tls/ca.pem")
        assert kafka.tls.cert_file == Path("/stack/tls/client.pem")
        assert config.source.registry.url == "https://127.0.0.1:8443/apis/ccompat/v7"
        registry_tls = config.source.registry.tls
        assert registry_tls is not None and registry_tls.ca_file == Path("/stack/tls/ca.pem")
    else:
        assert kafka.tls is None and config.source.registry.url == "http://127.0.0.1:8082/apis/ccompat/v7"
    assert config.source.max_records_per_batch == 500
    assert "password" not in path.read_text().lower()
    json_config = load_config(stack_config(_FakeStack(), tmp_path / "j", value_format="json"))
    assert json_config.source.registry.kind == "embedded" and json_config.tables[0].topic == "pgjson.shop.customers"
    assert topics_of("s", ["a"]) == ["pgavro.s.a", "pgjson.s.a"]


def test_ingest_process_kills_the_whole_group_and_numbers_its_logs(tmp_path: Path) -> None:
    process = IngestProcess(tmp_path / "missing.yaml", tmp_path / "logs", {"PATH": "/usr/bin:/bin"})
    process.start()
    assert process.wait(60) not in (None, 0)  # a missing configuration: the command fails on its own
    process.start(kill_at="after-batch:1")
    process.wait(60)
    assert [p.name for p in sorted((tmp_path / "logs").iterdir())] == ["ingest-001.log", "ingest-002.log"]
    # kill() takes the child's process group: a grandchild dies with it.
    process._child = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                                       "subprocess.Popen(['sleep', '60']); time.sleep(60)"], start_new_session=True)
    group = process._child.pid
    # The interpreter needs a moment to start and spawn its grandchild; on loaded cores a fixed pause was short.
    wait_until(lambda: len(_live_members(group)) == 2, what="the child and its grandchild", timeout=30,
               pid=group, interval=0.05)
    assert process.kill() == -9
    wait_until(lambda: _live_members(group) == [], what="the group's end", timeout=30, interval=0.05)


def _live_members(group: int) -> list[int]:
    """Pids of the process group that are alive (zombies waiting for their parent do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out
