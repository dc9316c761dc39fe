"""The driver JVM's class archive (ingest.spark.class_archive): named when built, mapped by a real driver."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ingest.spark import class_archive
from ingest.spark.session import DRIVER_JAVA_OPTIONS, driver_java_options


@pytest.fixture
def archive_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", tmp_path)
    monkeypatch.delenv(class_archive.SWITCH, raising=False)
    return tmp_path


def test_the_option_names_the_archive_only_once_it_exists_and_is_not_switched_off(archive_dir, monkeypatch):
    path = class_archive.archive_path()
    assert path is not None and path.parent == archive_dir
    assert class_archive.java_option() == ""
    path.write_bytes(b"")
    assert class_archive.java_option().split()[0] == f"-XX:SharedArchiveFile={path}"
    assert class_archive.java_option().split()[0] in driver_java_options(()).split()
    monkeypatch.setenv(class_archive.SWITCH, "off")
    assert class_archive.java_option() == ""


def test_a_users_own_archive_replaces_ours(archive_dir):
    path = class_archive.archive_path()
    assert path is not None
    path.write_bytes(b"")
    theirs = "-XX:SharedArchiveFile=/elsewhere/app.jsa"
    opts = driver_java_options(((DRIVER_JAVA_OPTIONS, theirs),)).split()
    assert theirs in opts and not any(str(path) in o for o in opts)


@pytest.mark.spark
def test_a_driver_jvm_loads_sparks_classes_from_the_archive(tmp_path):
    """The environment's archive (written now if ``make`` has not) is mapped by a new driver JVM:
    the JVM's class-load log says where SparkContext came from."""
    path = class_archive.build()
    assert path is not None and path.is_file()
    log = tmp_path / "classes.txt"
    script = textwrap.dedent(f"""
        from ingest.spark.session import get_spark
        spark = get_spark("local[1]", 1, (("spark.driver.extraJavaOptions", "-Xlog:class+load=info:file={log}"),))
        spark.stop()
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=300)
    lines = [line for line in log.read_text().splitlines() if " org.apache.spark.SparkContext " in line]
    assert lines and all("source: shared objects file" in line for line in lines), lines
