"""What one MERGE costs as the table grows: a 10k-change batch into 200k, 2M and 20M rows (not a test).

The table is laid out by primary key (rows written in key order, files of ``target_file_size``), as
the engine's own writes and the ``zorder`` maintenance leave it. Two batches of changes, each applied
through the engine's whole driver path (parts -> reduce -> plan -> delta-rs MERGE -> audit):

* **hot set**: the usual OLTP shape -- 80 % updates of the most recent 50,000 keys, 20 % new keys.
  The MERGE prunes files by key range, so it rewrites the few newest files: its cost should follow
  the batch, not the table (target: at most 1.5x from 200k to 20M rows).
* **random keys**: updates spread over the whole key space. delta-rs writes copy-on-write (no
  deletion vectors), so every file holding a touched key is rewritten: the cost grows with the
  table. Reported, not a target for delta-rs.
* **new keys**: inserts of keys the table does not hold (an initial snapshot that spans many
  batches, an append-only table). delta-spark appends such a batch instead of merging it
  (:func:`ingest.commit.writer.may_append`); with ``--engine delta-spark`` the same batches are also
  run with that turned off (**new keys, merged**: patched here, not a setting), round by round in
  turn, to show what the append saves.

With ``--engine delta-spark`` the random batches also take turns with **random, unlisted**: the
same MERGE without the batch's keys listed in its condition (``spark_merge.KEY_LIST_LIMIT``; patched
here, not a setting), to show what the list saves, with **random, bare MERGE**: the same after-images
merged by a plain delta-spark MERGE a user would write (update all by key, insert the rest; no
reduce, position guard, audit or progress), the floor delta-spark itself sets, and with
**random, driver lookup**: the batch's
stored rows read on the driver however many rows their key range reaches
(``target.driver_lookup_rows``, patched likewise), the baseline of reading them on the
executors. Each table's first round of batches warms it and the session up and is not counted
(the first table's would carry the JVM's warm-up). Every batch's **driver memory** is reported
too: how far the driver process's resident memory rose above where it was when the batch began
(sampled every 10 ms, Linux's ``/proc``).

``--history-mode scd2`` keeps every version (the table starts with one current version per key);
``--history-mode both`` runs scd1 and scd2 on tables of each size side by side and prints what
keeping the history costs per batch (scd2 / scd1).

``--lake s3`` puts the tables on an S3 API server on loopback (``harness/src/harness/stack/s3.py``, started by
the script; ``--s3-endpoint URL`` uses one already running, such as MinIO) and ``--lake both`` runs
the local disk and S3 side by side on the same batches: what a MERGE costs on an object store.

``--engine delta-spark`` commits with delta-spark's MERGE instead, the table's deletion vectors on
(the table is built by delta-rs, then ``delta.enableDeletionVectors`` is set with Spark SQL, as a
user converting a delta-rs table would): an update or delete marks the old row in a vector file
instead of rewriting its file. Its target is the random batch: at most 1.5x from 200k to 20M rows.
On two cores that is beyond delta-spark itself: compare the growth of **random, bare MERGE**, the
floor a plain delta-spark MERGE of the same batches sets.

    .venv/bin/python benchmarks/bench_merge.py [--sizes 200000,2000000,20000000] [--rounds 3]
                                               [--engine delta-rs|delta-spark]
                                               [--history-mode scd1|scd2|both]
                                               [--lake local|s3|both] [--s3-endpoint URL]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from unittest.mock import patch

import pyarrow as pa
from deltalake import write_deltalake
from record import Figure, changed_options, write_result
from rich.console import Console
from rich.table import Table

from ingest.apply.journey import apply_parts
from ingest.columns import FRAMEWORK_COLUMNS, HISTORY_COLUMNS
from ingest.commit.delta_rs import DeltaRsWriter
from ingest.commit.writer import Writer
from ingest.config import TableSpec, TargetSpec
from ingest.decode.parts import PartsBuilder
from ingest.lake.delta import open_table
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath, delta_storage_options
from ingest.model import ChangeEvent, ColumnSpec, SourcePosition

console = Console(width=200)  # the table's many columns, also when written to a file
COLUMNS = (ColumnSpec("id", "long", False), ColumnSpec("customer_id", "integer"), ColumnSpec("amount", "decimal(12,2)"),
           ColumnSpec("status", "string"), ColumnSpec("note", "string"))
SPEC = TableSpec(name="orders", topic="orders")
STATUSES = ("pending", "paid", "shipped", "cancelled")
HOT = 50_000


def note(seed: int) -> str:
    """A free-text column of 40-odd characters that compresses like real text, not like a counter."""
    return f"deliver to door {seed % 9973}, ref {(seed * 2654435761) % 4294967296:010d}-{seed % 7919:04d}"


class Source:
    """Changes of ``orders`` at increasing positions, as the decode step's parts."""

    def __init__(self, rows: int) -> None:
        self.lsn = rows + 10
        self.offset = 0
        self.next_id = rows

    def parts(self, keys: list[int]) -> list[pa.RecordBatch]:
        n = len(keys)
        source = pa.table({"topic": pa.array(["orders"] * n), "partition": pa.array([0] * n, pa.int32()),
                           "offset": pa.array(range(self.offset, self.offset + n), pa.int64()),
                           "timestamp": pa.array([datetime.now(UTC)] * n, pa.timestamp("us", tz="UTC"))})
        out = PartsBuilder(source)
        for row, key in enumerate(keys):
            self.lsn += 1
            after = {"id": key, "customer_id": key % 997, "amount": Decimal(self.lsn % 100_000).scaleb(-2),
                     "status": STATUSES[self.lsn % 4], "note": note(key * 31 + self.lsn)}
            out.change(ChangeEvent("u", {"id": key}, after, None, SourcePosition(self.lsn, self.lsn, 0, 1), COLUMNS,
                                   ("id",), source_ts_ms=1_767_225_600_000), row)
        self.offset += n
        return out.parts()


