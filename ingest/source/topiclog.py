"""The embedded topic log: a stand-in for Kafka on local disk.

On-disk format (documented in ``docs/topic-log.md``)::

    <root>/topics/<topic>/topic.json                       {"partitions": N}
    <root>/topics/<topic>/<partition>/<first>-<next>.arrow one segment per append

A segment is an Arrow IPC file holding records ``first .. next-1`` of one partition with Kafka's
record fields (offset, key, value, timestamp, timestampType, headers). Offsets are contiguous per
partition: a segment's ``first`` is the previous segment's ``next``. An append writes a hidden
temporary file, fsyncs it and renames it into place under a per-topic lock, so a crashed writer
never leaves a half segment visible (readers ignore hidden files).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from ingest.errors import TopicLogError
from ingest.lake.locks import exclusive

#: Record schema inside a segment (topic and partition are implied by the path).
SEGMENT_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)

#: Row shape of Spark's Kafka source, column for column; the Spark reader emits exactly this.
KAFKA_ROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SEGMENT = re.compile(r"^(\d{20})-(\d{20})\.arrow$")
CREATE_TIME = 0  # Kafka's timestampType for producer-set timestamps


def validate_topic_name(topic: str) -> str:
    """Apply Kafka's topic-name rules, which also keep names safe as directory names."""
    if not _TOPIC_NAME.match(topic) or topic in {".", ".."}:
        raise TopicLogError(
            f"invalid topic name {topic!r}: use 1-249 characters from [A-Za-z0-9._-], not '.' or '..'"
        )
    return topic


