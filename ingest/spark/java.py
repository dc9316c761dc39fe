"""The Java Spark starts: found, and checked before a session tries it."""

from __future__ import annotations

import os
import shutil
import subprocess

from ingest.errors import EnvironmentProblem

JAVA_HINT = (
    "Java 17 is required for Spark: install a JDK/JRE 17 "
    "(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
)


def java_binary() -> str | None:
    """The ``java`` Spark starts: ``$JAVA_HOME/bin/java``, else the one on ``PATH`` (``None``: neither)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    return java if java and os.path.exists(java) else None


def check_java() -> None:
    """Fail with one clear line when Java is missing, instead of a py4j stack trace."""
    java = java_binary()
    if java is None:
        raise EnvironmentProblem(JAVA_HINT)
    try:
        # in a session of its own: the terminal's Ctrl-C, which the run takes as a stop, does not kill it
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=30, start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentProblem(f"{JAVA_HINT} ({java} -version failed: {exc})") from exc
