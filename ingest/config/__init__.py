"""The declarative configuration file (YAML), as typed models validated on load.

One file describes the source (embedded topic log or Kafka, schema registry, value format), where
Delta tables live, and each table. Relative paths are resolved against the file's ``workdir``
(itself relative to the file). Every field has a one-line description; a bad file raises
:class:`ingest.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from ingest import secrets, yaml_file
from ingest.config.base import Duration, Model, PlacementName, QualityPolicy, WriterName
from ingest.config.source import DebeziumModes, KafkaSpec, RegistrySpec, SourceSpec, TlsSpec, TransactionsSpec
from ingest.config.tables import ColumnSelection, DiscoverySpec, TableSpec
from ingest.config.target import StorageSpec, TargetSpec
from ingest.errors import ConfigError
from ingest.lake.location import LakePath, is_uri

__all__ = [
    "ColumnSelection", "DagsterSpec", "DebeziumModes", "DiscoverySpec", "Duration", "IngestConfig", "KafkaSpec",
    "PlacementName", "QualityPolicy",
    "QualitySpec", "RegistrySpec", "SourceSpec", "SparkSpec", "StorageSpec", "TableSpec", "TargetSpec", "TlsSpec",
    "TransactionsSpec", "WriterName",
    "load_config",
]


class QualitySpec(Model):
    """Where Great Expectations suites live and how validation results are kept."""

    expectations_dir: Path = Field(
        Path("expectations"), description="directory of GX suite JSON files (<suite>.json), relative to this file"
    )
    results_dir: Path = Field(
        Path("quality"), description="validation results per table and batch (ingest quality show), relative to workdir"
    )
    keep_results: int = Field(200, gt=0, description="validation results kept per table; older ones are pruned")
    validate_on: Literal["auto", "driver", "spark"] = Field(
        "auto", description="where Great Expectations validates a batch: driver (a pandas frame in this process) "
        "or spark (a Spark DataFrame, GX's Spark execution engine, on the session's executors); auto: spark for "
        "the tables applied with delta-spark when the master is a cluster's or the table is planned on the "
        "executors (target.plan_on), driver otherwise (on a local master the executors are the driver's own "
        "cores). Same expectations, policies, results and quarantine either way"
    )
    driver_rows: int = Field(
        100_000, ge=0, description="under validate_on: auto, a batch that would be validated on Spark is "
        "validated on the driver when it holds at most this many rows to validate: they are collected in one "
        "Spark job, where GX's Spark engine runs a few per expectation. Lower it to bound the driver's memory "
        "(0: always Spark)"
    )


class DagsterSpec(Model):
    """What the Dagster definitions (assets/, dagster_project/) build from this configuration; the
    engine itself does not read it."""

    mode: Literal["run", "observe"] = Field(
        "run", description="run: materializing a table's asset drains it in the Dagster run (Spark starts there; "
        "for scheduled or sensor-driven catch-ups); observe: a service (ingest run --continuous) applies the changes "
        "and Dagster records its commits from the audit table, without Spark (the tables are external assets)")
    prefix: str = Field(
        "cdc", pattern=r"^[A-Za-z][A-Za-z0-9_]*$", description="asset key prefix of the tables (<prefix>/<table>) "
        "and the stem of every other name: the <prefix>_tables group, the <prefix>_ingest_all_tables and "
        "<prefix>_table_maintenance jobs, the <prefix>_offsets_sensor, the <prefix>_table_maintenance_daily "
        "schedule, the pools and the resource key; two configurations with different prefixes live in one "
        "Definitions", examples=["erp"])
    group: str | None = Field(None, description="asset group of the tables; unset: <prefix>_tables")
    analytics: bool = Field(
        False, description="also build the demo's analytic assets (daily revenue by segment, orders by status), "
        "which expect the demo schema's orders, customers and order_items tables and their columns")
    max_lag_records: int = Field(
        0, ge=0, description="the lag check: records a table may have pending without further question")
    max_staleness: Duration = Field(
        timedelta(hours=1), description="the lag check: with more pending than that, the table's newest commit "
        "must be this recent (a duration: 90s, 15m, 1h, 1d)", examples=["15m"])


def local_cores(master: str) -> int | None:
    """The task slots of a ``local`` master (``local``, ``local[4]``, ``local[*]``), None for a cluster's."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    count = match.group(1)
    return (os.cpu_count() or 1) if count == "*" else int(count or 1)


