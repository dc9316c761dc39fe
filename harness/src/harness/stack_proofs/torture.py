"""``ingest torture --stack``: faults on the real stack while PostgreSQL and MariaDB keep changing, then the verdict.

1. **Sources.** Start the stack; reset the schema (Debezium drained, the schema's topics deleted,
   the schema dropped and recreated: :func:`harness.stack_proofs.setup.reset_source`); run the seeded
   SQL workload (:mod:`harness.postgres.workload`: DDL, widenings, a truncate, primary-key updates)
   as the initial backlog. With ``mariadb`` (Avro only), the same on a MariaDB database of the
   schema's name (:func:`harness.stack_proofs.setup.reset_mariadb`, :mod:`harness.mariadb.workload`),
   whose tables the same engine ingests as ``mariadb_<table>``.
2. **Run.** Start ``ingest run --continuous`` as a child process and the load generators
   (:class:`harness.postgres.load.LoadGenerator`; :class:`harness.mariadb.load.MariaLoadGenerator` at
   half the rate) at a steady rate.
3. **Faults.** In a seeded random order, with seeded pauses between them: SIGKILL the ingest
   process (from outside, or armed at a named point) and restart it; restart the broker, Connect,
   the registry, PostgreSQL, MariaDB (:mod:`harness.stack_proofs.faults`). A watch thread restarts an
   ingest process that ends on its own, and reports it.
4. **Drain.** Stop the loads; wait until Debezium has captured everything
   (:func:`ingest.verify.capture.wait_for_capture`, :func:`harness.mariadb.capture.wait_for_capture`);
   stop the continuous process; run ``ingest run`` (availableNow) once more.
5. **Verdict.** :func:`harness.stack_proofs.check.check_stack`: every table equals its database, no
   duplicate key, every audit row balanced and one per commit, every topic record received once,
   nothing quarantined.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.mariadb import capture as maria_capture
from harness.mariadb.load import MariaLoadGenerator
from harness.mariadb.workload import MariaWorkloadReport, MariaWorkloadSpec
from harness.mariadb.workload import run_workload as run_maria_workload
from harness.postgres.load import LoadGenerator, LoadReport
from harness.postgres.workload import WorkloadReport, WorkloadSpec, run_workload
from harness.stack_proofs.check import StackCheck, check_stack
from harness.stack_proofs.faults import KINDS, POINTS, IngestWatch, Watch, kill_at, schedule
from harness.stack_proofs.setup import engine_environment, reset_mariadb, reset_source, stack_config
from harness.torture.process import IngestProcess, run_once
from ingest.config import load_config
from ingest.verify.capture import CaptureResult, wait_for_capture

Say = Callable[[str], None]


@dataclass(slots=True)
class StackTortureSpec:
    """One run of the stack torture.

    Args:
        workdir: a fresh directory (created; must be empty if it exists): engine workdir, logs.
        seed: seeds the workload, the load, the fault order, the pauses and the kill points.
        faults: faults to inject.
        rate: row changes per second the load generator writes.
        value_format: ``avro`` (registry through nginx basic auth) or ``json``.
        schema: the PostgreSQL schema (reset!); topics ``<prefix>.<schema>.<table>``.
        scale: size of the initial SQL workload (1.0: ~3,000 row changes).
        pause: seconds between faults, drawn uniformly from this range.
        named_fraction: share of ingest kills at a named point (the rest from outside).
        point_timeout: seconds an armed process may take to reach its point before it is killed from outside.
        wait: seconds to wait for Debezium, and again for the tables, at the end.
        max_records_per_batch: the source's micro-batch bound (``None``: the engine's default).
        mariadb: also MariaDB (its workload, load and restarts; Avro only).
    """

    workdir: Path
    seed: int = 1
    faults: int = 30
    rate: float = 100.0
    value_format: Literal["avro", "json"] = "avro"
    schema: str = "shop"
    scale: float = 0.3
    pause: tuple[float, float] = (10.0, 30.0)
    named_fraction: float = 0.4
    point_timeout: float = 120.0
    wait: float = 300.0
    max_records_per_batch: int | None = None
    mariadb: bool = True


@dataclass(slots=True)
class Fault:
    """One injected fault, for the report."""

    n: int
    kind: str
    detail: str
    at: float
    seconds: float


@dataclass(slots=True)
class StackTortureResult:
    """What happened, and the verdict."""

    faults: list[Fault] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    ingest_starts: int = 0
    watch: Watch = field(default_factory=Watch)
    workload: WorkloadReport | None = None
    load: LoadReport | None = None
    capture: CaptureResult | None = None
    mariadb_workload: MariaWorkloadReport | None = None
    mariadb_load: LoadReport | None = None
    mariadb_capture: CaptureResult | None = None
    #: the kinds of fault the schedule drew from
    kinds: tuple[str, ...] = KINDS
    final_exit: int | None = None
    check: StackCheck | None = None
    failure: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None and self.check is not None and self.check.ok

    def by_kind(self) -> dict[str, int]:
        counts = Counter(f.kind for f in self.faults)
        return {k: counts[k] for k in self.kinds}


class StackTorture:
    """Runs the journey of the module docstring."""

    def __init__(self, spec: StackTortureSpec, say: Say = print, stack: Any = None) -> None:
        self.spec, self.say = spec, say
        self.rng = random.Random(f"stack-torture:{spec.seed}")
        self.workdir = spec.workdir.resolve()
        self.result = StackTortureResult()
        self._stack = stack
        self._started = 0.0

    def run(self) -> StackTortureResult:
        """Source, run, faults, drain, verdict; never raises for what the engine did (see ``result``)."""
        self._started = time.monotonic()
        spec = self.spec
        if self.workdir.exists() and any(self.workdir.iterdir()):
            raise SystemExit(f"{self.workdir} is not empty; the stack torture needs a fresh workdir")
        self.workdir.mkdir(parents=True, exist_ok=True)
        stack = self._stack_up()
        dsn = stack.pg_dsn()
        maria = spec.mariadb and spec.value_format == "avro"
        config_path = stack_config(stack, self.workdir / "engine", value_format=spec.value_format,
                                   schema=spec.schema, max_records_per_batch=spec.max_records_per_batch,
                                   mariadb=maria)
        reset_source(stack, spec.schema, wait=spec.wait, say=self.say)
        self.result.workload = w = run_workload(dsn, WorkloadSpec(seed=spec.seed, scale=spec.scale, schema=spec.schema))
        self.say(f"initial workload: {w.transactions} transactions, {w.changes} row changes, {len(w.ddl)} DDL")
        loads = []
        if maria:
            reset_mariadb(stack, spec.schema, say=self.say)
            with stack.component("mariadb").connect() as conn:
                mw = run_maria_workload(conn, MariaWorkloadSpec(seed=spec.seed, scale=spec.scale, database=spec.schema))
            self.result.mariadb_workload = mw
            self.say(f"initial MariaDB workload: {mw.transactions} transactions, {mw.statements} statements")
        process = IngestProcess(config_path, self.workdir / "logs", engine_environment(stack))
        process.start()
        watch = IngestWatch(process, self.say).start()
        loads.append(LoadGenerator(dsn, rate=spec.rate, duration=None, seed=spec.seed, schema=spec.schema,
                                   application_name="stack-torture-load").start())
        if maria:
            mariadb = stack.component("mariadb")
            loads.append(MariaLoadGenerator(lambda: mariadb.connect(spec.schema), rate=spec.rate / 2,
                                            duration=None, seed=spec.seed).start())
        self.say(f"ingest run --continuous (pid {process.pid}) and load at {spec.rate:.0f} changes/s started"
                 + (f" (MariaDB: {spec.rate / 2:.0f}/s)" if maria else "") + f"; {spec.faults} faults to go")
        kinds = self.result.kinds = KINDS if maria else tuple(k for k in KINDS if k != "mariadb")
        try:
            for n, kind in enumerate(schedule(self.rng, spec.faults, kinds), 1):
                time.sleep(self.rng.uniform(*spec.pause))
                at = self._elapsed()
                detail = self._inject(kind, stack, process, watch)
                fault = Fault(n, kind, detail, at, self._elapsed() - at)
                watch.last_fault = f"#{n} {kind}"
                self.result.faults.append(fault)
                self.say(f"fault {n:>3}/{spec.faults} at {at:>6.0f} s: {kind:<11} {detail}")
        finally:
            for load in loads:
                load.stop()
            self.result.load = loads[0].join(60)
            self.result.mariadb_load = loads[1].join(60) if maria else None
        self._drain(dsn, process, watch, config_path, stack)
        return self.result

    # -- faults -------------------------------------------------------------------------------------
    def _inject(self, kind: str, stack: Any, process: IngestProcess, watch: IngestWatch) -> str:
        if kind != "ingest-kill":
            seconds = stack.restart(kind)
            return f"restart; ready again after {seconds:.1f} s"
        with watch.lock:
            uptime = process.uptime()
            code = process.kill()
            self.result.kills["outside"] += 1
            if self.rng.random() >= self.spec.named_fraction:
                process.start()
                return f"SIGKILL from outside after {uptime:.0f} s up (exit {code}); restarted"
            point = self.rng.choice(POINTS)
            process.start(kill_at=kill_at(self.rng, point))
        died = process.wait(self.spec.point_timeout)
        with watch.lock:
            if died == -9:
                self.result.kills[point] += 1
                how = f"died at {point} after {process.uptime():.0f} s"
            elif died is None:
                process.kill()
                self.result.kills["outside"] += 1
                how = f"did not reach {point} in {self.spec.point_timeout:.0f} s; killed from outside"
            else:
                how = f"ended on its own with exit {died} before reaching {point}"
                watch.seen.unexpected_exits.append(f"exit {died} of a process armed at {point}: "
                                                   + process.tail(6).replace("\n", " | ")[-400:])
            process.start()
        return f"SIGKILL after {uptime:.0f} s up, restarted armed: {how}; restarted"

    # -- the end --------------------------------------------------------------------------------------
    def _drain(self, dsn: str, process: IngestProcess, watch: IngestWatch, config_path: Path, stack: Any) -> None:
        spec = self.spec
        self.say(f"load stopped: {self.result.load.committed_changes if self.result.load else 0} changes committed; "
                 "waiting until Debezium has captured everything")
        self.result.capture = wait_for_capture(dsn, timeout=spec.wait, say=self.say, on_stall=stack.unstick_capture)
        if self.result.mariadb_workload is not None:
            self.result.mariadb_capture = maria_capture.wait_for_capture(stack, timeout=spec.wait, say=self.say)
        self.result.watch = watch.stop()
        process.stop(timeout=60)
        self.result.ingest_starts = process.starts
        self.say("continuous run stopped; final ingest run (availableNow)")
        code, log = run_once(config_path, self.workdir / "logs", dict(process.env), timeout=spec.wait * 3)
        self.result.final_exit = code
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            self.result.failure = f"the final ingest run exited with {code}; log {log}:\n{tail}"
            self.say(self.result.failure)
        config = load_config(config_path)
        self.result.check = check_stack(config, dsn, wait=spec.wait, say=self.say,
                                        mariadb_url=stack.settings.mariadb_url(spec.schema))
        self.result.seconds = self._elapsed()

    def _stack_up(self) -> Any:
        from harness.stack import CDC_COMPONENTS, Stack

        log = self.workdir / "stack.log"

        def quiet(line: str) -> None:
            with log.open("a") as fh:
                fh.write(f"{time.strftime('%H:%M:%S')} {line}\n")

        stack = self._stack or Stack.from_env(progress=quiet)
        stack.up(CDC_COMPONENTS)
        stack.wait_connectors()
        os.environ.update(stack.engine_env())  # for the end checks in this process
        return stack

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