@dataclass(frozen=True)
class Variant:
    """One way of keeping the table: its history mode and where the lake is."""

    label: str
    mode: str
    lake: str


def lake_root(lake: str, workdir: Path, rows: int, endpoint: str | None) -> LakePath:
    """A fresh, empty place for one table size: a directory, or a new prefix in the S3 bucket."""
    if lake == "local":
        shutil.rmtree(workdir / str(rows), ignore_errors=True)
        return LakePath.local_dir(workdir / str(rows))
    options = delta_storage_options(endpoint_url=endpoint, region=os.environ.get("AWS_REGION", "us-east-1"),
                                    path_style=True, allow_http=bool(endpoint and endpoint.startswith("http://")))
    return LakePath(f"s3://{BUCKET}/{rows}-{uuid.uuid4().hex[:8]}", options)


BUCKET = "bench-merge"


def build(root: LakePath, rows: int, file_mb: int, spec: TableSpec = SPEC) -> tuple[TablePaths, Source]:
    """A table of ``rows`` rows in key order, created by the engine and filled in bulk (scd2: each
    row its key's one current version)."""
    paths = TablePaths(root / "orders", root / "_cdc_tombstones" / "orders", root / "_cdc_audit",
                       root / "_cdc_quarantine")
    source = Source(rows)
    engine = DeltaRsWriter(target_file_size=file_mb * 1024 * 1024)
    apply_parts(spec, paths, source.parts([rows + 10_000_000]), batch_id=0, run_id="build",  # engine-made table
                writer=engine)
    table = open_table(paths.table)
    assert table is not None
    schema = pa.schema(table.schema().to_arrow())
    chunk = 1_000_000
    for start in range(0, rows, chunk):
        ids = pa.array(range(start, min(rows, start + chunk)), pa.int64())
        n = len(ids)
        data = {
            "id": ids, "customer_id": pa.compute.cast(pa.compute.bit_wise_and(ids, 1023), pa.int32()),
            "amount": pa.array([Decimal(i % 100_000).scaleb(-2) for i in range(n)], pa.decimal128(12, 2)),
            "status": pa.array([STATUSES[i % 4] for i in range(n)]),
            "note": pa.array([note(i * 17) for i in range(start, start + n)]),
            "_cdc_op": pa.array(["r"] * n), "_cdc_position": pa.array([SourcePosition(5, i + 1, 0, 0).encode()
                                                                       for i in range(start, start + n)]),
        }
        for name, typ in FRAMEWORK_COLUMNS + (HISTORY_COLUMNS if spec.history_mode == "scd2" else ()):
            data.setdefault(name, pa.nulls(n, typ))
        data["_cdc_deleted"] = pa.array([False] * n)
        if spec.history_mode == "scd2":
            data["_cdc_is_current"] = pa.array([True] * n)
            data["_cdc_valid_from"] = pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * n, pa.timestamp("us", tz="UTC"))
        write_deltalake(table, pa.table(data).select(schema.names).cast(schema), mode="append",
                        target_file_size=file_mb * 1024 * 1024)
        console.print(f"  built {min(rows, start + chunk):,} of {rows:,} rows")
    return paths, source