class SparkSpec(Model):
    """Spark session settings."""

    master: str = Field("local[2]", description="Spark master URL")
    shuffle_partitions: int = Field(2, gt=0, description="spark.sql.shuffle.partitions")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark configuration")
    jit: Literal["auto", "quick", "full"] = Field(
        "auto", description="the driver JVM's JIT compiler: quick (C1 only) compiles far less and suits a JVM "
        "that only plans and hands batches over; full (C1 then C2) makes JVM-heavy work faster in the long run; "
        "auto: quick unless Spark's Kafka source reads (source.kafka.reader: spark), or a table applies with "
        "delta-spark and the run is continuous (a run that drains ends before C2 pays back)"
    )


class IngestConfig(Model):
    """The whole configuration file."""

    workdir: Path = Field(Path("."), description="base directory for relative paths, relative to this file")
    source: SourceSpec = Field(default_factory=SourceSpec, description="where changes come from")
    target: TargetSpec = Field(default_factory=TargetSpec, description="where tables are written")
    secrets_file: Path | None = Field(
        None, description="optional YAML file of NAME: value secrets, consulted after the environment (chmod 600)"
    )
    spark: SparkSpec = Field(default_factory=SparkSpec, description="Spark session settings")
    quality: QualitySpec = Field(default_factory=QualitySpec, description="data quality suites and results")
    dagster: DagsterSpec = Field(default_factory=DagsterSpec, description="what the Dagster definitions build")
    tables: tuple[TableSpec, ...] = Field((), description="the tables to ingest (and overrides of discovered ones)")
    discover: DiscoverySpec | None = Field(None, description="also ingest every topic matching a pattern")

    def writer_of(self, spec: TableSpec) -> WriterName:
        """Who writes one table's Delta commits (``writer``, else ``target.writer``)."""
        return spec.writer or self.target.writer

    def validates_on_spark(self, spec: TableSpec) -> bool:
        """Whether the table's batches are validated on a Spark DataFrame (``quality.validate_on``)."""
        where = self.quality.validate_on
        if where == "auto":  # rows on the driver: shipping them pays only for a cluster; else they are in Spark
            return self.writer_of(spec) == "delta-spark" and (local_cores(self.spark.master) is None
                                                              or self.placement_of(spec) == "executors")
        return where == "spark"

    def placement_of(self, spec: TableSpec) -> PlacementName:
        """Where the table's batches are assembled, reduced and planned (``plan_on``, else ``target.plan_on``).

        A table with an expectations suite validated on the driver (``quality.validate_on: driver``) is
        planned there: its winners would come to the driver for every batch anyway.
        """
        wanted = spec.plan_on or self.target.plan_on
        if wanted == "executors" and spec.expectations and self.quality.validate_on == "driver":
            return "driver"
        return wanted

    def writers(self) -> set[WriterName]:
        """Every writer a run of this configuration may use (discovered tables included)."""
        found: set[WriterName] = {self.writer_of(spec) for spec in self.tables}
        if self.discover is not None:
            found.add(self.writer_of(self.discover.spec("discovered", "discovered")))
        return found

    @model_validator(mode="after")
    def _placements(self) -> IngestConfig:
        """A table planned on the executors is merged from there, which only delta-spark does."""
        specs = list(self.tables)
        if self.discover is not None:
            specs.append(self.discover.spec("discovered", "discovered"))
        for spec in specs:
            if (spec.plan_on or self.target.plan_on) == "executors" and self.writer_of(spec) == "delta-rs":
                where = "discover.defaults" if spec.name == "discovered" else f"table {spec.name!r}"
                raise ValueError(
                    f"{where} is planned on the executors (plan_on: executors) but written by delta-rs, which "
                    "merges Arrow tables on the driver and cannot read rows that stay in Spark: choose "
                    "writer: delta-spark for it, or plan_on: driver")
        return self

    def consistent_tables(self) -> list[TableSpec]:
        """The tables kept consistent with each other (``source.transactions``); none without it."""
        group = self.source.transactions
        if group is None:
            return []
        return [self.table(name) for name in group.tables] if group.tables else list(self.tables)

    @model_validator(mode="after")
    def _one_connector(self) -> IngestConfig:
        """The tables of a transaction group come from the connector that writes its transaction topic."""
        group = self.source.transactions
        if group is None:
            return self
        known = {t.name for t in self.tables}
        unknown = [name for name in group.tables or () if name not in known]
        if unknown:
            raise ValueError(f"source.transactions.tables names {', '.join(map(repr, unknown))}, which "
                             f"{'is' if len(unknown) == 1 else 'are'} not a configured table")
        for spec in self.consistent_tables():
            if self.placement_of(spec) == "executors":
                raise ValueError(f"table {spec.name!r} is in the transaction group but planned on the executors "
                                 "(plan_on: executors): a group's tables are planned on the driver, where each "
                                 "batch is ended at a transaction boundary; use plan_on: driver for it")
            if not spec.topic.startswith(group.prefix + "."):
                raise ValueError(f"table {spec.name!r} reads topic {spec.topic!r}, which is not from the connector "
                                 f"that writes {group.topic!r} (its topics are {group.prefix}.<schema>.<table>): "
                                 "a cut can hold only tables of one connector")
        return self

    @model_validator(mode="after")
    def _unique(self) -> IngestConfig:
        if not self.tables and self.discover is None:
            raise ValueError("no tables: list them under 'tables' or find them with 'discover.topic_pattern'")
        for attr in ("name", "topic"):
            seen: set[str] = set()
            for table in self.tables:
                value = getattr(table, attr)
                if value in seen:
                    raise ValueError(f"two tables have the same {attr} {value!r}")
                seen.add(value)
        for shared in ("audit_table", "quarantine_table"):
            if any(table.name == getattr(self.target, shared) for table in self.tables):
                raise ValueError(f"a table is named {getattr(self.target, shared)!r}, the name of target.{shared} "
                                 f"(both would be written to one directory): rename the table or set target.{shared}")
        return self

    # -- resolved paths -------------------------------------------------------------------------
    def path(self, relative: Path) -> Path:
        return relative if relative.is_absolute() else (self.workdir / relative)

    @property
    def log_dir(self) -> Path:
        return self.path(self.source.log_dir)

    @property
    def registry_dir(self) -> Path:
        return self.path(self.source.registry.dir)

    def _location(self, value: str) -> LakePath:
        """A configured location: an ``s3://`` prefix with target.storage's options, or a directory
        relative to workdir."""
        if is_uri(value):
            return LakePath(value, self.target.storage.delta_options())
        return LakePath.local_dir(self.path(Path(value)))

    @property
    def tables_root(self) -> LakePath:
        """The lake: a local directory, or an ``s3://`` prefix with the storage options that reach it."""
        return self._location(self.target.root)

    @property
    def lake_is_local(self) -> bool:
        return not is_uri(self.target.root)

    @property
    def checkpoint_location(self) -> LakePath:
        """Where the Spark checkpoints live: a local directory, or an ``s3://`` prefix reached like the lake."""
        return self._location(self.target.checkpoint_dir)

    @property
    def checkpoint_root(self) -> Path:
        """The local checkpoint directory (tools that edit checkpoint files; an object-store one raises)."""
        return self.checkpoint_location.local

    @property
    def secrets_path(self) -> Path | None:
        return self.path(self.secrets_file) if self.secrets_file is not None else None

    @property
    def expectations_dir(self) -> Path:
        """Suites directory (made absolute against the config file by :func:`load_config`)."""
        return self.quality.expectations_dir

    @property
    def quality_results_dir(self) -> Path:
        return self.path(self.quality.results_dir)

    def table_path(self, name: str) -> LakePath:
        return self.tables_root / name

    def table(self, name: str) -> TableSpec:
        for table in self.tables:
            if table.name == name:
                return table
        known = ", ".join(t.name for t in self.tables)
        raise ConfigError(f"no table named {name!r} in the configuration (its tables: {known})")


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _read_raw(path: Path, *, seen: tuple[Path, ...]) -> dict[str, Any]:
    """The file's mapping; ``extends: other.yaml`` (relative to the file) is read first and overridden
    key by key (mappings merged, anything else replaced), so a variant states only what differs."""
    try:
        raw = yaml_file.load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a configuration file") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_file.problem(exc)}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    _rename_old_keys(raw, path)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    parent = (path.parent / str(base)).resolve()
    if parent in seen or parent == path.resolve():
        raise ConfigError(f"{path}: extends {base} again (a cycle)")
    if not parent.is_file():
        raise ConfigError(f"{path}: extends: {parent} is not a file")
    return _merged(_read_raw(parent, seen=(*seen, path.resolve())), raw)


