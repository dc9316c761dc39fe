"""JVM connectors the engine puts on Spark's classpath, resolved from a Maven repository by Spark's own Ivy.

Three connectors, each needed only by some configurations (:func:`ingest.spark.session.session_for`):
Spark's Kafka source, delta-spark, and Hadoop's S3A file system. Their coordinates are pinned below
(:data:`PACKAGES`) to the Spark that pyproject.toml pins (4.2, Scala 2.13), and nothing in them
depends on the repository: an installed wheel resolves them the same way.

Resolution is Spark's ``spark.jars.packages`` (with ``spark.jars.excludes``), run once per connector
in a short-lived Spark gateway JVM (:mod:`ingest.spark.ivy`), never in the session itself:

- Ivy's settings are a file this module writes into the cache directory, naming one repository
  (Maven Central, or the mirror in ``$INGEST_MAVEN_REPOSITORY``). Spark's built-in chain also looks
  in ``~/.m2``, and a local Maven repository holding a pom without its jar (what building anything
  with Maven leaves behind) makes its resolution fail (``download failed: ...slf4j-api.jar``).
- What Ivy resolved is recorded beside its cache (``<connector>.classpath``, paths relative to the
  cache directory), and a session gets those files in ``spark.jars``. Ivy's resolution, even from a
  warm cache, costs seconds that every session start would otherwise pay.

The cache directory is ``$INGEST_JARS_CACHE``, else ``$XDG_CACHE_HOME/cdc-lakehouse-ingest/jars``
(``~/.cache/...`` without it). It can be copied to a machine without network access
(``ingest jars`` fills it; docs/installing.md). A user whose ``spark.conf`` sets ``spark.jars`` or
``spark.jars.packages`` manages the classpath: the engine then adds nothing.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, Literal, get_args
from urllib.parse import unquote, urlparse
from xml.sax.saxutils import quoteattr

from ingest.errors import EnvironmentProblem
from ingest.lake.locks import exclusive
from ingest.spark.java import check_java

Connector = Literal["spark-kafka", "delta-spark", "hadoop-aws"]
CONNECTORS: Final[tuple[Connector, ...]] = get_args(Connector)

#: Where Ivy's cache, the resolved jars and the records live (a directory; created on first use).
CACHE_ENV: Final = "INGEST_JARS_CACHE"
#: A Maven repository to resolve from instead of Maven Central (a mirror or a proxy).
REPOSITORY_ENV: Final = "INGEST_MAVEN_REPOSITORY"
MAVEN_CENTRAL: Final = "https://repo1.maven.org/maven2"

#: Each connector's Maven coordinates, for pyspark 4.2.0 (Scala 2.13).
PACKAGES: Final[dict[Connector, tuple[str, ...]]] = {
    # Spark's Kafka source: the release of the pyspark it runs in. It brings the token provider,
    # kafka-clients 3.9.2 and commons-pool2.
    "spark-kafka": ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",),
    # delta-spark 4.4.0 for Spark 4.2: the delta-spark Python package 4.4.1's jar is not on Maven
    # Central; 4.4.0 is the newest jar for Spark 4.2 that is. It brings delta-storage and the Delta
    # kernel and Unity Catalog client jars it links against.
    "delta-spark": ("io.delta:delta-spark_4.2_2.13:4.4.0",),
    # S3A: hadoop-aws must be the Hadoop pyspark 4.2.0 ships (hadoop-client-api 3.5.0). It depends on
    # the AWS SDK v2 "bundle", one 686 MB jar; the four modules S3A calls, at the SDK release
    # hadoop-aws 3.5.0 is built against (2.35.4), are about 13 MB with their own dependencies.
    "hadoop-aws": (
        "org.apache.hadoop:hadoop-aws:3.5.0",
        "software.amazon.awssdk:s3:2.35.4",
        "software.amazon.awssdk:s3-transfer-manager:2.35.4",
        "software.amazon.awssdk:sts:2.35.4",
        "software.amazon.awssdk:apache-client:2.35.4",
    ),
}

#: ``groupId:artifactId`` patterns (``*`` matches anything) Ivy must not bring, whichever connector
#: depends on them: the SDK bundle, and what pyspark 4.2.0's own ``jars/`` already holds, often in a
#: newer release than the connectors ask for (two copies of a class on the classpath is a
#: ``NoSuchMethodError`` waiting to happen). The result is the set of jars the project's Maven
#: modules resolved before (48 jars, 35 MB).
EXCLUDES: Final[tuple[str, ...]] = (
    "software.amazon.awssdk:bundle",
    # Hadoop (pyspark ships the shaded client) and what Hadoop's own modules would drag in
    "org.apache.hadoop:hadoop-client-*", "org.apache.hadoop:hadoop-common", "org.apache.hadoop:hadoop-annotations",
    "org.apache.hadoop:hadoop-auth", "org.apache.hadoop.thirdparty:*",
    # networking and logging: pyspark's netty, httpclient/httpcore, commons-codec, slf4j and log4j
    "io.netty:*", "org.apache.httpcomponents:*", "commons-codec:*", "commons-logging:*", "org.slf4j:*",
    "org.apache.logging.log4j:*",
    # compression codecs (kafka-clients', parquet's)
    "at.yawk.lz4:*", "org.lz4:*", "org.xerial.snappy:*", "com.github.luben:*", "io.airlift:*",
    # delta-spark's: Parquet 1.16 and RoaringBitmap 0.9 (pyspark has 1.17 and 1.6), Jackson 2.13 (pyspark
    # has 2.21), commons-pool, JTS; Jackson's jdk8 module and javax.annotation only serve the Unity
    # Catalog client, which the engine does not call
    "org.apache.parquet:*", "org.roaringbitmap:*", "com.fasterxml.jackson.*:*", "commons-pool:*",
    "org.locationtech.jts:*", "javax.annotation:*", "com.google.code.findbugs:*", "org.scala-lang.modules:*",
)

_USER_CLASSPATH: Final = ("spark.jars", "spark.jars.packages")
#: Ivy's name for the one repository it resolves from (its cache records it with each module).
_RESOLVER: Final = "maven-repository"


def _progress(line: str) -> None:
    print(f"[jars] {line}", file=sys.stderr, flush=True)


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the connectors' jars are cached: ``$INGEST_JARS_CACHE``, else the user's cache directory."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser().resolve()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return (base / "cdc-lakehouse-ingest" / "jars").resolve()


def repository(env: Mapping[str, str] | None = None) -> str:
    """The Maven repository Ivy resolves from: ``$INGEST_MAVEN_REPOSITORY``, else Maven Central."""
    env = os.environ if env is None else env
    return (env.get(REPOSITORY_ENV) or MAVEN_CENTRAL).rstrip("/")


def ivy_settings(directory: Path, repo: str) -> Path:
    """Write (when it differs) the Ivy settings that name ``repo`` as the only repository; their path.

    The artifact lock lets two processes (test workers, two runs) fill one cache at the same time.
    """
    text = "\n".join([
        "<!-- Written by cdc-lakehouse-ingest (ingest/spark/jars.py): Spark's Ivy resolves the engine's",
        "     connectors from this one repository only, never from ~/.m2. -->",
        "<ivysettings>",
        f"  <settings defaultResolver={quoteattr(_RESOLVER)}/>",
        '  <caches lockStrategy="artifact-lock-nio"/>',
        "  <resolvers>",
        f"    <ibiblio name={quoteattr(_RESOLVER)} m2compatible=\"true\" root={quoteattr(repo + '/')}/>",
        "  </resolvers>",
        "</ivysettings>",
        "",
    ])
    path = directory / "ivysettings.xml"
    if not path.is_file() or path.read_text() != text:
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)
    return path


def ivy_conf(connector: Connector, directory: Path, repo: str) -> dict[str, str]:
    """The Spark settings under which Spark's Ivy resolves ``connector`` into ``directory``."""
    return {
        "spark.jars.packages": ",".join(PACKAGES[connector]),
        "spark.jars.excludes": ",".join(EXCLUDES),
        "spark.jars.ivySettings": str(ivy_settings(directory, repo)),
        "spark.jars.ivy": str(directory / "ivy"),  # Ivy's cache is ivy/cache, the retrieved jars ivy/jars
    }


