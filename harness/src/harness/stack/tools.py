"""What the stack needs from the machine: Java, Maven, Debian packages, and the resolved jars.

A missing piece is installed when that can be done here (``apt-get`` as root, Maven resolving jars
into ``$STACK_DIR/jars``); otherwise the caller gets a :class:`StackError` whose message is one line
naming what is missing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Final

from harness.stack.errors import StackError
from harness.stack.process import Progress, tail
from harness.stack.settings import StackSettings

#: JVM flags for the stack's Java servers (Kafka, Connect, the registry) on a small machine: the JIT's
#: quick compiler only and the serial collector. The optimising compiler and G1's concurrent threads
#: pay off on a busy server, not on loopback beside the engine and the suite on two cores.
#: ``scripts/stack_cpu.py`` on this kind of machine (2 cores), the three servers' CPU seconds until up
#: and over two idle minutes: 44.7 and 31.1 with G1 and both compilers (up in 26 s), 24.0 and 17.2
#: with these (up in 19 s). A server's peak speed is lower; the stack's loads are hundreds of changes/s.
LEAN_JVM: Final = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
MARIADB_SERVER = Path("/usr/sbin/mariadbd")
NGINX_BIN = Path("/usr/sbin/nginx")
_POLICY_RC = Path("/usr/sbin/policy-rc.d")
_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")
#: Jar components resolved by infra/jvm/pom.xml (sub-directories of the jars directory).
JAR_DIRS = ("kafka", "connect-plugins", "registry")
#: What the stack's Maven once resolved for the engine's Spark connectors, which the engine now resolves
#: itself (ingest/spark/jars.py): removed with the rest when the jars are resolved again.
RETIRED_JAR_DIRS = ("spark-kafka", "delta-spark", "hadoop-aws")


def render(template: Path, values: dict[str, object]) -> str:
    """``template`` with every ``{{name}}`` replaced by ``values[name]``.

    Raises:
        StackError: the template names a value that is not given.
    """
    text = template.read_text()
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(text)} - values.keys())
    if unknown:
        raise StackError(f"{template}: no value for placeholder(s) {', '.join(unknown)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def apt_install(packages: list[str], why: str, progress: Progress) -> None:
    """Install Debian packages non-interactively, without starting their services.

    Args:
        packages: Package names.
        why: What needs them (for messages).
        progress: Progress line printer.

    Raises:
        StackError: not root, no apt-get, or the installation failed.
    """
    names = " ".join(packages)
    if shutil.which("apt-get") is None:
        raise StackError(f"{why} needs the Debian package(s) {names}, and there is no apt-get here: install them")
    if os.geteuid() != 0:
        raise StackError(f"{why} needs the Debian package(s) {names}: run `sudo apt-get install -y {names}`")
    progress(f"installing {names} with apt-get (for {why})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # A package's maintainer scripts would start its service (nginx on port 80, PostgreSQL's default
    # cluster on 5432); policy-rc.d exit 101 tells invoke-rc.d not to. Created only for this install.
    created_policy = False
    if not _POLICY_RC.exists():
        _POLICY_RC.write_text("#!/bin/sh\n# temporary, written by harness.stack during apt-get install\nexit 101\n")
        _POLICY_RC.chmod(0o755)
        created_policy = True
    try:
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
        result = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:  # stale or empty package lists: update once, then try again
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
            result = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise StackError(f"apt-get install {names} failed (for {why}): {last}")
    finally:
        if created_policy:
            _POLICY_RC.unlink(missing_ok=True)


def java_version(java: Path) -> int | None:
    """Feature version of a ``java`` executable (17, 21, 25...), or None if it does not run."""
    release = java.resolve().parent.parent / "release"
    if release.exists():
        match = re.search(r'JAVA_VERSION="(\d+)', release.read_text())
        if match:
            return int(match.group(1))
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _java_candidates(env_var: str) -> list[Path]:
    out: list[Path] = []
    for var in (env_var, "JAVA_HOME"):
        home = os.environ.get(var)
        if home:
            out.append(Path(home) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        out.append(Path(on_path))
    jvm = Path("/usr/lib/jvm")
    if jvm.is_dir():
        out.extend(sorted(p / "bin" / "java" for p in jvm.iterdir() if (p / "bin" / "java").exists()))
    return out


def find_java(minimum: int, *, env_var: str, why: str, progress: Progress, install: str | None = None) -> Path:
    """A ``java`` of at least version ``minimum``: ``$env_var``, ``$JAVA_HOME``, PATH, /usr/lib/jvm.

    Args:
        minimum: Lowest acceptable feature version.
        env_var: Variable naming a JDK/JRE home to prefer (``STACK_JAVA_HOME``).
        why: What needs it (for messages).
        progress: Progress line printer.
        install: Debian package to install when none is found (None: do not try).

    Raises:
        StackError: no suitable Java.
    """
    for attempt in range(2):
        for java in _java_candidates(env_var):
            version = java_version(java)
            if version is not None and version >= minimum:
                return java
        if attempt == 0 and install:
            apt_install([install], why, progress)
        else:
            break
    raise StackError(f"{why} needs Java >= {minimum} and none was found (looked at ${env_var}, $JAVA_HOME, PATH, "
                     f"/usr/lib/jvm): install one and set {env_var} to its home")


def kafka_java(progress: Progress) -> Path:
    """Java for the Kafka broker and Connect (17 or newer; Debian's openjdk-17 if none)."""
    return find_java(17, env_var="STACK_JAVA_HOME", why="Kafka and Kafka Connect", progress=progress,
                     install="openjdk-17-jre-headless")


def registry_java(progress: Progress) -> Path:
    """Java for Apicurio Registry 3.3.3 (compiled for Java 21; Debian 12 packages no JDK 21)."""
    return find_java(21, env_var="STACK_REGISTRY_JAVA_HOME", why="Apicurio Registry 3.3.3", progress=progress)


def ensure_postgres(progress: Progress) -> Path:
    """The PostgreSQL 15 binaries directory, installing ``postgresql-15`` if needed."""
    if not (PG_BIN / "postgres").exists():
        apt_install(["postgresql-15"], "PostgreSQL 15", progress)
    if not (PG_BIN / "postgres").exists():
        raise StackError(f"PostgreSQL 15 is missing: {PG_BIN}/postgres not found after apt-get install postgresql-15")
    return PG_BIN


def ensure_mariadb(progress: Progress) -> Path:
    """The MariaDB server binary (Debian's ``mariadb-server``, 10.11 on bookworm), installing it if needed."""
    if not MARIADB_SERVER.exists():
        apt_install(["mariadb-server"], "MariaDB", progress)
    if not MARIADB_SERVER.exists():
        raise StackError(f"MariaDB is missing: {MARIADB_SERVER} not found after apt-get install mariadb-server")
    return MARIADB_SERVER


def ensure_nginx(progress: Progress) -> Path:
    """The nginx binary (Debian package ``nginx``), installing it if needed."""
    found = NGINX_BIN if NGINX_BIN.exists() else (Path(p) if (p := shutil.which("nginx")) else None)
    if found is None:
        apt_install(["nginx"], "the registry's basic-auth endpoint (nginx)", progress)
        found = NGINX_BIN if NGINX_BIN.exists() else None
    if found is None:
        raise StackError("nginx is missing: /usr/sbin/nginx not found after apt-get install nginx")
    return found


def ensure_gdb(progress: Progress) -> Path:
    """gdb (Debian package ``gdb``), installing it if needed: the stack's proofs hold a database
    process at a chosen instruction with it."""
    found = shutil.which("gdb")
    if found is None:
        apt_install(["gdb"], "holding a database process at a chosen point (gdb)", progress)
        found = shutil.which("gdb")
    if found is None:
        raise StackError("gdb is missing: not on PATH after apt-get install gdb")
    return Path(found)


def _poms_digest(settings: StackSettings) -> str:
    digest = hashlib.sha1()
    for path in sorted(settings.jvm_dir.rglob("*.xml")):
        digest.update(path.relative_to(settings.jvm_dir).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def jars_ready(settings: StackSettings) -> bool:
    """Whether the jars directory holds what the current poms declare."""
    stamp = settings.jars_dir / ".resolved"
    return stamp.exists() and stamp.read_text().strip() == _poms_digest(settings)


def _processes_using(path: Path) -> list[int]:
    marker = str(path) + "/"
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def ensure_jars(settings: StackSettings, progress: Progress) -> None:
    """Resolve every JVM component's jars with Maven (``infra/jvm``) unless already done.

    The jars directory is rebuilt from scratch whenever a pom changes, so no stale version lingers.

    Raises:
        StackError: Maven is missing and cannot be installed, or resolution failed.
    """
    if jars_ready(settings):
        return
    from ingest.lake.locks import exclusive

    with exclusive(settings.jars_dir.parent / ".jars.lock"):  # a second process (a test worker) waits
        if not jars_ready(settings):
            _resolve_jars(settings, progress)


def _resolve_jars(settings: StackSettings, progress: Progress) -> None:
    users = _processes_using(settings.jars_dir)
    if users:
        raise StackError(f"the stack's jars must be re-resolved (infra/jvm changed) but running processes use "
                         f"them (pid {', '.join(map(str, users))}): run `make stack-down` first")
    mvn = shutil.which("mvn")
    if mvn is None:
        kafka_java(progress)  # Maven needs a JDK/JRE first
        apt_install(["maven"], "resolving the stack's jars", progress)
        mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("Maven is missing: install it (apt-get install maven) to resolve the stack's jars")
    jars = settings.jars_dir
    jars.mkdir(parents=True, exist_ok=True)
    for sub in (*JAR_DIRS, *RETIRED_JAR_DIRS):
        shutil.rmtree(jars / sub, ignore_errors=True)
    log = jars / "maven.log"
    progress(f"resolving jars with Maven into {jars} (first time: a few minutes, ~300 MB; log {log})")
    cmd = [mvn, "-B", "-q", "-s", str(settings.jvm_dir / "settings.xml"), "-f", str(settings.jvm_dir / "pom.xml"),
           f"-Dstack.jars={jars}", "generate-resources"]
    env = dict(os.environ)
    if "JAVA_HOME" not in env:
        env["JAVA_HOME"] = str(kafka_java(progress).resolve().parent.parent)
    with log.open("w") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if result.returncode != 0:
        raise StackError(f"Maven could not resolve the stack's jars (exit {result.returncode}, log {log})\n{tail(log)}")
    # ServiceLoader manifests for every Connect plugin (Kafka's own connect-plugin-path tool, KIP-898):
    # with them the worker starts with plugin.discovery=service_load instead of scanning all classes.
    sync = [str(kafka_java(progress)), "-cp", str(jars / "kafka" / "*"), "org.apache.kafka.tools.ConnectPluginPath",
            "sync-manifests", "--plugin-path", str(jars / "connect-plugins")]
    with log.open("a") as out:
        result = subprocess.run(sync, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise StackError(f"connect-plugin-path sync-manifests failed (exit {result.returncode}, log {log})\n"
                         f"{tail(log)}")
    (jars / ".resolved").write_text(_poms_digest(settings) + "\n")
