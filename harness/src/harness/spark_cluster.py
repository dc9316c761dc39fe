"""A Spark standalone cluster on loopback: one master and N workers, from pyspark's own jars.

For the cluster proof (tests/stack/test_cluster.py) and the cluster figures of
``benchmarks/bench_tables.py --master cluster``. Each process runs in a directory of its own under
``root`` (its working directory, its Spark work directory, its log), with an environment that holds
no credential and no path of the driver's: whatever an executor needs must reach it through Spark,
as on a real cluster. The workers run the interpreter the driver names (``spark.pyspark.python``):
the project's virtualenv, installed on every machine of a real cluster the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import urllib.request
from pathlib import Path
from types import TracebackType

import pyspark

from harness.stack.process import spawn, stop, wait_until
from harness.stack.s3 import free_port

#: Environment variables a worker keeps from this process: the system's, never a credential.
_KEPT = ("PATH", "JAVA_HOME", "LANG", "LC_ALL", "TZ", "HOME", "USER")


class SparkCluster:
    """``with SparkCluster(root) as cluster:`` a master and ``workers`` workers; ``cluster.url`` is the master.

    ``worker_env`` is what an operator puts in the workers' ``spark-env.sh`` (the Kafka credentials
    the executors' reader looks up); executors inherit their worker's environment.
    """

    def __init__(self, root: Path, *, workers: int = 2, cores: int = 1, memory: str = "2g",
                 worker_env: dict[str, str] | None = None) -> None:
        self.root = root
        self.worker_env = dict(worker_env or {})
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.web_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._pids: dict[str, int] = {}

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _spark_class(self, name: str, main: str, *args: str, extra_env: dict[str, str] | None = None) -> int:
        home = Path(pyspark.__file__).parent
        where = self.root / name
        where.mkdir(parents=True, exist_ok=True)
        env = {k: os.environ[k] for k in _KEPT if k in os.environ}
        env.update(SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(where),
                   SPARK_WORKER_DIR=str(where / "work"), PYSPARK_PYTHON=sys.executable, **(extra_env or {}))
        cmd = [str(home / "bin" / "spark-class"), main, *args]
        pid = spawn(cmd, log=where / f"{name}.log", pidfile=where / f"{name}.pid", cwd=where, env=env)
        self._pids[name] = pid
        return pid

    def start(self) -> None:
        """Start the master, then the workers; returns once every worker has registered."""
        master = self._spark_class("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(self.port), "--webui-port", str(self.web_port))
        wait_until(lambda: self.state().get("status") == "ALIVE", what="spark master", timeout=90,
                   pid=master, log=self.root / "master" / "master.log")
        for i in range(1, self.workers + 1):
            self.start_worker(i)
        wait_until(lambda: self.alive_workers() >= self.workers, what="spark workers", timeout=90)

    def start_worker(self, i: int) -> int:
        """Start (or restart) worker ``i`` (1-based)."""
        name = f"worker-{i}"
        return self._spark_class(name, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                 "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                                 "--work-dir", str(self.root / name / "work"), self.url, extra_env=self.worker_env)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and its executors (its whole process group), as a machine loss would."""
        pid = self._pids.pop(f"worker-{i}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        stop(pid, timeout=5)

    def state(self) -> dict[str, object]:
        """The master's own view (its web UI's ``/json/``)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/json/", timeout=5) as response:
            state: dict[str, object] = json.load(response)
            return state

    def alive_workers(self) -> int:
        """Workers the master counts as alive."""
        return int(str(self.state().get("aliveworkers", 0)))

    def stop(self) -> None:
        """Stop every process it started (workers first)."""
        for name in sorted(self._pids, key=lambda n: n == "master"):
            stop(self._pids[name], timeout=15)
        self._pids.clear()