def make_engine(name: str, file_mb: int) -> Writer:
    if name == "delta-rs":
        return DeltaRsWriter(target_file_size=file_mb * 1024 * 1024)
    from ingest.commit.delta_spark import DeltaSparkWriter
    from ingest.spark.session import get_spark, session_conf

    spark = get_spark("local[2]", 2, tuple(sorted(session_conf(["delta-spark", "hadoop-aws"], {}).items())))
    return DeltaSparkWriter(spark)


def enable_deletion_vectors(engine: Writer, paths: TablePaths) -> None:
    from ingest.commit.delta_spark import DeltaSparkWriter
    from ingest.spark.session import spark_location
    from ingest.spark.sql import ident

    if isinstance(engine, DeltaSparkWriter):
        engine.spark.sql(f"ALTER TABLE delta.{ident(spark_location(engine.spark, paths.table))} "
                         "SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")


def rewritten(metrics: dict[str, str]) -> tuple[int, int]:
    """Files a MERGE rewrote and deletion vectors it wrote (delta-rs and delta-spark name them apart)."""
    files = metrics.get("num_target_files_removed", metrics.get("numTargetFilesRemoved", 0))
    return int(files), int(metrics.get("numTargetDeletionVectorsAdded", 0))


def _baseline(kind: str, engine: Writer) -> AbstractContextManager[object]:
    """The delta-spark engine patched for a baseline kind (not settings): *new keys, merged* merges
    every batch, new keys only included (the baseline of the append); *random, unlisted* lists no
    keys in the MERGE's condition (the baseline of the list); *random, driver lookup* reads the
    batch's stored rows on the driver however large their range (the baseline of the executors')."""
    from ingest.commit import delta_spark, spark_merge

    if kind.endswith("merged"):
        return patch.object(delta_spark, "may_append", lambda *_args, **_kwargs: False)
    if kind.endswith("unlisted"):
        return patch.object(spark_merge, "DIALECT", replace(spark_merge.DIALECT, key_list_limit=0))
    if kind.endswith("driver lookup"):
        return patch.object(engine, "driver_lookup_rows", 10**18)
    return nullcontext()


def bare_merge(engine: Writer, paths: TablePaths, parts: list[pa.RecordBatch]) -> None:
    """The batch's after-images merged by key with delta-spark and nothing else (*random, bare MERGE*)."""
    from delta.tables import DeltaTable

    from ingest.apply.batch import MicroBatch
    from ingest.commit.state import TableState
    from ingest.spark.session import arrow_frame, spark_location

    spark = engine.session()  # type: ignore[attr-defined]
    names = [c.name for c in COLUMNS] + ["_cdc_position"]
    rows = MicroBatch.from_parts(parts, TableState(None, None, None, None)).changes.select(names)
    source = arrow_frame(spark, rows)
    values = {n: f"s.{n}" for n in names}
    (DeltaTable.forPath(spark, spark_location(spark, paths.table)).alias("t").merge(source.alias("s"), "t.id = s.id")
     .whenMatchedUpdate(set=values).whenNotMatchedInsert(values={**values, "_cdc_deleted": "false"}).execute())


