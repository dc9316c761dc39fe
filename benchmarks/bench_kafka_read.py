"""A micro-batch's reads from Kafka on the driver: a consumer opened for each read, or one kept open.

Not a test: it measures. A continuous run's small micro-batches are read by the driver, one range
per topic (:meth:`ingest.source.kafka.KafkaSource.read_arrow`), each ending where the log ends
(what arrived since the last batch). This script brings the stack's broker up (``harness.stack``,
Kafka only), makes ``--topics`` topics of one partition, and then, batch after batch, writes
``--records`` records the size of a Debezium change to every topic, reads them back as such a
micro-batch would, in three modes taking turns (which goes first rotates), and waits ``--pause``
seconds (the trigger) before the next:

* ``opened per read``: :class:`~ingest.source.kafkalog.KafkaLog` without ``keep_open``, a new
  librdkafka consumer for every range (as every read was before the driver kept one);
* ``kept open``: one ``KafkaLog(keep_open=True)`` for the whole run, as the driver's source keeps;
* ``kept, no own settings``: the same without the kept consumer's own librdkafka settings
  (:attr:`~ingest.source.kafkalog.KafkaLog.kept_settings`): the source's ``fetch.wait.max.ms`` and
  librdkafka's ``fetch.queue.backoff.ms``.

It checks that each mode reads every record of each range, and reports each mode's median and 95th
percentile time per range and per batch (the sum over the topics).

``--behind N`` writes N more records to each topic before the first batch, so that every range ends
that far before the log's end, as a run catching up reads: librdkafka then fetches past the range
until its queue holds ``queued.min.messages``, and a full queue makes it wait
``fetch.queue.backoff.ms`` before it fetches that partition again.

    .venv/bin/python benchmarks/bench_kafka_read.py
    .venv/bin/python benchmarks/bench_kafka_read.py --topics 1 --records 100
    .venv/bin/python benchmarks/bench_kafka_read.py --behind 5000 --batches 60
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

from harness.latency import nearest_rank
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ingest.config import KafkaSpec
from ingest.source.kafkalog import KafkaLog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Figure, changed_options, write_result

console = Console(width=120)
MODES = ("opened per read", "kept open", "kept, no own settings")
Write = Callable[[list[str], int], None]
#: Bytes of a record's value: about a Debezium change of a few columns, with its envelope.
VALUE_BYTES = 600


def make_topics(bootstrap: str, topics: int) -> list[str]:
    """``topics`` new topics of one partition."""
    from confluent_kafka.admin import AdminClient, NewTopic

    names = [f"bench-read-{uuid.uuid4().hex[:8]}-{i}" for i in range(topics)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1) for n in names]).values():
        future.result(30)
    return names


def writer(bootstrap: str) -> Write:
    """What writes ``records`` records to each of the topics and returns once the broker holds them."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})

    def write(topics: list[str], records: int) -> None:
        for topic in topics:
            for i in range(records):
                producer.produce(topic, key=str(i).encode(), value=bytes(VALUE_BYTES))
        if producer.flush(60):
            raise SystemExit("the broker did not take a batch's records within 60 s")

    return write


def read_batch(log: KafkaLog, topics: list[str], start: int, records: int) -> list[float]:
    """Seconds of each topic's read of ``[start, start + records)``, after checking it is whole."""
    times = []
    for topic in topics:
        began = time.perf_counter()
        rows = log.read(topic, 0, start, start + records)
        times.append(time.perf_counter() - began)
        if rows.column("offset").to_pylist() != list(range(start, start + records)):
            raise SystemExit(f"{topic}: the read of {start}..{start + records - 1} was not whole")
    return times


def measure(spec: KafkaSpec, topics: list[str], write: Write, batches: int, records: int, pause: float,
            progress: Progress, *, behind: int = 0) -> dict[str, tuple[list[float], list[float]]]:
    """Per mode, the time of every range and of every batch (the sum over the topics), taking turns;
    each range ends ``behind`` records before the log's end."""
    # The kept consumer with only the settings every other consumer of the source has.
    plain = type("KeptPlain", (KafkaLog,), {"kept_settings": MappingProxyType({})})
    kept = {"kept open": KafkaLog(spec, keep_open=True), "kept, no own settings": plain(spec, keep_open=True)}
    reads: dict[str, tuple[list[float], list[float]]] = {mode: ([], []) for mode in MODES}
    task = progress.add_task("batches", total=batches)
    if behind:
        write(topics, behind)
    try:
        for batch in range(batches):
            write(topics, records)
            turn = batch % len(MODES)
            for mode in MODES[turn:] + MODES[:turn]:
                log = kept.get(mode) or KafkaLog(spec)
                times = read_batch(log, topics, batch * records, records)
                reads[mode][0].extend(times)
                reads[mode][1].append(sum(times))
            progress.advance(task)
            time.sleep(pause)
    finally:
        for log in kept.values():
            log.close()
    return reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=4, help="topics a micro-batch reads (the shop tables: 4)")
    parser.add_argument("--records", type=int, default=25, help="records of each topic per micro-batch")
    parser.add_argument("--batches", type=int, default=200, help="micro-batches read in each mode")
    parser.add_argument("--pause", type=float, default=0.25, help="seconds between batches (the trigger)")
    parser.add_argument("--behind", type=int, default=0,
                        help="records each topic's log holds past every range (0: ranges end at the log's end)")
    args = parser.parse_args()

    from harness.stack import Stack

    stack = Stack.from_env()
    stack.up(["kafka"])
    bootstrap = stack.bootstrap_servers()
    spec = KafkaSpec(bootstrap_servers=bootstrap)
    topics = make_topics(bootstrap, args.topics)
    try:
        with Progress(console=console, transient=True) as progress:
            reads = measure(spec, topics, writer(bootstrap), args.batches, args.records, args.pause, progress,
                            behind=args.behind)
    finally:
        from ingest.verify.capture import delete_topics

        delete_topics(bootstrap, topics)
    where = f", each {args.behind:,} records before the log's end" if args.behind else ""
    out = Table(title=f"{args.batches} micro-batches of {args.records} records from each of {args.topics} "
                      f"topic(s), read on the driver{where}")
    for col in ("mode", "range median", "range p95", "batch median", "batch p95"):
        out.add_column(col, justify="right")
    figures = []
    for mode, (ranges, batches) in reads.items():
        cells = [statistics.median(ranges), nearest_rank(ranges, 0.95), statistics.median(batches),
                 nearest_rank(batches, 0.95)]
        out.add_row(mode, *(f"{c * 1000:.1f} ms" for c in cells))
        for label, value in zip(("range median", "range p95", "batch median", "batch p95"), cells, strict=True):
            figures.append(Figure(f"{mode}: {label}", round(value * 1000, 1), "ms"))
    console.print(out)
    console.print(f"result: {write_result('bench_kafka_read', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