@dataclass(frozen=True, slots=True)
class ProducerRecord:
    """A record to append: Kafka's producer-side fields."""

    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's default partitioner), as a signed 32-bit int."""
    length = len(data)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """Partition a keyed record lands in, as Kafka's default partitioner chooses it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class TopicLog:
    """Read and append records of the embedded topic log rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # -- topics -----------------------------------------------------------------------------
    def _topic_dir(self, topic: str) -> Path:
        return self.root / "topics" / validate_topic_name(topic)

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` partitions; a no-op if it exists with that count."""
        if partitions < 1:
            raise TopicLogError(f"topic {topic!r}: partitions must be >= 1, got {partitions}")
        folder = self._topic_dir(topic)
        with self._locked(topic):
            meta = folder / "topic.json"
            if meta.exists():
                existing = self.partitions(topic)
                if existing != partitions:
                    raise TopicLogError(
                        f"topic {topic!r} exists with {existing} partitions, not {partitions}"
                    )
                return
            for p in range(partitions):
                (folder / str(p)).mkdir(parents=True, exist_ok=True)
            _write_json_atomic(meta, {"partitions": partitions})

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` and its records, as Kafka's topic deletion does; a no-op if it does not exist.
        A topic created again under its name starts at offset 0."""
        with self._locked(topic):
            folder = self._topic_dir(topic)
            (folder / "topic.json").unlink(missing_ok=True)  # first: a half-deleted topic does not exist
            shutil.rmtree(folder, ignore_errors=True)

    def topics(self) -> list[str]:
        folder = self.root / "topics"
        if not folder.exists():
            return []
        return sorted(p.name for p in folder.iterdir() if (p / "topic.json").exists())

    def partitions(self, topic: str) -> int:
        meta = self._topic_dir(topic) / "topic.json"
        try:
            return int(json.loads(meta.read_text())["partitions"])
        except FileNotFoundError:
            raise TopicLogError(f"topic {topic!r} does not exist in {self.root}") from None

    def exists(self, topic: str) -> bool:
        return (self._topic_dir(topic) / "topic.json").exists()

    # -- segments ---------------------------------------------------------------------------
    def _segments(self, topic: str, partition: int) -> list[tuple[int, int, Path]]:
        folder = self._topic_dir(topic) / str(partition)
        if not folder.exists():
            raise TopicLogError(f"topic {topic!r} has no partition {partition}")
        segments = []
        for entry in os.scandir(folder):
            m = _SEGMENT.match(entry.name)
            if m:
                segments.append((int(m.group(1)), int(m.group(2)), Path(entry.path)))
        segments.sort()
        expected = 0
        for first, nxt, path in segments:
            if first != expected:
                raise TopicLogError(
                    f"topic {topic!r} partition {partition}: segment {path.name} starts at {first}, "
                    f"expected {expected} (offsets must be contiguous)"
                )
            expected = nxt
        return segments

    def start_offsets(self, topic: str) -> dict[int, int]:
        """First offset per partition: 0, the log keeps every record."""
        return dict.fromkeys(self.end_offsets(topic), 0)

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written, per partition (Kafka's log-end offset)."""
        return {p: self._end_offset(topic, p) for p in range(self.partitions(topic))}

    def _end_offset(self, topic: str, partition: int) -> int:
        segments = self._segments(topic, partition)
        return segments[-1][1] if segments else 0

    @contextmanager
    def _locked(self, topic: str) -> Iterator[None]:
        with exclusive(self._topic_dir(topic) / ".lock"):
            yield

    def append(self, topic: str, records: Sequence[ProducerRecord]) -> dict[int, tuple[int, int]]:
        """Append ``records`` (in order within each partition) and return ``{partition: (first, next)}``.

        Each partition's share is one segment made visible by a single rename, so readers see all
        of it or none of it.
        """
        partitions = self.partitions(topic)
        by_partition: dict[int, list[ProducerRecord]] = {}
        for rec in records:
            if not 0 <= rec.partition < partitions:
                raise TopicLogError(
                    f"topic {topic!r} has partitions 0..{partitions - 1}; record names partition {rec.partition}"
                )
            by_partition.setdefault(rec.partition, []).append(rec)
        written: dict[int, tuple[int, int]] = {}
        with self._locked(topic):
            for partition, recs in sorted(by_partition.items()):
                first = self._end_offset(topic, partition)
                table = pa.table(
                    {
                        "offset": pa.array(range(first, first + len(recs)), pa.int64()),
                        "key": pa.array([r.key for r in recs], pa.binary()),
                        "value": pa.array([r.value for r in recs], pa.binary()),
                        "timestamp": pa.array([r.timestamp_ms for r in recs], pa.int64()).cast(
                            pa.timestamp("ms", tz="UTC")
                        ),
                        "timestampType": pa.array([CREATE_TIME] * len(recs), pa.int32()),
                        "headers": pa.array(
                            [[{"key": k, "value": v} for k, v in r.headers] for r in recs],
                            SEGMENT_SCHEMA.field("headers").type,
                        ),
                    },
                    schema=SEGMENT_SCHEMA,
                )
                folder = self._topic_dir(topic) / str(partition)
                final = folder / f"{first:020d}-{first + len(recs):020d}.arrow"
                tmp = folder / f".tmp-{os.getpid()}-{final.name}"
                with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, SEGMENT_SCHEMA) as writer:
                    writer.write_table(table)
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                os.rename(tmp, final)
                written[partition] = (first, first + len(recs))
            _fsync_dir(self._topic_dir(topic))
        return written

    def read(self, topic: str, partition: int, start: int, end: int) -> pa.Table:
        """Records ``start <= offset < end`` of one partition, in Spark's Kafka row shape."""
        if start > end:
            raise TopicLogError(f"topic {topic!r} partition {partition}: start {start} > end {end}")
        pieces = []
        for first, nxt, path in self._segments(topic, partition):
            if nxt <= start or first >= end:
                continue
            with pa.memory_map(str(path)) as source:
                seg = ipc.open_file(source).read_all()
            lo, hi = max(start, first) - first, min(end, nxt) - first
            pieces.append(seg.slice(lo, hi - lo))
        records = pa.concat_tables(pieces) if pieces else SEGMENT_SCHEMA.empty_table()
        if records.num_rows != end - start and end > start:
            available = self._end_offset(topic, partition)
            raise TopicLogError(
                f"topic {topic!r} partition {partition}: asked for offsets {start}..{end - 1}, "
                f"the log ends at {available - 1}"
            )
        n = records.num_rows
        return pa.table(
            {
                "key": records["key"],
                "value": records["value"],
                "topic": pa.array([topic] * n, pa.string()),
                "partition": pa.array([partition] * n, pa.int32()),
                "offset": records["offset"],
                "timestamp": records["timestamp"].cast(pa.timestamp("us", tz="UTC")),
                "timestampType": records["timestampType"],
                "headers": records["headers"],
            },
            schema=KAFKA_ROW_SCHEMA,
        )


def _write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
