"""The consistency proof: ingest a simulated source while killing the engine, then check everything.

The journey of ``ingest torture``:

1. **Source.** Generate a seeded workload (snapshot, transactions, duplicates, reordering, a
   truncate, an added column, two type widenings, TOAST placeholders, malformed messages) into a
   staging log, and remember its truth.
2. **Crash loop.** Before each run, release the next slice of the staging log into the live log
   (the source keeps producing while we crash), maybe damage a table's Spark checkpoint (deleted,
   truncated, overwritten, rewound, or claiming progress the table lacks), then start
   ``ingest run`` as a separate process and SIGKILL it: at a named point (:mod:`ingest.crashpoints`)
   -- after the quarantine write, after the tombstones, before the commit, during the MERGE,
   during a schema rewrite, after it, between the Delta commit and the audit row, between the
   batch and Spark's checkpoint commit -- or after a random delay. Repeat until the wanted number
   of kills has happened. With the lake on an object store, some runs are not killed: the store's
   server is restarted while they ingest, and they must ride it out and finish cleanly.
3. **Recovery.** Release the rest and run without faults until caught up.
4. **Verdict.** :func:`harness.torture.consistency.check`: tables equal the source, no duplicate keys,
   every audit row balanced and one per commit, every record received once, every malformed
   message quarantined once.

Damage and kill helpers live in :mod:`harness.torture.faults`.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from harness.torture.consistency import ConsistencyReport, check
from harness.torture.faults import DAMAGES, KILLS, Kill, WidenWatch, choose_kill, damage_checkpoint
from ingest.commit.state import load_state
from ingest.config import IngestConfig, WriterName, load_config
from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.source.discovery import discovered
from ingest.source.topiclog import ProducerRecord, TopicLog

Say = Callable[[str], None]


@dataclass(slots=True)
class TortureSpec:
    """One torture run.

    Args:
        workdir: a fresh directory (created; must be empty if it exists).
        seed: seeds the workload and every random choice, so a run can be repeated.
        kills: SIGKILLs to deliver before the recovery run.
        events: row-change events in the simulated workload.
        batch: records per table and micro-batch (small: many commits, many crash windows).
        value_format: ``avro`` or ``json``.
        damage_probability: chance, before each restart, of damaging a table's Spark checkpoint.
        timer_fraction: share of kills after a random delay instead of at a named point.
        schedule: kill labels to use first, in order (see :data:`harness.torture.faults.KILLS`);
            ``label@n`` kills at the n-th hit of the point.
        damages: damage kinds to apply first, one per restart (see :data:`DAMAGES`).
        run_timeout: seconds after which a run counts as hung.
        tables: which of the simulated tables to ingest (``orders`` carries the widenings).
        extra_tables: extra tables ``ledger_001`` ... in the workload, not listed in the config but
            found by ``discover.topic_pattern`` as the run sees their topics: a whole-database run.
        writer: who writes the killed runs' commits (``target.writer``).
        plan_on: where a delta-spark batch is assembled, reduced and planned (``target.plan_on``).
        lake_root: ``target.root`` when the tables live on an object store (``s3://bucket/prefix``);
            ``None``: on the local disk under the workdir. The store's keys come from the environment.
        storage: ``target.storage`` for ``lake_root`` (endpoint, path style, lease).
        restart_store: stops and starts the object store's server (returns the seconds it was away);
            ``store_restarts`` runs get it called while they ingest.
        store_restarts: runs during which the object store's server is restarted.
        driver_seconds: the runs' ``source.driver_seconds``. ``0`` (the default here): every run goes
            through Spark, whose checkpoints the torture damages too; set, a run whose backlog looks
            small applies it on the driver and leaves no Spark checkpoint to damage.
    """

    workdir: Path
    seed: int = 1
    kills: int = 50
    events: int = 12_000
    batch: int = 300
    value_format: Literal["avro", "json"] = "avro"
    damage_probability: float = 0.2
    timer_fraction: float = 0.3
    schedule: tuple[str, ...] = ()
    damages: tuple[str, ...] = ()
    run_timeout: float = 900.0
    tables: tuple[str, ...] = ("customers", "products", "orders")
    extra_tables: int = 0
    writer: WriterName = "delta-rs"
    plan_on: Literal["driver", "executors"] = "driver"
    lake_root: str | None = None
    storage: dict[str, object] | None = None
    restart_store: Callable[[], float] | None = None
    store_restarts: int = 0
    driver_seconds: float = 0.0


@dataclass(slots=True)
class TortureResult:
    """What happened, and the verdict."""

    kills: Counter[str] = field(default_factory=Counter)
    damages: Counter[str] = field(default_factory=Counter)
    #: (run, seconds into the run, seconds the object store was away) of each store restart.
    store_restarts: list[tuple[int, float, float]] = field(default_factory=list)
    runs: int = 0
    clean_runs: int = 0
    seconds: float = 0.0
    consistency: ConsistencyReport | None = None
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.consistency is not None and self.consistency.ok


class Torture:
    """Runs the loop of the module docstring."""

    def __init__(self, spec: TortureSpec, say: Say = print) -> None:
        self.spec, self.say = spec, say
        self.rng = random.Random(f"torture:{spec.seed}")
        self.workdir = spec.workdir.resolve()
        self.config_path = self.workdir / "config.yaml"
        self.result = TortureResult()
        self._released: dict[tuple[str, int], int] = {}
        self.widen: WidenWatch | None = None

    # -- set-up -------------------------------------------------------------------------------------
    def prepare(self) -> IngestConfig:
        """Write the config and generate the workload into the staging log."""
        from harness.simulator import WorkloadSpec, generate

        if self.workdir.exists() and any(self.workdir.iterdir()):
            raise SystemExit(f"{self.workdir} is not empty; torture needs a fresh workdir")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(_config(self.spec)))
        config = load_config(self.config_path)
        workload = WorkloadSpec(events=self.spec.events, seed=self.spec.seed, malformed_fraction=0.01,
                                value_format=self.spec.value_format, widen_column=True,
                                extra_tables=self.spec.extra_tables)
        generate(workload, self.staging, EmbeddedSchemaRegistry(config.registry_dir), self.workdir / "truth")
        self.widen = WidenWatch(self.staging, config) if "orders" in self.spec.tables else None
        # The proof's view: the listed tables and those the pattern will find once their topics are live.
        return config.model_copy(update={"tables": (*config.tables, *discovered(config, self.staging.topics()))})

    @property
    def staging(self) -> TopicLog:
        return TopicLog(self.workdir / "staging")

    def release(self, fraction: float, config: IngestConfig) -> int:
        """Copy records up to ``fraction`` of every staging partition into the live log."""
        live, staged, moved = TopicLog(config.log_dir), self.staging, 0
        for spec in config.tables:
            if not live.exists(spec.topic):
                live.create_topic(spec.topic, staged.partitions(spec.topic))
            for p, end in staged.end_offsets(spec.topic).items():
                start, stop = self._released.get((spec.topic, p), 0), int(end * fraction)
                if stop <= start:
                    continue
                rows = staged.read(spec.topic, p, start, stop).to_pylist()
                records = [ProducerRecord(p, r["key"], r["value"], int(r["timestamp"].timestamp() * 1000))
                           for r in rows]
                written = live.append(spec.topic, records)
                assert written[p] == (start, stop), "live offsets must equal staging offsets"
                self._released[(spec.topic, p)] = stop
                moved += stop - start
        return moved

    # -- the loop -----------------------------------------------------------------------------------
    def run(self) -> TortureResult:
        """Prepare, crash ``spec.kills`` times, recover, and check (see module docstring)."""
        started = time.perf_counter()
        config = self.prepare()
        self.say(f"workload: {self.spec.events} events in {len(config.tables)} tables, batches of {self.spec.batch}; "
                 f"target {self.spec.kills} kills; workdir {self.workdir}")
        schedule, damages = list(self.spec.schedule), list(self.spec.damages)
        restarts = self._restart_runs()
        released = 0.0
        while sum(self.result.kills.values()) < self.spec.kills:
            if self.result.runs >= 4 * self.spec.kills + 10:
                self.result.failure = f"only {sum(self.result.kills.values())} kills in {self.result.runs} runs"
                return self._finish(started, config)
            self.result.runs += 1
            n = self.result.runs
            # Every run gets new records, an equal share of what is left for the runs still owed (the
            # kills to come, the store restarts to come): a kill that did not fire or a restart due
            # after its run ended owes one more run, which must find records to ingest too.
            owed = self.spec.kills - sum(self.result.kills.values()) + len([r for r in restarts if r >= n])
            released += (1.0 - released) / max(1, owed)
            self.release(released, config)
            damaged = self._maybe_damage(config, damages)
            if n in restarts:  # the store goes away while this run ingests; no kill
                # Into the run, while it starts or ingests: a run takes some seconds (a run that has
                # caught up, less), and one that ended first owes another.
                outcome, seconds = self._run_once(config, None, n, restart_after=round(self.rng.uniform(2.0, 6.0), 1))
                if outcome == "failed":
                    return self._finish(started, config)
                seen = [f"object store restarted {at:.1f} s into the run (away {away:.1f} s)"
                        for run, at, away in self.result.store_restarts if run == n]
                self.say(f"run {n:>3}: {seen[0] if seen else 'ended before the object store restart was due'}; "
                         f"finished cleanly after {seconds:.1f} s{damaged}")
                if not seen:
                    restarts.add(n + 1)  # try again on the next run
                continue
            kill = choose_kill(self.rng, schedule.pop(0) if schedule else None, lag=self._lag(config),
                               widen_pending=self.widen is not None and self.widen.pending(self._released, config),
                               timer_fraction=self.spec.timer_fraction)
            outcome, seconds = self._run_once(config, kill, n)
            if outcome == "failed":
                return self._finish(started, config)
            label = f"killed at {kill.label}" if outcome == "killed" else "finished cleanly (no kill fired)"
            self.say(f"run {n:>3}: {label} after {seconds:.1f} s{damaged}  "
                     f"[kills {sum(self.result.kills.values())}/{self.spec.kills}]")
        self.release(1.0, config)
        damaged = self._maybe_damage(config, damages) if damages else ""  # forced damage not yet applied
        self.result.runs += 1
        # Restarts still owed (too few kills to place them, or their runs ended first) hit the recovery run.
        owed = len(self.result.store_restarts) < self.spec.store_restarts
        outcome, seconds = self._run_once(config, None, self.result.runs,
                                          restart_after=round(self.rng.uniform(3.0, 10.0), 1) if owed else None)
        restarted = "".join(f"; object store restarted {at:.1f} s into it (away {away:.1f} s)"
                            for run, at, away in self.result.store_restarts if run == self.result.runs)
        self.say(f"recovery run: {outcome} after {seconds:.1f} s{restarted}{damaged}")
        return self._finish(started, config)

    def _restart_runs(self) -> set[int]:
        """Which runs see the object store restarted: spread over the crash loop, never the first."""
        if not self.spec.store_restarts:
            return set()
        if self.spec.restart_store is None:
            raise ValueError("store_restarts needs restart_store: something that restarts the object store")
        span = range(2, self.spec.kills + 1)  # runs that surely come (runs that kill nothing add more)
        return set(self.rng.sample(span, min(self.spec.store_restarts, len(span))))

    def _restart_during(self, n: int, after: float, child: subprocess.Popen[bytes]) -> threading.Timer:
        def restart() -> None:
            if child.poll() is not None:
                return  # the run ended first: it saw no outage; another run gets one
            assert self.spec.restart_store is not None
            self.result.store_restarts.append((n, after, self.spec.restart_store()))

        timer = threading.Timer(after, restart)
        timer.start()
        return timer

    def _finish(self, started: float, config: IngestConfig) -> TortureResult:
        if self.result.failure is None and self._lag(config):
            self.result.failure = f"records left unapplied after the recovery run: lag {self._lag(config)}"
        self.result.consistency = check(config)
        self.result.seconds = time.perf_counter() - started
        return self.result

    def _maybe_damage(self, config: IngestConfig, damages: list[str]) -> str:
        kind = damages[0] if damages else (
            self.rng.choice(DAMAGES) if self.rng.random() < self.spec.damage_probability else None)
        if kind is None:
            return ""
        # One checkpoint per query (a query serves several tables).
        queries = sorted(p.name for p in config.checkpoint_root.iterdir()) if config.checkpoint_root.exists() else []
        what = ""
        for query in self.rng.sample(queries, len(queries)):
            what = damage_checkpoint(config.checkpoint_root / query, kind, self.rng)
            if what:
                break
        if not what:
            return ""  # no checkpoint fit for this damage yet; a forced one waits for the next restart
        if damages:
            damages.pop(0)
        self.result.damages[kind] += 1
        return f"; before it, checkpoint {query}: {what}"

    def _lag(self, config: IngestConfig) -> int:
        log, lag = TopicLog(config.log_dir), 0
        for spec in config.tables:
            state = load_state(config.table_path(spec.name))
            for p, end in (log.end_offsets(spec.topic) if log.exists(spec.topic) else {}).items():
                done = state.applied_offset(spec.topic, p)
                lag += end - (-1 if done is None else done) - 1
        return lag

    def _run_once(self, config: IngestConfig, kill: Kill | None, n: int,
                  restart_after: float | None = None) -> tuple[str, float]:
        """One ``ingest run`` process; returns ``killed``, ``clean`` or ``failed`` and its wall time.

        With ``restart_after``, the object store is restarted that many seconds into the run.
        """
        logs = self.workdir / "torture-logs"
        logs.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("INGEST_KILL_AT", None)
        if kill is not None and kill.fault:
            env["INGEST_KILL_AT"] = kill.fault
        started = time.perf_counter()
        with open(logs / f"run-{n:03d}.log", "w") as out:
            child = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "-c", str(self.config_path)],
                                     stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            timer = self._restart_during(n, restart_after, child) if restart_after is not None else None
            timeout = kill.after if kill is not None and kill.after is not None else self.spec.run_timeout
            try:
                code = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                code = child.wait()
                if kill is None or kill.after is None:
                    code = None  # hung: not one of our kills
            if timer is not None:
                timer.cancel()
                timer.join()  # a restart under way ends before the next run starts
        _reap(child.pid)  # the JVM and Python workers of a killed driver die with its group
        seconds = time.perf_counter() - started
        if code == -signal.SIGKILL and kill is not None:
            self.result.kills[kill.label] += 1
            return "killed", seconds
        if code == 0:
            self.result.clean_runs += 1
            return "clean", seconds
        tail = (logs / f"run-{n:03d}.log").read_text(errors="replace").splitlines()[-15:]
        self.result.failure = (f"run {n} {'hung' if code is None else f'exited with {code}'} "
                               f"({kill.label if kill else 'recovery'}); log {logs / f'run-{n:03d}.log'}:\n"
                               + "\n".join(tail))
        self.say(self.result.failure)
        return "failed", seconds


def _reap(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _config(spec: TortureSpec) -> dict[str, object]:
    prefix = "demo.public"
    return {
        "workdir": ".",
        "source": {"kind": "embedded", "value_format": spec.value_format, "max_records_per_batch": spec.batch,
                   "driver_seconds": spec.driver_seconds},
        "spark": {"master": "local[2]", "shuffle_partitions": 2},
        "target": {"writer": spec.writer, "plan_on": spec.plan_on,
                   **({"root": spec.lake_root, "storage": spec.storage or {}} if spec.lake_root else {})},
        "tables": [t for t in (
            {"name": "customers", "topic": f"{prefix}.customers", "delete_mode": "hard"},
            {"name": "products", "topic": f"{prefix}.products", "delete_mode": "soft"},
            {"name": "orders", "topic": f"{prefix}.orders", "primary_key": ["id"]},
        ) if t["name"] in spec.tables],
        **({"discover": {"topic_pattern": r"demo\.public\.ledger_\d+", "table_name": "{table}"}}
           if spec.extra_tables else {}),
    }


__all__ = ["KILLS", "Torture", "TortureResult", "TortureSpec"]