class DriverMemory:
    """How far this process's resident memory rose during a block, above where it began (MiB)."""

    def __enter__(self) -> DriverMemory:
        self.start = self.peak = _resident()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, _resident())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()
        self.peak = max(self.peak, _resident())

    @property
    def rose_mib(self) -> float:
        return (self.peak - self.start) / 2**20


def _resident() -> int:
    """Bytes this process holds in memory now (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def batch_keys(kind: str, rows: int, source: Source, size: int, rng: random.Random) -> list[int]:
    if kind.startswith("random"):
        return rng.sample(range(rows), size)
    if kind.startswith("new keys"):
        source.next_id += size
        return list(range(source.next_id - size, source.next_id))
    updates = rng.sample(range(max(0, source.next_id - HOT), source.next_id), int(size * 0.8))
    inserts = list(range(source.next_id, source.next_id + size - len(updates)))
    source.next_id += len(inserts)
    return updates + inserts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200000,2000000,20000000")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--file-mb", type=int, default=TargetSpec().target_file_size_mb,
                        help="target file size of the table (default: the engine's target.target_file_size_mb)")
    parser.add_argument("--workdir", type=Path, default=Path("bench-work/merge"))
    parser.add_argument("--engine", choices=["delta-rs", "delta-spark"], default="delta-rs")
    parser.add_argument("--history-mode", choices=["scd1", "scd2", "both"], default="scd1")
    parser.add_argument("--lake", choices=["local", "s3", "both"], default="local",
                        help="where the table lives: local disk, an S3 API server on loopback, or both side by side")
    parser.add_argument("--s3-endpoint", help="an S3 endpoint already running (default: start one); credentials "
                        "from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()  # Spark SQL reads delta.`<path>` as a table name unless it is absolute
    modes = ["scd1", "scd2"] if args.history_mode == "both" else [args.history_mode]
    lakes = ["local", "s3"] if args.lake == "both" else [args.lake]
    variants = [Variant(" ".join(x for x, many in ((mode, len(modes) > 1), (lake, len(lakes) > 1)) if many),
                        mode, lake) for mode in modes for lake in lakes]
    server = None
    endpoint = args.s3_endpoint
    if "s3" in lakes:
        from harness.stack.s3 import S3Server, create_bucket

        if endpoint is None:
            server = S3Server(Path(tempfile.mkdtemp(prefix="bench-s3-"))).start()
            os.environ.update(server.environment)
            endpoint = server.endpoint
            console.print(f"S3 API server (moto) on {endpoint}")
            server.create_bucket(BUCKET)
        else:
            create_bucket(endpoint, BUCKET)
    try:
        figures = _run(args, variants, endpoint)
    finally:
        if server is not None:
            server.stop()
    variant = changed_options(parser, args, ["workdir", "s3_endpoint"])
    console.print(f"result: {write_result('bench_merge', variant, figures)}")


def _run(args: argparse.Namespace, variants: list[Variant], endpoint: str | None) -> list[Figure]:
    """Every variant's batches, their table printed; returns the figures it printed."""
    results: dict[tuple[int, str], list[float]] = {}
    files: dict[tuple[int, str], list[int]] = {}
    vectors: dict[tuple[int, str], list[int]] = {}
    memory: dict[tuple[int, str], list[float]] = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    for rows in sizes:
        for variant in variants:
            rng = random.Random(7)  # every variant gets the same batches
            spec = SPEC.model_copy(update={"history_mode": variant.mode})
            console.print(f"table of {rows:,} rows, {variant.mode}, {variant.lake} lake")
            paths, source = build(lake_root(variant.lake, args.workdir, rows, endpoint), rows, args.file_mb, spec)
            engine = make_engine(args.engine, args.file_mb)
            enable_deletion_vectors(engine, paths)
            table = open_table(paths.table)
            assert table is not None
            table_files = len(table.file_uris())
            groups = [["hot set"], ["random"], ["new keys"]]
            if args.engine == "delta-spark":
                groups[1] += ["random, unlisted", "random, driver lookup", "random, bare MERGE"]
                groups[-1].append("new keys, merged")
            for group in groups:
                for n in range(args.rounds + 1):  # round 0 warms the table and session up, not counted
                    for kind in group:  # the kinds of a group take turns, round by round
                        label = f"{kind} {variant.label}".strip()
                        parts = source.parts(batch_keys(kind, rows, source, args.batch, rng))
                        with _baseline(kind, engine), DriverMemory() as driver:
                            t0 = time.perf_counter()
                            record = None
                            if kind.endswith("bare MERGE"):
                                bare_merge(engine, paths, parts)
                            else:
                                record = apply_parts(spec, paths, parts, batch_id=n + 1, run_id="bench",
                                                     writer=engine).record
                                assert record is not None and record.balanced
                            seconds = time.perf_counter() - t0
                        table = open_table(paths.table)
                        assert table is not None
                        newest = table.history(1)[0]
                        touched, dvs = rewritten(newest.get("operationMetrics", {}))
                        if n:
                            results.setdefault((rows, label), []).append(seconds)
                            files.setdefault((rows, label), []).append(touched)
                            vectors.setdefault((rows, label), []).append(dvs)
                            memory.setdefault((rows, label), []).append(driver.rose_mib)
                        counted = f"{record.updated} updated, {record.inserted} inserted" if record else "not counted"
                        console.print(f"  {label}: {seconds:.2f} s ({newest['operation']}), {counted}, "
                                      f"files rewritten {touched} of {table_files}, "
                                      f"deletion vectors {dvs}, driver memory +{driver.rose_mib:,.0f} MiB"
                                      + ("" if n else " (warm-up)"))
            if variant.lake == "local":
                shutil.rmtree(args.workdir / str(rows), ignore_errors=True)
    if len(variants) > 1:
        return _compare(results, sizes, args, [v.label for v in variants])
    out = Table(title=f"A {args.batch:,}-change batch through the engine's {args.engine} path "
                      f"(median of {args.rounds})")
    news = [k for k in ("new keys", "new keys, merged") if (sizes[0], k) in results]
    unlisted = [k for k in ("random, unlisted",) if (sizes[0], k) in results]
    lookups = [k for k in ("random, driver lookup",) if (sizes[0], k) in results]
    bare = [k for k in ("random, bare MERGE",) if (sizes[0], k) in results]
    for col in ("table rows", "hot set", "files rewritten", "random keys", "files rewritten ",
                "deletion vectors", "driver memory", *unlisted, *(f"{k}{c}" for k in lookups
                                                                  for c in ("", ": driver memory")), *bare, *news):
        out.add_column(col, justify="right")
    for rows in sizes:
        hot, rnd = results[(rows, "hot set")], results[(rows, "random")]
        hot_files, rnd_files = files[(rows, "hot set")], files[(rows, "random")]
        out.add_row(f"{rows:,}", f"{statistics.median(hot):.2f} s", str(int(statistics.median(hot_files))),
                    f"{statistics.median(rnd):.2f} s", str(int(statistics.median(rnd_files))),
                    str(int(statistics.median(vectors[(rows, "random")]))), _mib(memory[(rows, "random")]),
                    *(f"{statistics.median(results[(rows, k)]):.2f} s" for k in unlisted),
                    *(cell for k in lookups for cell in (f"{statistics.median(results[(rows, k)]):.2f} s",
                                                         _mib(memory[(rows, k)]))),
                    *(f"{statistics.median(results[(rows, k)]):.2f} s" for k in (*bare, *news)))
    console.print(out)
    figures = [figure for (rows, kind), seconds in results.items() for figure in (
        Figure(f"{rows:,} rows, {kind}: batch time", round(statistics.median(seconds), 2), "s"),
        Figure(f"{rows:,} rows, {kind}: files rewritten", int(statistics.median(files[(rows, kind)]))),
        Figure(f"{rows:,} rows, {kind}: driver memory", round(statistics.median(memory[(rows, kind)])), "MiB"))]

    def ratio(name: str, value: float) -> float:
        figures.append(Figure(name, round(value, 2), "x"))
        return value

    first, last = sizes[0], sizes[-1]
    for kind in ("hot set", "random", *unlisted, *bare, *news[:1]):
        growth = ratio(f"{kind}, {last:,} rows / {first:,} rows",
                       statistics.median(results[(last, kind)]) / statistics.median(results[(first, kind)]))
        target = " (target <= 1.5x)" if kind == "hot set" or (kind == "random" and args.engine == "delta-spark") else ""
        console.print(f"{kind}, {last:,} rows / {first:,} rows: {growth:.2f}x{target}")
    for rows in sizes if unlisted else []:
        listed = ratio(f"random keys into {rows:,} rows: keys listed / unlisted",
                       statistics.median(results[(rows, "random")]) / statistics.median(results[(rows, unlisted[0])]))
        console.print(f"random keys into {rows:,} rows: keys listed / unlisted {listed:.2f}x")
    for rows in sizes if bare else []:
        over = ratio(f"random keys into {rows:,} rows: the engine / a bare delta-spark MERGE",
                     statistics.median(results[(rows, "random")]) / statistics.median(results[(rows, bare[0])]))
        console.print(f"random keys into {rows:,} rows: the engine / a bare delta-spark MERGE {over:.2f}x")
    for rows in sizes if lookups else []:
        on_executors = ratio(f"random keys into {rows:,} rows: stored rows read on the executors / on the driver",
                             statistics.median(results[(rows, "random")])
                             / statistics.median(results[(rows, lookups[0])]))
        console.print(f"random keys into {rows:,} rows: stored rows read on the executors / on the driver "
                      f"{on_executors:.2f}x the time, driver memory {_mib(memory[(rows, 'random')])} against "
                      f"{_mib(memory[(rows, lookups[0])])}")
    if len(news) == 2:
        for rows in sizes:
            saved = ratio(f"new keys into {rows:,} rows: merged / appended",
                          statistics.median(results[(rows, news[1])]) / statistics.median(results[(rows, news[0])]))
            console.print(f"new keys into {rows:,} rows: merged / appended {saved:.2f}x")
    return figures


