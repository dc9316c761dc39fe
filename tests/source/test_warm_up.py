"""The session's warm-up leaves a Python worker ready to decode: its first micro-batch imports nothing
heavy. Before, each worker's first decode imported pandas (through pyarrow) and deltalake: ~1 s of a
first batch that then took 3x the median one (``benchmarks/bench_compare.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from ingest.source.topiclog import ProducerRecord, TopicLog
from tests.decode.fixtures import ORDERS_SCHEMA, envelope, json_key, json_message, order_row, pg_source

#: Packages whose import costs a cold worker a noticeable part of a second or more.
HEAVY = ("pandas", "numpy", "deltalake", "polars", "duckdb", "great_expectations", "pyspark.pandas")

# Runs in a fresh interpreter, as a new Python worker would: the warm-up's imports, then the
# embedded reader's decode of one typed change, listing what that decode imported.
_WORKER = textwrap.dedent("""
    import json, sys
    from ingest.spark.session import _import_decode

    list(_import_decode(iter([])))
    from ingest.decode.columnar import BatchDecoder, DecoderSpec
    from ingest.source.reader import TopicLogStreamReader, encode_decoder

    reader = TopicLogStreamReader({"path": sys.argv[1], "subscribe": "t",
                                   "decode": encode_decoder(BatchDecoder({"t": DecoderSpec("json")}))})
    [task] = reader.partitions({"t": {"0": 0}}, {"t": {"0": 1}})
    before = set(sys.modules)
    parts = [batch for batch in reader.read(task)]
    assert parts and parts[0].num_rows, "nothing decoded"
    print(json.dumps(sorted(set(sys.modules) - before)))
""")


def _first_decode_imports(log_dir: Path, warm: bool = True) -> list[str]:
    script = _WORKER if warm else _WORKER.replace("list(_import_decode(iter([])))", "")
    done = subprocess.run([sys.executable, "-c", script, str(log_dir)], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY]


def test_a_warmed_worker_decodes_its_first_batch_without_importing_anything_heavy(tmp_path):
    log = TopicLog(tmp_path)
    log.create_topic("t", 1)
    value = json_message(envelope("c", after=order_row(7), source=pg_source(lsn=100, committed=90)), ORDERS_SCHEMA)
    log.append("t", [ProducerRecord(0, json_key(7), value, 1_700_000_000_000)])

    assert _heavy(_first_decode_imports(tmp_path)) == []
    # The check can fail: without the warm-up the same decode imports them.
    assert "pandas" in _heavy(_first_decode_imports(tmp_path, warm=False))


def test_a_warmed_worker_has_the_kafka_reader_imported() -> None:
    # Its first Kafka task would otherwise import the configuration's models and librdkafka (0.5-0.9 s).
    script = ("import sys; from ingest.spark.session import _import_decode; list(_import_decode(iter([]))); "
              "print(all(m in sys.modules for m in ('ingest.source.kafkalog', 'confluent_kafka', 'pydantic')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "True"