def _fingerprint(connector: Connector) -> str:
    """What a record was resolved from: the coordinates and the exclusions (not the repository, so a
    cache filled from Maven Central serves a machine that names a mirror)."""
    key = json.dumps([PACKAGES[connector], EXCLUDES])
    return hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()


def _record(directory: Path, connector: Connector) -> Path:
    return directory / f"{connector}.classpath"


def recorded_jars(connector: Connector, directory: Path | None = None) -> list[Path] | None:
    """The jars recorded for ``connector`` in the cache, or ``None`` when it must be resolved (no
    record, one made from other coordinates, or a jar gone)."""
    directory = cache_dir() if directory is None else directory
    try:
        lines = _record(directory, connector).read_text().splitlines()
    except OSError:
        return None
    if not lines or lines[0] != f"# {_fingerprint(connector)}":
        return None
    jars = [directory / line for line in lines[1:] if line]
    return jars if jars and all(jar.is_file() for jar in jars) else None


def connector_jars(connector: Connector) -> list[Path]:
    """The jars of ``connector``, resolved first when the cache has no record of them.

    Raises:
        EnvironmentProblem: Java is missing, or Ivy could not resolve them; one line saying what to do.
    """
    directory = cache_dir()
    jars = recorded_jars(connector, directory)
    if jars is None:
        directory.mkdir(parents=True, exist_ok=True)
        with exclusive(directory / ".lock"):  # a second process (a test worker) waits, then reads the record
            jars = recorded_jars(connector, directory)
            if jars is None:
                jars = _resolve(connector, directory, repository())
    return jars


