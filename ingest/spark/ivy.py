"""``python -m ingest.spark.ivy '<settings as JSON>'``: Spark's Ivy resolves ``spark.jars.packages``; the jars
it put on the classpath are printed on stdout, comma-separated (:func:`ingest.spark.jars.connector_jars`).

Spark resolves packages in ``spark-submit``, before its JVM runs anything. This starts that JVM as
pyspark starts it for a session (a py4j gateway, ``pyspark-shell``), but creates no SparkContext:
it reads the ``spark.jars`` that spark-submit merged the resolved files into, and stops the JVM.
Ivy's own report goes to stderr (the caller's log).
"""

from __future__ import annotations

import json
import sys

from pyspark import SparkConf

from ingest.spark.gateway import launch


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    conf = SparkConf(loadDefaults=False).setAll(sorted(json.loads(argv[0]).items()))
    gateway = launch(conf, stdout=sys.stderr)  # only our line on stdout
    try:
        jars = gateway.jvm.java.lang.System.getProperty("spark.jars")
    finally:
        gateway.shutdown()
        if gateway.proc is not None:  # the JVM ends when its stdin closes
            gateway.proc.stdin.close()
            gateway.proc.wait(timeout=60)
    print(jars or "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
