"""The SparkSession: local by default, workers on this interpreter, our topic-log source registered."""

from __future__ import annotations

import logging
import os
import socketserver
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark import SparkConf
from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

from ingest.columns import arrow_type
from ingest.config import IngestConfig, SparkSpec, local_cores
from ingest.ctrl_c import HeldCtrlC
from ingest.lake.location import LakePath
from ingest.source.sources import TopicLogDataSource, decodes_at_read
from ingest.spark import gateway
from ingest.spark.class_archive import java_option
from ingest.spark.jars import Connector, classpath_conf
from ingest.spark.java import check_java

log = logging.getLogger(__name__)

#: The driver JVM's options (``spark.driver.extraJavaOptions``).
DRIVER_JAVA_OPTIONS: Final = "spark.driver.extraJavaOptions"
#: HotSpot compiles with C1 only: a fraction of the compile work, for code that runs a little slower.
#: Stopping at C1 also shrinks the code cache HotSpot reserves from 240 to 48 MB, which a long run
#: of many distinct Spark queries fills ("CodeCache is full. Compiler has been disabled", then
#: method-handle calls fail): the usual 240 MB is kept.
QUICK_JIT: Final = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

def driver_java_options(extra: tuple[tuple[str, str], ...]) -> str:
    """The driver JVM's options: the engine's logging configuration and the class archive
    (:mod:`ingest.spark.class_archive`, when built), then those in ``extra`` (the JVM takes a flag's last
    occurrence, so the user's win)."""

    log_config = Path(__file__).with_name("log4j2.properties")
    own = [f"-Dlog4j2.configurationFile=file:{log_config}"]
    asked = [v for k, v in extra if k == DRIVER_JAVA_OPTIONS]
    if not any("-XX:ArchiveClassesAtExit" in v or "-XX:SharedArchiveFile" in v for v in asked):
        own.append(java_option())
    return " ".join(o for o in [*own, *asked] if o)


#: Hadoop's local file system without checksum files, for FileContexts (which Delta's log store uses,
#: and Spark's checkpoint unless :data:`LOCAL_CHECKPOINTS` applies). Not for FileSystems: S3A casts
#: the local one to the checksummed class.
RAW_LOCAL_FS: Final = "org.apache.hadoop.fs.local.RawLocalFs"

#: Spark's checkpoint files written through Hadoop's FileSystem API rather than FileContexts, for a
#: local checkpoint. Without Hadoop's native library (pyspark ships none), a local FileContext forks
#: ``chmod`` for each file it creates and ``readlink`` for each rename: the offsets and the commit of
#: every micro-batch took 20-24 ms each on an idle machine, 10-13 ms this way
#: (``benchmarks/bench_checkpoint_files.py``). The FileSystem API renames with the operating system's
#: rename, which is atomic on a local disk; its check that no other query wrote the same batch first
#: is not, which the engine's table locks make moot, and checkpoints are disposable. Checkpoints on S3
#: keep Spark's default.
LOCAL_CHECKPOINTS: Final = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"}

#: How many tasks Delta rebuilds a table's snapshot in.
SNAPSHOT_PARTITIONS: Final = "spark.databricks.delta.snapshotPartitions"


def snapshot_tasks(session: SparkSession) -> SparkSession:
    """``session`` rebuilding Delta snapshots in one task per core of its context, unless the user
    set :data:`SNAPSHOT_PARTITIONS` (Delta's default, 50 tasks, dominates a small table's MERGE,
    OPTIMIZE and VACUUM on a small cluster: benchmarks/bench_snapshot_tasks.py).

    The one rule for every session the engine uses: :func:`get_spark`'s (maintenance, queries) and
    the delta-spark engine's own (``newSession``). A local master also gets it in the session
    builder, so every other session of the context (a streaming query's) has it too; a cluster's
    cores are only known once the context runs.
    """
    if session.conf.get(SNAPSHOT_PARTITIONS, None) is None:
        session.conf.set(SNAPSHOT_PARTITIONS, str(session.sparkContext.defaultParallelism))
    return session