def _resolve(connector: Connector, directory: Path, repo: str) -> list[Path]:
    """Resolve ``connector`` with Spark's Ivy in a gateway JVM of its own, and record the jars."""
    check_java()
    wanted = ", ".join(PACKAGES[connector])
    log = directory / f"ivy-{connector}.log"
    _progress(f"resolving {wanted} from {repo} into {directory} (first time: up to a minute; log {log})")
    # The child's Spark must resolve, not join a JVM this process was started by (spark-submit), nor
    # take the submit arguments meant for the session.
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    env["PYSPARK_SUBMIT_ARGS"] = "pyspark-shell"
    cmd = [sys.executable, "-m", "ingest.spark.ivy", json.dumps(ivy_conf(connector, directory, repo))]
    with log.open("w") as err:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True, check=False)
    jars = [Path(unquote(urlparse(uri).path)) for uri in done.stdout.strip().split(",") if uri]
    if done.returncode != 0 or not jars or not all(jar.is_file() for jar in jars):
        raise EnvironmentProblem(
            f"Spark needs {wanted} on its classpath and Ivy could not resolve it from {repo} "
            f"(exit {done.returncode}{_ivy_problem(log)}; log {log}): check the network or name a mirror in "
            f"${REPOSITORY_ENV}, copy a filled cache into ${CACHE_ENV} (`ingest jars` on a connected machine), "
            "or set spark.jars in the configuration's spark.conf")
    try:
        relative = [jar.resolve().relative_to(directory) for jar in jars]
    except ValueError:  # a jar outside the cache (a SPARK_HOME of one's own): recorded as it is
        relative = [jar.resolve() for jar in jars]
    record = _record(directory, connector)
    partial = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    partial.write_text("\n".join([f"# {_fingerprint(connector)}", *map(str, relative), ""]))
    partial.replace(record)
    return [directory / jar for jar in relative]


def _ivy_problem(log: Path) -> str:
    """The first line of Ivy's log that says what went wrong (``""`` when none does)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for marker in ("unresolved dependency", "download failed", "not found", "Exception"):
        for line in lines:
            if marker in line:
                return f": {line[line.index(marker):].strip().rstrip(']')}"
    return ""


def classpath_conf(connectors: Iterable[Connector], user_conf: Mapping[str, str]) -> dict[str, str]:
    """``spark.jars`` for ``connectors``, unless the user's configuration already manages the classpath
    (then only the user's own ``spark.jars`` with its patterns expanded, see :func:`expand_jars`)."""
    connectors = list(connectors)
    if "spark.jars" in user_conf:
        return {"spark.jars": expand_jars(user_conf["spark.jars"])}
    if not connectors or any(key in user_conf for key in _USER_CLASSPATH):
        return {}
    jars = [str(jar) for connector in connectors for jar in connector_jars(connector)]
    return {"spark.jars": ",".join(dict.fromkeys(jars))}


def expand_jars(value: str) -> str:
    """``spark.jars`` with each local pattern (``/opt/jars/*.jar``) replaced by the files it matches.

    spark-submit expands such patterns for the driver's classpath, but pyspark then hands the session
    the pattern itself, which the SparkContext cannot add for its executors ("Jar ... not found").
    A pattern that matches nothing, and every URI but ``file:``, is left as it is.
    """
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        path = entry.removeprefix("file:") if entry.startswith("file:/") else entry
        if any(c in path for c in "*?[") and "://" not in path:
            matched = sorted(glob.glob(os.path.expanduser(path)))
            entries.extend(matched or [entry])
        elif entry:
            entries.append(entry)
    return ",".join(entries)


def copy_jars(connectors: Iterable[Connector], into: Path) -> list[Path]:
    """Copy every jar of ``connectors`` into the directory ``into`` (for ``spark.jars: <into>/*.jar``
    on a machine that cannot resolve them); the copies."""
    into.mkdir(parents=True, exist_ok=True)
    copies = []
    for jar in dict.fromkeys(jar for connector in connectors for jar in connector_jars(connector)):
        target = into / jar.name
        shutil.copyfile(jar, target)
        copies.append(target)
    return copies