#: Keys renamed since they were first documented: old name -> new name (the old one still loads).
RENAMED_KEYS = {"engine": "writer"}


def _rename_old_keys(raw: dict[str, Any], path: Path) -> None:
    """A file's old key names, in the mappings that have them, as today's: so that a variant
    (``extends:``) overrides its base whichever name each of them uses."""
    target = raw.get("target")
    tables = raw.get("tables")
    discover = raw.get("discover")
    mappings = [("target", target)] if isinstance(target, dict) else []
    mappings += [(f"tables[{n}]", t) for n, t in enumerate(tables or []) if isinstance(t, dict)] \
        if isinstance(tables, list) else []
    if isinstance(discover, dict) and isinstance(discover.get("defaults"), dict):
        mappings.append(("discover.defaults", discover["defaults"]))
    for where, mapping in mappings:
        for old, new in RENAMED_KEYS.items():
            if old in mapping:
                if new in mapping:
                    raise ConfigError(f"{path}: {where}: {old} and {new} name the same setting; keep {new}")
                mapping[new] = mapping.pop(old)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _tls_resolved(source: SourceSpec, path: Path) -> SourceSpec:
    """``source`` with its TLS files resolved against the configuration file's directory (they belong
    with it, as the suites do; a file that is missing is reported by the client that reads it)."""
    def resolved(tls: TlsSpec | None) -> TlsSpec | None:
        if tls is None:
            return None
        return tls.model_copy(update={name: (path.parent / file).resolve() for name, file in tls.files().items()})

    update: dict[str, Any] = {"registry": source.registry.model_copy(update={"tls": resolved(source.registry.tls)})}
    if source.kafka is not None:
        update["kafka"] = source.kafka.model_copy(update={"tls": resolved(source.kafka.tls)})
    return source.model_copy(update=update)


def load_config(path: str | os.PathLike[str], *, workdir: str | os.PathLike[str] | None = None) -> IngestConfig:
    """Read, validate and resolve a configuration file.

    Args:
        path: the YAML file.
        workdir: overrides the file's ``workdir`` (used by ``ingest demo --workdir``).

    Raises:
        ConfigError: the file is missing, not YAML, or a field is invalid; the message names both.
    """
    path = Path(path)
    raw = _read_raw(path, seen=())
    try:
        config = IngestConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_format_location(e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{path}: {problems}") from None
    base = Path(workdir) if workdir is not None else (path.parent / config.workdir)
    # Suites belong with the configuration (versioned beside it), not with the data in workdir.
    suites = config.quality.expectations_dir
    quality = config.quality.model_copy(update={"expectations_dir": (path.parent / suites).resolve()})
    config = config.model_copy(update={"workdir": base.resolve(), "quality": quality,
                                       "source": _tls_resolved(config.source, path)})
    if not config.lake_is_local or not config.checkpoint_location.is_local:
        # delta-rs, polars and boto3 read an object store's keys from the environment: those kept in
        # the secrets file are exported there (the environment wins), for every command, not only runs.

        secrets.prepare((), config.secrets_path)
    return config