def _mib(samples: list[float]) -> str:
    return f"+{statistics.median(samples):,.0f} MiB"


def _compare(results: dict[tuple[int, str], list[float]], sizes: list[int], args: argparse.Namespace,
             labels: list[str]) -> list[Figure]:
    """The variants' batches side by side (scd1/scd2, local/s3), each against the first one."""
    figures: list[Figure] = []
    out = Table(title=f"A {args.batch:,}-change batch, {', '.join(labels)}, through the engine's {args.engine} "
                      f"path (median of {args.rounds})")
    for col in ("table rows", "keys", *labels, *(f"{label} / {labels[0]}" for label in labels[1:])):
        out.add_column(col, justify="right")
    for rows in sizes:
        for kind in ("hot set", "random"):
            medians = [statistics.median(results[(rows, f"{kind} {label}")]) for label in labels]
            out.add_row(f"{rows:,}", kind, *(f"{m:.2f} s" for m in medians),
                        *(f"{m / medians[0]:.2f}x" for m in medians[1:]))
            for label, m in zip(labels, medians, strict=True):
                figures.append(Figure(f"{rows:,} rows, {kind}, {label}", round(m, 2), "s"))
                if label != labels[0]:
                    share = round(m / medians[0], 2)
                    figures.append(Figure(f"{rows:,} rows, {kind}, {label} / {labels[0]}", share, "x"))
    console.print(out)
    return figures


if __name__ == "__main__":
    main()
