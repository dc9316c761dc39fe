"""The JVM connectors' jars: where they are cached, which repository Ivy may use, the records that spare a
session Ivy's resolution, and the user's classpath left alone. The real resolution from Maven Central
runs wherever a test needs a connector (tests/conftest.py's session, tests/packaging)."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ingest.errors import EnvironmentProblem
from ingest.spark import jars


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty jars cache of the test's own, named by the environment."""
    directory = tmp_path / "jars-cache"
    monkeypatch.setenv(jars.CACHE_ENV, str(directory))
    return directory


def fake_record(directory: Path, connector: jars.Connector, names: list[str]) -> list[Path]:
    """A record and its jar files, as a resolution would leave them."""
    files = [directory / "ivy" / "jars" / name for name in names]
    for jar in files:
        jar.parent.mkdir(parents=True, exist_ok=True)
        jar.write_bytes(b"PK")
    (directory / f"{connector}.classpath").write_text(
        "\n".join([f"# {jars._fingerprint(connector)}", *(f"ivy/jars/{n}" for n in names), ""]))
    return files


def refuse_to_resolve(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make a resolution fail the test unless it is expected; the connectors resolved."""
    resolved: list[str] = []

    def resolve(connector: jars.Connector, directory: Path, repo: str) -> list[Path]:
        resolved.append(connector)
        return fake_record(directory, connector, [f"{connector}-resolved.jar"])

    monkeypatch.setattr(jars, "_resolve", resolve)
    return resolved


def test_the_cache_and_the_repository_come_from_the_environment(tmp_path: Path) -> None:
    home = Path.home()
    assert jars.cache_dir({}) == (home / ".cache" / "cdc-lakehouse-ingest" / "jars").resolve()
    assert jars.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "cdc-lakehouse-ingest" / "jars"
    assert jars.cache_dir({jars.CACHE_ENV: str(tmp_path / "mine"), "XDG_CACHE_HOME": "/x"}) == tmp_path / "mine"
    assert jars.repository({}) == "https://repo1.maven.org/maven2"
    assert jars.repository({jars.REPOSITORY_ENV: "https://nexus.example/maven/"}) == "https://nexus.example/maven"


def test_ivy_resolves_from_the_one_repository_named(tmp_path: Path) -> None:
    path = jars.ivy_settings(tmp_path, "https://nexus.example/maven?a=1&b=2")
    root = ET.parse(path).getroot()
    found, settings = root.find("resolvers"), root.find("settings")
    assert found is not None and settings is not None
    # one remote resolver and no chain: never the local Maven repository (~/.m2) Spark's own chain has
    assert [(r.tag, r.get("root")) for r in found] == [("ibiblio", "https://nexus.example/maven?a=1&b=2/")]
    assert settings.get("defaultResolver") == found[0].get("name")
    written = path.stat().st_mtime_ns
    assert jars.ivy_settings(tmp_path, "https://nexus.example/maven?a=1&b=2") == path
    assert path.stat().st_mtime_ns == written  # unchanged settings are not rewritten under a running Ivy
    conf = jars.ivy_conf("hadoop-aws", tmp_path, jars.MAVEN_CENTRAL)
    assert conf["spark.jars.packages"].split(",")[0] == "org.apache.hadoop:hadoop-aws:3.5.0"
    assert "software.amazon.awssdk:bundle" in conf["spark.jars.excludes"].split(",")
    assert conf["spark.jars.ivy"] == str(tmp_path / "ivy")


def test_the_coordinates_are_for_the_pinned_spark() -> None:
    import pyspark

    assert pyspark.__version__.startswith("4.2.")
    assert jars.PACKAGES["spark-kafka"] == (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}",)
    assert jars.PACKAGES["delta-spark"] == ("io.delta:delta-spark_4.2_2.13:4.4.0",)


def test_a_record_spares_the_resolution_even_in_a_copied_cache(cache: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = refuse_to_resolve(monkeypatch)
    files = fake_record(cache, "delta-spark", ["io.delta_delta-spark_4.2_2.13-4.4.0.jar", "b.jar"])
    assert jars.connector_jars("delta-spark") == files
    copied = tmp_path / "elsewhere"
    shutil.copytree(cache, copied)
    monkeypatch.setenv(jars.CACHE_ENV, str(copied))
    assert jars.connector_jars("delta-spark") == [copied / f.relative_to(cache) for f in files]
    assert resolved == []


def test_a_stale_or_broken_record_is_resolved_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = refuse_to_resolve(monkeypatch)
    files = fake_record(cache, "spark-kafka", ["a.jar", "b.jar"])
    files[1].unlink()  # a jar gone from the cache
    assert jars.connector_jars("spark-kafka") == [cache / "ivy" / "jars" / "spark-kafka-resolved.jar"]
    record = cache / "hadoop-aws.classpath"
    fake_record(cache, "hadoop-aws", ["c.jar"])
    record.write_text(record.read_text().replace(jars._fingerprint("hadoop-aws"), "other coordinates"))
    jars.connector_jars("hadoop-aws")
    assert resolved == ["spark-kafka", "hadoop-aws"]


def test_a_user_who_manages_the_classpath_gets_nothing_added(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = refuse_to_resolve(monkeypatch)
    assert jars.classpath_conf(["delta-spark"], {"spark.jars": "/opt/none/*.jar"}) == {"spark.jars": "/opt/none/*.jar"}
    assert jars.classpath_conf(["spark-kafka"], {"spark.jars.packages": "org.example:x:1"}) == {}
    assert jars.classpath_conf([], {}) == {}
    assert resolved == []
    conf = jars.classpath_conf(["spark-kafka", "delta-spark"], {})
    assert conf == {"spark.jars": ",".join(str(cache / "ivy" / "jars" / f"{c}-resolved.jar")
                                           for c in ("spark-kafka", "delta-spark"))}


def test_a_pattern_in_the_users_spark_jars_becomes_the_files_it_matches(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # pyspark would hand the SparkContext the pattern itself, which it cannot add for the executors
    refuse_to_resolve(monkeypatch)
    for name in ("b.jar", "a.jar", "notes.txt"):
        (tmp_path / name).write_text("")
    value = f"{tmp_path}/*.jar, file:{tmp_path}/a.jar,hdfs://nn/jars/*.jar,{tmp_path}/none-*.jar"
    expanded = f"{tmp_path}/a.jar,{tmp_path}/b.jar,file:{tmp_path}/a.jar,hdfs://nn/jars/*.jar,{tmp_path}/none-*.jar"
    assert jars.expand_jars(value) == expanded
    assert jars.expand_jars(f"file:{tmp_path}/b*.jar") == f"{tmp_path}/b.jar"
    assert jars.classpath_conf(["delta-spark"], {"spark.jars": f"{tmp_path}/*.jar"}) == {
        "spark.jars": f"{tmp_path}/a.jar,{tmp_path}/b.jar"}


def test_copy_jars_gathers_them_in_one_directory(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_to_resolve(monkeypatch)
    fake_record(cache, "spark-kafka", ["a.jar", "shared.jar"])
    fake_record(cache, "delta-spark", ["shared.jar", "d.jar"])
    copies = jars.copy_jars(["spark-kafka", "delta-spark"], tmp_path / "flat")
    assert sorted(p.name for p in copies) == ["a.jar", "d.jar", "shared.jar"]
    assert sorted(p.name for p in (tmp_path / "flat").iterdir()) == ["a.jar", "d.jar", "shared.jar"]


def test_an_unreachable_repository_is_one_line_saying_what_to_do(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 refused_port: int) -> None:
    port = refused_port
    monkeypatch.setenv(jars.REPOSITORY_ENV, f"http://127.0.0.1:{port}/maven2")
    with pytest.raises(EnvironmentProblem) as caught:
        jars.connector_jars("spark-kafka")
    message = str(caught.value)
    assert "\n" not in message
    for needed in (f"http://127.0.0.1:{port}/maven2", jars.REPOSITORY_ENV, jars.CACHE_ENV, "spark.jars",
                   "spark-sql-kafka-0-10_2.13:4.2.0"):
        assert needed in message
    assert not (cache / "spark-kafka.classpath").exists()


def test_the_jars_command_refuses_an_unknown_connector() -> None:
    from ingest.cli import app

    result = CliRunner().invoke(app, ["jars", "--connector", "kafka-streams"])
    assert result.exit_code == 2
    assert "spark-kafka, delta-spark, hadoop-aws" in result.output


def test_version_is_the_installed_distribution() -> None:
    from importlib.metadata import version

    from ingest.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"cdc-lakehouse-ingest {version('cdc-lakehouse-ingest')}"
