"""JVM connectors the engine puts on Spark's classpath: resolved by Maven from ``infra/jvm``.

Spark's own way, ``spark.jars.packages``, resolves with Ivy at every session start and trips over a
local Maven repository that holds a pom without its jar (``download failed: ...slf4j-api.jar``),
which is exactly what a machine that builds anything with Maven has. So the engine uses resolved
jars in ``spark.jars``: the pinned coordinates in ``infra/jvm`` (the same Maven run as ``make jars``)
copied into ``$STACK_JARS_DIR`` (default ``.stack/jars``). A user who runs on a cluster that already
has the connector, or prefers Ivy, sets ``spark.jars`` or ``spark.jars.packages`` in ``spark.conf``;
the engine then adds nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final, Literal

from ingest.errors import EnvironmentProblem

Connector = Literal["spark-kafka", "delta-spark", "hadoop-aws"]
COORDINATES: Final[dict[str, str]] = {
    "spark-kafka": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
    "delta-spark": "io.delta:delta-spark_4.2_2.13:4.4.0",
    "hadoop-aws": "org.apache.hadoop:hadoop-aws:3.5.0",
}
_USER_CLASSPATH: Final = ("spark.jars", "spark.jars.packages")


def _progress(line: str) -> None:
    print(f"[jars] {line}", file=sys.stderr, flush=True)


def connector_jars(connector: Connector) -> list[Path]:
    """The jars of ``connector``, resolving them with Maven first if needed.

    Raises:
        EnvironmentProblem: Maven (or Java) is missing and cannot be installed, or resolution failed;
            the message is one line saying what to do.
    """
    from ingest.stack.errors import StackError
    from ingest.stack.settings import StackSettings
    from ingest.stack.tools import ensure_jars, jars_ready

    settings = StackSettings.from_env()
    directory = settings.jars_dir / connector
    if not (jars_ready(settings) and any(directory.glob("*.jar"))):
        try:
            ensure_jars(settings, _progress)
        except StackError as exc:
            raise EnvironmentProblem(
                f"Spark needs {COORDINATES[connector]} on its classpath and it could not be resolved ({exc}); "
                "run `make jars`, or set spark.jars / spark.jars.packages in the configuration's spark.conf"
            ) from None
    return sorted(directory.glob("*.jar"))


def classpath_conf(connectors: list[Connector], user_conf: dict[str, str]) -> dict[str, str]:
    """``spark.jars`` for ``connectors``, unless the user's configuration already manages the classpath."""
    if not connectors or any(key in user_conf for key in _USER_CLASSPATH):
        return {}
    jars = [str(jar) for connector in connectors for jar in connector_jars(connector)]
    return {"spark.jars": ",".join(jars)}