@cache
def get_spark(master: str = "local[2]", shuffle_partitions: int = 2,
              extra: tuple[tuple[str, str], ...] = ()) -> SparkSession:
    """One session per process (starting one costs ~5 s), configured for this engine."""
    check_java()
    # Python workers and streaming-source runners must use this venv's interpreter.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    java_opts = driver_java_options(extra)
    options: dict[str, Any] = {
        "spark.master": master,
        "spark.app.name": "cdc-ingest",
        "spark.pyspark.python": sys.executable,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Timestamps in Parquet as int64 microseconds, not Spark's legacy INT96: other Delta readers
        # (delta-rs, polars, DuckDB) read INT96 as nanoseconds, which hold only the years 1677-2262,
        # so a later or earlier value (9999-12-31, PostgreSQL's infinity) read back wrong there.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Arrow batches between the JVM and Python stay far below the 2 GiB per binary column,
        # however large the messages (the decode step bounds its own output the same way).
        "spark.sql.execution.arrow.maxBytesPerBatch": str(256 * 1024 * 1024),
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        # Local files through FileContexts without Hadoop's checksum files: a checkpoint written that
        # way (a user's choice of manager; the engine's own go through FileSystems, LOCAL_CHECKPOINTS)
        # took 41-47 ms of an idle micro-batch for its two writes, 76-82 ms with a .crc beside each
        # (benchmarks/bench_checkpoint_files.py), and delta-spark's log store writes through them too.
        # Renames are the same; S3, HDFS and other schemes are untouched. A user's value wins (extra).
        "spark.hadoop.fs.AbstractFileSystem.file.impl": RAW_LOCAL_FS,
        "spark.driver.memory": "2g",
        DRIVER_JAVA_OPTIONS: java_opts,
    }
    # One task per core for Delta's snapshots in every session of a local context (see snapshot_tasks).
    cores = local_cores(master)
    if cores and SNAPSHOT_PARTITIONS not in dict(extra):
        options[SNAPSHOT_PARTITIONS] = str(cores)
    options |= {key: value for key, value in extra if key != DRIVER_JAVA_OPTIONS}
    # Ctrl-C is held while the session starts, then handed on: cut short, the launch leaves Spark's
    # JVM running after the process, and a KeyboardInterrupt later comes out of a py4j call. A run's
    # start takes the press as a stop; any other command is interrupted once the session is up.
    with HeldCtrlC() as ctrl_c:
        # The context first, as the session's builder would start it: PySpark's handler, which the
        # context puts in place as the last step of its start, is taken back at once, before the
        # session's own start (a second or so, in py4j calls a press would break).
        context = gateway.context(SparkConf().setAll(list(options.items())))
        ctrl_c.reclaim()
        quiet_hangups(context._accumulatorServer)
        spark = SparkSession.builder.config(map=options).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        _leave_sigterm_to_the_driver(spark)
        snapshot_tasks(spark)

        spark.dataSource.register(TopicLogDataSource)
        warm_up(spark)
    return spark


def quiet_hangups(server: socketserver.BaseServer) -> None:
    """The JVM closing its connection to PySpark's accumulator server is not an error to print.

    The server reads the JVM's accumulator updates in a thread of the run's process, and takes the
    end of that connection for a failed request: Python's server prints its traceback (an
    ``EOFError``) on stderr. It was seen when a run stopped on Ctrl-C, its report printed after it.
    The connection's end is logged at debug level instead; the JVM opens a new one for its next
    updates, and any other failure is printed as before.
    """
    loud = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        failure = sys.exc_info()[1]
        if isinstance(failure, EOFError | ConnectionError):
            log.debug("Spark's JVM closed its accumulator connection (%s)", type(failure).__name__)
        else:
            loud(request, client_address)

    server.handle_error = handle_error  # type: ignore[method-assign]


