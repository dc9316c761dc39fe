"""The demo: simulate a source database, ingest its change stream, verify every table.

Running it again over the same workdir re-reads the whole stream on purpose: every record is
recognised as already applied and no table changes (same Delta version, same files).

The simulated source writes some values the demo's expectations suites reject
(``quality_violation_fraction``); the quality gate quarantines those changes, so a table may
differ from the source exactly at the keys the quarantine holds. Verification counts such keys as
*explained*; any other difference is a mismatch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ingest.config import IngestConfig
from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.lake.delta import open_table
from ingest.lake.layout import TablePaths
from ingest.lake.location import Location
from ingest.records import quarantine
from ingest.source.topiclog import TopicLog
from ingest.stream.callback import ProgressFn
from ingest.stream.report import RunReport
from ingest.stream.runner import Runner
from ingest.verify.compare import TableVerification, verify_table


@dataclass(slots=True)
class TableFingerprint:
    version: int | None
    files: str

    @classmethod
    def of(cls, path: Location) -> TableFingerprint:
        table = open_table(path)
        if table is None:
            return cls(None, "")
        digest = hashlib.sha1("\n".join(sorted(table.file_uris())).encode()).hexdigest()[:12]
        return cls(table.version(), digest)


@dataclass(slots=True)
class DemoResult:
    generated: bool
    report: RunReport
    verifications: list[TableVerification]
    before: dict[str, TableFingerprint]
    after: dict[str, TableFingerprint]
    counts: dict[str, dict[str, int]]

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verifications) and not self.report.failed

    @property
    def unchanged(self) -> dict[str, bool]:
        return {name: self.before[name] == self.after[name] for name in self.after}


def truth_dir(config: IngestConfig) -> Path:
    return config.workdir / "truth"


def prepare_workload(config: IngestConfig, *, events: int, seed: int, malformed_fraction: float,
                     violation_fraction: float = 0.0, progress: ProgressFn | None = None,
                     on_generate=None) -> bool:
    """Generate the simulated change stream unless this workdir already holds the same one."""
    from harness.simulator import WorkloadSpec, generate

    spec = WorkloadSpec(events=events, seed=seed, malformed_fraction=malformed_fraction,
                        quality_violation_fraction=violation_fraction, value_format=config.source.value_format)
    marker = config.workdir / "workload.json"
    wanted = json.dumps(asdict(spec), sort_keys=True, default=str)
    if marker.exists():
        # A marker written before a spec field existed holds that field's default.
        held = {**json.loads(json.dumps(asdict(WorkloadSpec()), default=str)), **json.loads(marker.read_text())}
        if json.dumps(held, sort_keys=True) == wanted:
            return False
        raise SystemExit(
            f"{config.workdir} holds a different workload ({marker}); use another --workdir or delete it"
        )
    config.workdir.mkdir(parents=True, exist_ok=True)
    generate(spec, TopicLog(config.log_dir), EmbeddedSchemaRegistry(config.registry_dir), truth_dir(config),
             progress=on_generate)
    marker.write_text(wanted)
    return True


def verify_all(config: IngestConfig) -> list[TableVerification]:
    from harness.simulator import Truth

    truth = Truth.load(truth_dir(config))
    results = []
    for spec in config.tables:
        expected = truth.tables.get(spec.name)
        if expected is None:
            continue
        paths = TablePaths.of(config, spec.name)
        keys = truth.key_columns[spec.name]
        # Keys whose changes the quality gate holds may differ from the source, and only those.
        explained = explained_keys(paths.quarantine, spec.name, keys)
        results.append(verify_table(spec.name, paths.table, expected, keys, explained_keys=explained))
    return results


def explained_keys(path: Location, table: str, key_columns: Sequence[str]) -> set[tuple[object, ...]]:
    """Keys whose changes the quality gate holds (not replayed yet): where a table may differ from its source."""
    return {tuple(key.get(k) for k in key_columns)
            for key, _ in quarantine.pending_row_keys(path, table, stage="quality")}


def run_demo(config: IngestConfig, *, events: int, seed: int, malformed_fraction: float,
             violation_fraction: float = 0.0, progress: ProgressFn | None = None, on_generate=None) -> DemoResult:
    generated = prepare_workload(config, events=events, seed=seed, malformed_fraction=malformed_fraction,
                                 violation_fraction=violation_fraction, on_generate=on_generate)
    before = {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    # Always read the stream from offset 0: on a second run this is the replay the demo shows off.
    report = Runner(config).run(from_beginning=True, progress=progress)
    after = {t.name: TableFingerprint.of(config.table_path(t.name)) for t in config.tables}
    from harness.simulator import Truth

    counts = Truth.load(truth_dir(config)).counts
    return DemoResult(generated, report, verify_all(config), before, after, counts)
