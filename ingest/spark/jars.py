"""JVM connectors the engine puts on Spark's classpath: resolved by Maven from ``infra/jvm``.

Spark's own way, ``spark.jars.packages``, resolves with Ivy at every session start and trips over a
local Maven repository that holds a pom without its jar (``download failed: ...slf4j-api.jar``),
which is exactly what a machine that builds anything with Maven has. So the engine uses resolved
jars in ``spark.jars``: the pinned coordinates of each connector's module in ``infra/jvm``, resolved
by Maven (that module alone) into ``$STACK_JARS_DIR/<connector>`` (default ``.stack/jars``, beside
the jars of the local stack, which resolves the same modules with its own). A user who runs on a
cluster that already has the connector, or prefers Ivy, sets ``spark.jars`` or
``spark.jars.packages`` in ``spark.conf``; the engine then adds nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final, Literal

from ingest.errors import EnvironmentProblem
from ingest.lake.locks import exclusive

Connector = Literal["spark-kafka", "delta-spark", "hadoop-aws"]
COORDINATES: Final[dict[str, str]] = {
    "spark-kafka": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
    "delta-spark": "io.delta:delta-spark_4.2_2.13:4.4.0",
    "hadoop-aws": "org.apache.hadoop:hadoop-aws:3.5.0",
}
_USER_CLASSPATH: Final = ("spark.jars", "spark.jars.packages")
#: The checkout's Maven poms: one module per connector under one parent.
JVM_DIR: Final = Path(__file__).resolve().parents[2] / "infra" / "jvm"
#: Beside a connector's jars: the digest of the poms they were resolved from.
STAMP: Final = ".resolved"


def _progress(line: str) -> None:
    print(f"[jars] {line}", file=sys.stderr, flush=True)


def jars_dir(env: dict[str, str] | None = None) -> Path:
    """Where resolved jars live: ``$STACK_JARS_DIR``, else ``$STACK_DIR/jars``, else ``<checkout>/.stack/jars``."""
    env = dict(os.environ) if env is None else env
    if env.get("STACK_JARS_DIR"):
        return Path(env["STACK_JARS_DIR"]).expanduser().resolve()
    stack = Path(env["STACK_DIR"]).expanduser() if env.get("STACK_DIR") else JVM_DIR.parents[1] / ".stack"
    return (stack / "jars").resolve()


def poms_digest(connector: str) -> str:
    """The digest of what ``connector``'s jars are resolved from: the parent pom and its module's."""
    digest = hashlib.sha1()
    for path in (JVM_DIR / "pom.xml", JVM_DIR / connector / "pom.xml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def mark_resolved(directory: Path, connector: str) -> None:
    """Record that ``directory`` holds ``connector``'s jars as the current poms declare them."""
    (directory / STAMP).write_text(poms_digest(connector) + "\n")


def is_resolved(directory: Path, connector: str) -> bool:
    stamp = directory / STAMP
    return (stamp.exists() and stamp.read_text().strip() == poms_digest(connector)
            and any(directory.glob("*.jar")))


def connector_jars(connector: Connector) -> list[Path]:
    """The jars of ``connector``, resolving them with Maven first if needed.

    Raises:
        EnvironmentProblem: Maven is missing, or resolution failed; the message is one line saying
            what to do.
    """
    directory = jars_dir() / connector
    if not is_resolved(directory, connector):
        directory.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(directory.parent / ".jars.lock"):  # a second process (a test worker) waits
            if not is_resolved(directory, connector):
                _resolve(connector, directory)
    return sorted(directory.glob("*.jar"))


def _resolve(connector: Connector, directory: Path) -> None:
    """Run Maven on ``connector``'s module alone (it copies the jars into ``directory``)."""
    wanted = COORDINATES[connector]
    way_out = "set spark.jars or spark.jars.packages in the configuration's spark.conf"
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EnvironmentProblem(f"Spark needs {wanted} on its classpath and Maven, which resolves it, is not "
                                 f"installed: install Maven (apt-get install maven), or {way_out}")
    if not (JVM_DIR / connector / "pom.xml").exists():
        raise EnvironmentProblem(f"Spark needs {wanted} on its classpath and its pom ({JVM_DIR / connector}) "
                                 f"is not here: {way_out}")
    shutil.rmtree(directory, ignore_errors=True)
    directory.parent.mkdir(parents=True, exist_ok=True)
    log = directory.parent / f"maven-{connector}.log"
    _progress(f"resolving {wanted} with Maven into {directory} (first time: a minute or two; log {log})")
    cmd = [mvn, "-B", "-q", "-s", str(JVM_DIR / "settings.xml"), "-f", str(JVM_DIR / "pom.xml"), "-pl", connector,
           f"-Dstack.jars={directory.parent}", "generate-resources"]
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not any(directory.glob("*.jar")):
        raise EnvironmentProblem(f"Spark needs {wanted} on its classpath and Maven could not resolve it "
                                 f"(exit {done.returncode}, log {log}): {way_out}")
    mark_resolved(directory, connector)


def classpath_conf(connectors: list[Connector], user_conf: dict[str, str]) -> dict[str, str]:
    """``spark.jars`` for ``connectors``, unless the user's configuration already manages the classpath."""
    if not connectors or any(key in user_conf for key in _USER_CLASSPATH):
        return {}
    jars = [str(jar) for connector in connectors for jar in connector_jars(connector)]
    return {"spark.jars": ",".join(jars)}