def _leave_sigterm_to_the_driver(spark: SparkSession) -> None:
    """Spark's JVM ignores SIGTERM, as PySpark has it ignore SIGINT: the run stops it (``ingest.cli.outcome``).

    A service manager may send SIGTERM to every process of the service at once (systemd's default
    ``KillMode=control-group``); the JVM then shut down under the run's own stop, which failed on it.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a session's context has its gateway
    jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), jvm.sun.misc.SignalHandler.SIG_IGN)


def _import_decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    # The imports are the point, those the decode step makes lazily on its first batch included:
    # pyarrow imports pandas on its first conversion of Python values (about 0.9 s of a 1.2 s cold
    # first decode, measured in a worker), and the parts' Delta types come from ingest.lake.delta.
    # The Kafka reader's module brings the configuration's models (pydantic) and librdkafka: 0.5-0.9 s.
    import confluent_kafka  # noqa: F401
    import pandas  # noqa: F401

    import ingest.decode.columnar
    import ingest.lake.delta
    import ingest.source.kafkalog
    import ingest.source.reader
    import ingest.source.topiclog  # noqa: F401
    from ingest.heap import freeze_start_up

    yield from batches
    freeze_start_up()  # what the worker imported stays for its life (ingest.heap)


def arrow_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` as a DataFrame whose types are the Delta types the columns stand for.

    The schema is explicit: left to itself, pyspark reads a timestamp without time zone as Spark's
    ``timestamp`` (``spark.sql.timestampType``), and a ``timestamp_ntz`` column would change type.
    """

    # pyspark cannot convert a column of no chunks (a truncate-only batch has no rows): give it one
    rows = table if table.num_rows else table.schema.empty_table()
    return spark.createDataFrame(rows, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True))


def spark_type(delta_type: str) -> str:
    """The Spark SQL type of a Delta type name, as :func:`arrow_frame` gives it."""

    return str(from_arrow_type(arrow_type(delta_type), prefer_timestamp_ntz=True).simpleString())


def warm_up(spark: SparkSession) -> None:
    """Start the Python workers (one per core) with the decode step imported, and the py4j callback
    server foreachBatch needs, as part of the session start.

    A worker's first task otherwise pays its start and the imports (several seconds, more when the
    tables' queries start together), and the first micro-batch of every table with it. Workers are
    reused from then on (``spark.python.worker.reuse``).
    """

    cores = spark.sparkContext.defaultParallelism
    spark.range(0, cores, numPartitions=cores).mapInArrow(_import_decode, "id long").toArrow()
    # foreachBatch calls back into this process through py4j's callback server: start it now, not
    # on the first micro-batch.
    ensure_callback_server_started(spark.sparkContext._gateway)


#: What a session needs to run delta-spark (its jars aside): Delta's SQL extension and catalog.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_conf(user_conf: dict[str, str]) -> dict[str, str]:
    """:data:`DELTA_CONF` added to ``user_conf`` (a user's own SQL extensions are kept)."""
    extensions = [e for e in user_conf.get("spark.sql.extensions", "").split(",") if e]
    if DELTA_CONF["spark.sql.extensions"] not in extensions:
        extensions.append(DELTA_CONF["spark.sql.extensions"])
    return {"spark.sql.catalog.spark_catalog": DELTA_CONF["spark.sql.catalog.spark_catalog"],
            **user_conf, "spark.sql.extensions": ",".join(extensions)}


def session_conf(connectors: list[Connector], user_conf: dict[str, str]) -> dict[str, str]:
    """Spark settings for ``connectors``: their jars, and Delta's extension when delta-spark is one."""
    conf = {**user_conf, **classpath_conf(connectors, user_conf)}
    return delta_conf(conf) if "delta-spark" in connectors else conf


def quick_jit(config: IngestConfig, connectors: list[Connector], *, draining: bool = False) -> bool:
    """Whether the driver JVM compiles with C1 only (``spark.jit``; see :func:`session_for`)."""

    if config.spark.jit != "auto":
        return config.spark.jit == "quick"
    if "spark-kafka" in connectors and not decodes_at_read(config):
        return False  # Spark's Kafka source reads in the JVM
    return draining or "delta-spark" not in connectors


