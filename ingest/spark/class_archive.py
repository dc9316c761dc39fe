"""A class-data-sharing archive of Spark's classes for the driver JVM: a faster session start.

A local Spark driver JVM loads some 25,000 classes before and during its first jobs, most of them
from Spark's own jars; reading and verifying them is a large part of a session's start. HotSpot can
map them from an archive an earlier JVM wrote (class data sharing, ``-XX:SharedArchiveFile``)
instead. ``python -m ingest.spark.class_archive`` (``make class-archive``, which ``make demo``, ``make
test``, ``make bench`` and ``make dagster`` run first) writes that archive into the environment once
per Java and pyspark: a child process starts a session (its Python workers warmed up), writes and
reads a small Parquet table with a shuffle, and its JVM archives the classes it loaded as it exits
(``-XX:ArchiveClassesAtExit``). From then on :func:`java_option` names the archive in the driver's
options (:func:`ingest.spark.session.driver_java_options`).

The archive is an optimization only (``INGEST_CLASS_ARCHIVE=off`` leaves it out): without it
(another Java, a newer pyspark, a machine where it was never built) the driver starts as before.
The JVM checks that the archive matches its own build and classpath and ignores one that does not;
its logging about it is kept off stdout. ``benchmarks/bench_start.py`` measures the difference.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from ingest.spark.java import java_binary

#: Where the archives live: inside the environment, so removing the venv removes them.
ARCHIVE_DIR = Path(sys.prefix) / "share" / "cdc-ingest"
#: Set to ``off`` to start the driver without the archive (to compare, or to rule it out).
SWITCH = "INGEST_CLASS_ARCHIVE"
#: CDS' own messages (a stale archive, classes it skipped) off: unified logging writes to stdout.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path | None:
    """This environment's archive for the Java Spark would start (``None``: no Java found).

    Its name digests what the archive depends on: the Java binary, pyspark's version and jars.
    """
    import pyspark  # only when a session is about to start: pyspark's import is the costly part of it

    found = java_binary()
    if found is None:
        return None
    java = Path(found).resolve()
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    stat = java.stat()
    key = "\n".join([str(java), str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__, *jars])
    digest = hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:16]
    return ARCHIVE_DIR / f"spark-driver-{digest}.jsa"


def java_option() -> str:
    """The driver option that maps the archive, or ``""`` when this environment has none (or
    ``INGEST_CLASS_ARCHIVE=off``)."""
    if os.environ.get(SWITCH, "").lower() == "off":
        return ""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None and path.is_file() else ""


def build(*, force: bool = False) -> Path | None:
    """Write the archive if this environment lacks it; its path (``None``: no Java to build it with)."""
    path = archive_path()
    if path is None:
        print("class archive: no Java found, skipped (Spark starts without it)", file=sys.stderr)
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("spark-driver-*.jsa"):  # another Java's or pyspark's
        old.unlink(missing_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    print(f"class archive: writing {path} (once per Java and pyspark; about a minute)", file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ingest.spark.archive_dump", str(partial)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise RuntimeError(f"the class archive could not be written (exit {done.returncode}):\n{tail}")
    os.replace(partial, path)
    print(f"class archive: {path.stat().st_size / 2**20:.0f} MB in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="python -m ingest.spark.class_archive", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="write it again even if present")
    args = parser.parse_args(argv)
    try:
        build(force=args.force)
    except RuntimeError as exc:  # a speed-up only: say so, and let make go on
        print(f"class archive: {exc}\nclass archive: Spark starts without it (slower, nothing else changes)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
