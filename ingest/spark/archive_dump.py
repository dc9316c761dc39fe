"""The child process that writes the class archive (:func:`ingest.spark.class_archive.build` starts it).

``python -m ingest.spark.archive_dump <path>``: starts Spark with the JVM option that dumps every
class it loads at exit, does what every run does early, and exits.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from ingest.spark.class_archive import QUIET
from ingest.spark.session import get_spark


def dump(target: Path) -> None:
    """A session whose JVM writes ``target`` when it exits."""
    options = f"-XX:ArchiveClassesAtExit={target} {QUIET}"
    spark = get_spark("local[2]", 2, (("spark.driver.extraJavaOptions", options),))
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    jvm = gateway.proc  # the driver JVM, started by pyspark with a pipe as stdin
    work = Path(tempfile.mkdtemp(prefix="class-archive-"))
    try:  # what every run does early: Arrow in and out, a Parquet write and read, a shuffle
        frame = spark.createDataFrame([(i, f"v{i}") for i in range(100)], "id long, v string")
        frame.write.parquet(str(work / "t"))
        spark.read.parquet(str(work / "t")).groupBy("v").count().toArrow()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    # The JVM exits when its stdin closes and writes the archive as it exits: wait for that.
    jvm.stdin.close()
    jvm.wait(timeout=600)


if __name__ == "__main__":
    dump(Path(sys.argv[1]))