def session_for(config: IngestConfig, *, draining: bool = False) -> SparkSession:
    """The session for a configuration: its Spark settings, plus the Kafka source's jars when it reads
    Kafka, delta-spark's when a table is applied with it, and S3A's when that table or the streaming
    checkpoints are on S3.

    The driver JVM compiles with C1 only (:data:`QUICK_JIT`) under ``spark.jit: auto`` unless Spark's
    Kafka source reads in it, or a table applies with delta-spark and the process is not a run that
    drains (``draining``: a continuous run, maintenance and the other commands keep the full JIT). On a
    200k-record backlog the C2 compiler took about half the JVM's CPU when the JVM only planned the
    batches (every table on delta-rs), and more than a third when it MERGEd them with delta-spark, and
    the run that drained was not faster for it (``benchmarks/bench_compare.py --jit``). A process's
    first session fixes its JVM's options; a later one with other settings shares that JVM.
    """
    spec = config.spark
    connectors = connectors_of(config)
    conf = session_conf(connectors, spec.conf)
    if config.checkpoint_location.is_local:
        conf = {**LOCAL_CHECKPOINTS, **conf}  # a user's own value wins
    if quick_jit(config, connectors, draining=draining):
        conf[DRIVER_JAVA_OPTIONS] = f"{QUICK_JIT} {conf.get(DRIVER_JAVA_OPTIONS, '')}".strip()
    return get_spark(spec.master, spec.shuffle_partitions, tuple(sorted(conf.items())))


def connectors_of(config: IngestConfig) -> list[Connector]:
    """The JVM connectors a run of ``config`` puts on Spark's classpath: Spark's Kafka source for a
    Kafka source, delta-spark for its tables, Hadoop's S3A for delta-spark on S3 or checkpoints on S3."""
    connectors: list[Connector] = ["spark-kafka"] if config.source.kind == "kafka" else []
    if "delta-spark" in config.writers():
        connectors.append("delta-spark")
    if ("delta-spark" in config.writers() and not config.lake_is_local) or not config.checkpoint_location.is_local:
        connectors.append("hadoop-aws")
    return connectors


def use_s3a(spark: SparkSession, where: LakePath) -> None:
    """Let Spark reach ``where``'s bucket: its endpoint, region, addressing and keys, per bucket.

    The settings go into the running context's Hadoop configuration, keyed by bucket
    (``fs.s3a.bucket.<bucket>.*``), so one session reaches lakes on different endpoints. The keys are
    read from this process's environment now: the JVM's own environment was fixed when it started.
    """
    options, bucket = where.options, where.bucket
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    prefix = f"fs.s3a.bucket.{bucket}."
    endpoint = options.get("AWS_ENDPOINT_URL")
    settings = {"endpoint.region": options.get("AWS_REGION", "us-east-1"),
                "path.style.access": "false" if options.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST") == "true" else "true"}
    if endpoint:
        settings["endpoint"] = endpoint
        settings["connection.ssl.enabled"] = "false" if endpoint.startswith("http://") else "true"
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        token = os.environ.get("AWS_SESSION_TOKEN")
        settings.update({"access.key": key, "secret.key": secret, "aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider" if token else
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider")})
        if token:
            settings["session.token"] = token
    for name, value in settings.items():
        conf.set(prefix + name, value)


def spark_location(spark: SparkSession, where: LakePath) -> str:
    """``where`` as Spark reads it, its bucket's S3A settings in place when it is on S3."""
    if not where.is_local:
        use_s3a(spark, where)
    return where.spark_uri


def delta_session(spec: SparkSpec | None = None, *, s3: bool = False) -> SparkSession:
    """A session that reads and writes delta-spark tables, with ``spec``'s settings (default: local).

    For the commands that meet a table with deletion vectors outside a run (``ingest changes``,
    maintenance), whatever engine the configuration names; ``s3``: with S3A's jars, for a lake on S3.
    """
    spec = spec or SparkSpec()
    conf = session_conf(["delta-spark", "hadoop-aws"] if s3 else ["delta-spark"], spec.conf)
    return get_spark(spec.master, spec.shuffle_partitions, tuple(sorted(conf.items())))
