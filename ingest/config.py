"""The declarative configuration file (YAML), as typed models validated on load.

One file describes the source (embedded topic log or Kafka, schema registry, value format), where
Delta tables live, and each table. Relative paths are resolved against the file's ``workdir``
(itself relative to the file). Every field has a one-line description; a bad file raises
:class:`ingest.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from ingest.errors import ConfigError
from ingest.lake import OBJECT_STORE_SCHEMES, LakePath, delta_storage_options, is_uri

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_SOURCE_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}\.[A-Za-z_][A-Za-z0-9_$]{0,62}$")
_SECRET_OPTION = re.compile(r"(?i)password|jaas|secret|token")
_URL_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*@")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

#: What failing expectations do: record only, quarantine the failing rows, or stop the table's batch.
QualityPolicy = Literal["warn", "quarantine", "fail"]
EngineName = Literal["delta-rs", "delta-spark"]


def _parse_duration(value: Any) -> Any:
    """Accept ``7d``/``12h``/``30m`` besides pydantic's seconds and ISO-8601 forms."""
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    return value


Duration = Annotated[timedelta, BeforeValidator(_parse_duration)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegistrySpec(_Model):
    """Where Avro schemas are looked up by id."""

    kind: Literal["embedded", "confluent"] = Field(
        "embedded", description="embedded files or a Confluent-compatible registry"
    )
    dir: Path = Field(Path("schemas"), description="embedded: directory of the registry, relative to workdir")
    url: str | None = Field(None, description="confluent: registry URL")
    credentials_env: str = Field(
        "SCHEMA_REGISTRY_USER_INFO",
        description="confluent: name of the environment variable holding 'user:password' (never the secret itself)",
    )

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        # The message must not echo the URL: it holds the secret.
        if value and _URL_USERINFO.match(value.strip()):
            raise ValueError("must not contain credentials (user:password@); put 'user:password' in the "
                             "environment variable named by credentials_env or in the secrets file")
        return value


class KafkaSpec(_Model):
    """Connection to a Kafka cluster (used by Spark's Kafka source when its jar is available)."""

    bootstrap_servers: str = Field(description="host:port list, comma separated")
    options: dict[str, str] = Field(
        default_factory=dict, description="extra kafka.* options passed to the Spark Kafka source (no secrets)"
    )
    credentials_env: str = Field(
        "KAFKA_SASL_JAAS_CONFIG", description="environment variable holding the SASL JAAS config, if any"
    )

    @field_validator("options")
    @classmethod
    def _no_secret_options(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if _SECRET_OPTION.search(key):
                raise ValueError(f"option {key!r} carries a secret; supply it through the environment "
                                 "(credentials_env) or the secrets file, not the configuration")
        return value


class SourceSpec(_Model):
    """Where change events come from."""

    kind: Literal["embedded", "kafka"] = Field("embedded", description="embedded topic log (default) or Kafka")
    log_dir: Path = Field(Path("topics"), description="embedded: topic log root, relative to workdir")
    kafka: KafkaSpec | None = Field(None, description="kafka: cluster connection")
    registry: RegistrySpec = Field(default_factory=RegistrySpec, description="schema registry for Avro values")
    value_format: Literal["avro", "json"] = Field(
        "avro", description="Debezium converter: avro (Confluent framing) or json"
    )
    max_records_per_batch: int = Field(
        20_000, gt=0, description="upper bound on records per micro-batch of a query, all its topics together "
        "(maxOffsetsPerTrigger)"
    )
    queries: int = Field(
        1, gt=0, description="streaming queries the tables share (tables are dealt to them in turn); each "
        "micro-batch of a query is decoded once and applied per table"
    )
    retry_stopped_seconds: float = Field(
        30.0, gt=0, description="continuous runs: a table stopped by a transient error (a registry or broker "
        "that does not answer, a concurrent writer) is tried again after this long, then twice as long each "
        "time up to 10 minutes, at the next micro-batch; it first catches up from the offsets its Delta log "
        "records. A table stopped by any other error stays stopped until the run is restarted"
    )

    @model_validator(mode="after")
    def _kafka_needs_connection(self) -> SourceSpec:
        if self.kind == "kafka" and self.kafka is None:
            raise ValueError("source.kind is 'kafka' but source.kafka (bootstrap_servers) is missing")
        if self.registry.kind == "confluent" and not self.registry.url:
            raise ValueError("source.registry.kind is 'confluent' but source.registry.url is missing")
        return self


class StorageSpec(_Model):
    """How to reach an object-store lake (``target.root: s3://bucket/prefix``). No credentials here.

    Keys come from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``) in the
    environment or the secrets file.
    """

    endpoint_url: str | None = Field(
        None, description="S3 API endpoint, e.g. http://127.0.0.1:9000 for MinIO; default: AWS for the region")
    region: str = Field("us-east-1", description="the bucket's region (S3-compatible servers accept any)")
    path_style: bool = Field(
        True, description="address buckets as <endpoint>/<bucket> (MinIO, most S3-compatible servers) rather "
        "than <bucket>.<endpoint> (AWS virtual-hosted style)")
    allow_http: bool | None = Field(
        None, description="allow plain http (default: only when endpoint_url starts with http://)")
    lease_seconds: float = Field(
        60.0, ge=5, description="the single-writer lease of each table on the object store: a run renews it "
        "every third of this; a run that died holding it blocks the table this long at most")
    retry_seconds: float = Field(
        120.0, ge=0, description="how long a request to the store is retried, with growing pauses, before it "
        "fails: a restart or stall of the store shorter than this is ridden out (0: fail at the first error)")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if _URL_USERINFO.match(value.strip()):
            raise ValueError("must not contain credentials (user:password@); set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY in the environment or the secrets file")
        if not re.match(r"^https?://[^/\s]+/?$", value.strip()):
            raise ValueError("expected http(s)://host[:port]")
        return value.strip().rstrip("/")

    def delta_options(self) -> Mapping[str, str]:
        """delta-rs storage options for this endpoint."""
        allow_http = self.allow_http if self.allow_http is not None else bool(
            self.endpoint_url and self.endpoint_url.startswith("http://"))
        return delta_storage_options(endpoint_url=self.endpoint_url, region=self.region,
                                     path_style=self.path_style, allow_http=allow_http,
                                     retry_seconds=self.retry_seconds)


def _lake_uri(value: str) -> str:
    """A lake or checkpoint location as given: a directory, or an ``s3://`` URI (``s3a://`` normalised)."""
    value = value.strip()
    if is_uri(value):
        scheme = value.split("://", 1)[0].lower()
        if scheme not in OBJECT_STORE_SCHEMES:
            raise ValueError(f"object store {scheme!r} is not supported yet: give s3://bucket/prefix or a "
                             "directory (docs/object-storage.md says what ADLS and GCS need)")
        if _URL_USERINFO.match(value):
            raise ValueError("must not contain credentials; set them in the environment or the secrets file")
        rest = value.split("://", 1)[1].strip("/")
        if not rest:
            raise ValueError("expected s3://bucket[/prefix]")
        return f"s3://{rest}"  # delta-rs and boto3 name it s3; Spark's s3a is derived where needed
    return value


class TargetSpec(_Model):
    """Where Delta tables, audit, quarantine and checkpoints live."""

    root: str = Field(
        "tables", description="where the Delta tables live: a directory (relative to workdir) or "
        "s3://bucket/prefix (see target.storage)")
    storage: StorageSpec = Field(default_factory=StorageSpec, description="object-store lake: endpoint, region, "
                                 "addressing, lease")
    audit_table: str = Field("_cdc_audit", description="name of the audit Delta table under root")
    quarantine_table: str = Field("_cdc_quarantine", description="name of the quarantine Delta table under root")
    checkpoint_dir: str = Field(
        "checkpoints", description="Spark checkpoints, one per query: a directory (relative to workdir) or "
        "s3://bucket/prefix, reached with target.storage (where the driver's disk does not outlive a run). They "
        "are disposable: each table's Delta log records the offsets it applied, and a damaged checkpoint is "
        "discarded")
    target_file_size_mb: int = Field(
        8, gt=0, description="target Parquet file size written by MERGE and compaction; delta-rs rewrites every "
        "file a MERGE touches, so small files keep a hot-set MERGE small (benchmarks/bench_merge.py)")
    engine: EngineName = Field(
        "delta-rs", description="what applies the batches: delta-rs (on the driver, no JVM jar needed) or "
        "delta-spark (MERGE as Spark jobs, deletion vectors); a table may choose its own")
    deletion_vectors: bool = Field(
        True, description="delta-spark: tables it creates write deletion vectors (a MERGE marks rows deleted "
        "instead of rewriting their files); delta-rs can then no longer write or read them, polars and Spark can")
    change_data_feed: bool = Field(
        True, description="tables record Delta's change data feed (delta.enableChangeDataFeed; an existing table "
        "without it is switched on at its next batch): `ingest changes` and downstream readers get each commit's "
        "inserts, update pre/post images and deletes")

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        return _lake_uri(value)

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint(cls, value: str) -> str:
        return _lake_uri(value)


class ColumnSelection(_Model):
    """Which source columns a table keeps: ``include`` (only these) or ``exclude`` (all but these).

    Primary-key columns are always kept. A column left out never reaches the table: its values,
    its type and any change of its type are ignored.
    """

    include: tuple[str, ...] | None = Field(None, description="keep only these columns (and the key)")
    exclude: tuple[str, ...] | None = Field(None, description="keep every column but these (never the key)")

    @model_validator(mode="after")
    def _one_list(self) -> ColumnSelection:
        if (self.include is None) == (self.exclude is None):
            raise ValueError("give exactly one of include or exclude")
        return self

    def keeps(self, name: str, key_columns: Iterable[str] = ()) -> bool:
        if name in key_columns:
            return True
        return name in self.include if self.include is not None else name not in (self.exclude or ())


class TableSpec(_Model):
    """One target table fed by one Debezium topic."""

    name: str = Field(description="table name: letters, digits and underscores; also its directory name")
    topic: str = Field(description="Debezium topic carrying this table's changes")
    primary_key: tuple[str, ...] | None = Field(
        None, description="primary-key columns; default: the fields of the Kafka message key"
    )
    delete_mode: Literal["hard", "soft"] = Field(
        "hard", description="hard: readers see live rows only; soft: deleted rows stay, flagged _cdc_deleted"
    )
    tombstone_retention: Duration = Field(
        timedelta(days=7), description="how long a deleted key is remembered so old events cannot resurrect it"
    )
    kafka_tombstones: Literal["auto", "delete", "ignore"] = Field(
        "auto", description="what a Kafka tombstone (null value) means: auto: the delete of its key when the "
        "stream carries ExtractNewRecordState rows, nothing after full envelopes; delete; ignore"
    )
    expectations: str | None = Field(
        None, description="Great Expectations suite name: <quality.expectations_dir>/<name>.json"
    )
    quality_policy: QualityPolicy = Field(
        "warn", description="what failing expectations do: record only, quarantine rows, or stop the table"
    )
    expectation_policies: dict[str, QualityPolicy] = Field(
        default_factory=dict,
        description="policy per expectation name, overriding the suite's meta.policy and quality_policy",
    )
    engine: EngineName | None = Field(
        None, description="this table's apply engine (delta-rs or delta-spark); default: target.engine")
    columns: ColumnSelection | None = Field(
        None, description="source columns to keep: {include: [...]} or {exclude: [...]}; the key is always kept")
    ignore_null_updates: bool = Field(
        False, description="an update's null columns keep the stored value (for streams whose updates carry "
        "only the changed columns); handled as unchanged-TOAST placeholders are")
    history_mode: Literal["scd1", "scd2"] = Field(
        "scd1", description="scd1: keep the latest version of each row; scd2: keep every version, valid from "
        "_cdc_valid_from to _cdc_valid_to, the current one flagged _cdc_is_current (a table keeps the mode it "
        "was created with)"
    )
    track_history: ColumnSelection | None = Field(
        None, description="scd2: the columns whose change opens a new version ({include: [...]} or "
        "{exclude: [...]}); a change of the others updates the current version in place. Default: all")
    source_table: str | None = Field(
        None, description="schema.table in the source database, for verify --source-db; default from a "
        "Debezium topic name <prefix>.<schema>.<table>"
    )

    @field_validator("source_table")
    @classmethod
    def _schema_dot_table(cls, value: str | None) -> str | None:
        if value is not None and not _SOURCE_TABLE.match(value):
            raise ValueError("must be <schema>.<table>: two names of letters, digits, underscores or $, "
                             "separated by one dot")
        return value

    @field_validator("topic")
    @classmethod
    def _kafka_topic(cls, value: str) -> str:
        # Kafka's own rules; they also keep the name safe as a directory and in `cdc:<topic>:<p>` ids.
        if not _TOPIC.match(value) or value in (".", ".."):
            raise ValueError("must be 1-249 characters from [A-Za-z0-9._-] and not '.' or '..' (Kafka's topic rules)")
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _NAME.match(value) or value.startswith("_cdc_"):
            raise ValueError(
                "must start with a letter or underscore, hold only letters, digits and underscores "
                "(at most 128), and not start with '_cdc_'"
            )
        return value

    @model_validator(mode="after")
    def _policies_need_a_suite(self) -> TableSpec:
        if self.expectation_policies and not self.expectations:
            raise ValueError("expectation_policies is set but the table names no expectations suite")
        return self

    @model_validator(mode="after")
    def _history_needs_scd2(self) -> TableSpec:
        if self.track_history is not None and self.history_mode != "scd2":
            raise ValueError("track_history is set but history_mode is not scd2")
        return self


#: TableSpec fields a discovered table takes from its topic, not from ``discover.defaults``.
_DISCOVERED_OWN: frozenset[str] = frozenset({"name", "topic", "source_table"})


class DiscoverySpec(_Model):
    """Tables found by topic name: every topic matching ``topic_pattern`` becomes a table.

    A topic named ``<prefix>.<schema>.<table>`` (Debezium's naming) gets the table
    ``table_name`` with ``{prefix}``, ``{schema}`` and ``{table}`` filled in; characters a table
    name cannot hold become ``_``. A table listed under ``tables`` with the same topic wins: that is
    how one discovered table is configured differently. See :mod:`ingest.discovery`.
    """

    topic_pattern: str = Field(description="regular expression a topic's whole name must match")
    table_name: str = Field("{schema}_{table}", description="table name made from <prefix>.<schema>.<table>")
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="settings of every discovered table (any table field but name, topic "
        "and source_table); default: key from the Kafka key, hard deletes, no suite")
    refresh_seconds: float = Field(30.0, gt=0, description="continuous runs: how often new topics are looked for")

    @field_validator("topic_pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("table_name")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(prefix="p", schema="s", table="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"may use only {{prefix}}, {{schema}} and {{table}}: {exc!r}") from None
        return value

    @field_validator("defaults")
    @classmethod
    def _table_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        own = sorted(_DISCOVERED_OWN & set(value))
        if own:
            raise ValueError(f"{', '.join(own)}: taken from each topic, not a default")
        TableSpec(name="probe", topic="probe", **value)  # a wrong field or value fails here, at load
        return value

    def spec(self, name: str, topic: str) -> TableSpec:
        """The spec of one discovered table."""
        return TableSpec(name=name, topic=topic, **self.defaults)


class QualitySpec(_Model):
    """Where Great Expectations suites live and how validation results are kept."""

    expectations_dir: Path = Field(
        Path("expectations"), description="directory of GX suite JSON files (<suite>.json), relative to this file"
    )
    results_dir: Path = Field(
        Path("quality"), description="validation results per table and batch (ingest quality show), relative to workdir"
    )
    keep_results: int = Field(200, gt=0, description="validation results kept per table; older ones are pruned")


class SparkSpec(_Model):
    """Spark session settings."""

    master: str = Field("local[2]", description="Spark master URL")
    shuffle_partitions: int = Field(2, gt=0, description="spark.sql.shuffle.partitions")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark configuration")


class IngestConfig(_Model):
    """The whole configuration file."""

    workdir: Path = Field(Path("."), description="base directory for relative paths, relative to this file")
    source: SourceSpec = Field(default_factory=SourceSpec, description="where changes come from")
    target: TargetSpec = Field(default_factory=TargetSpec, description="where tables are written")
    secrets_file: Path | None = Field(
        None, description="optional YAML file of NAME: value secrets, consulted after the environment (chmod 600)"
    )
    spark: SparkSpec = Field(default_factory=SparkSpec, description="Spark session settings")
    quality: QualitySpec = Field(default_factory=QualitySpec, description="data quality suites and results")
    tables: tuple[TableSpec, ...] = Field((), description="the tables to ingest (and overrides of discovered ones)")
    discover: DiscoverySpec | None = Field(None, description="also ingest every topic matching a pattern")

    def engine_of(self, spec: TableSpec) -> EngineName:
        """The apply engine of one table."""
        return spec.engine or self.target.engine

    def engines(self) -> set[EngineName]:
        """Every apply engine a run of this configuration may use (discovered tables included)."""
        found: set[EngineName] = {self.engine_of(spec) for spec in self.tables}
        if self.discover is not None:
            found.add(self.discover.defaults.get("engine") or self.target.engine)
        return found

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

    @property
    def tables_root(self) -> LakePath:
        """The lake: a local directory, or an ``s3://`` prefix with the storage options that reach it."""
        if is_uri(self.target.root):
            return LakePath(self.target.root, self.target.storage.delta_options())
        return LakePath.local_dir(self.path(Path(self.target.root)))

    @property
    def lake_is_local(self) -> bool:
        return not is_uri(self.target.root)

    @property
    def checkpoint_location(self) -> LakePath:
        """Where the Spark checkpoints live: a local directory, or an ``s3://`` prefix reached like the lake."""
        if is_uri(self.target.checkpoint_dir):
            return LakePath(self.target.checkpoint_dir, self.target.storage.delta_options())
        return LakePath.local_dir(self.path(Path(self.target.checkpoint_dir)))

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
        raise ConfigError(f"no table named {name!r} in the configuration (known: {[t.name for t in self.tables]})")


def _format_location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _read_raw(path: Path, *, seen: tuple[Path, ...]) -> dict[str, Any]:
    """The file's mapping; ``extends: other.yaml`` (relative to the file) is read first and overridden
    key by key (mappings merged, anything else replaced), so a variant states only what differs."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    base = raw.pop("extends", None)
    if base is None:
        return raw
    parent = (path.parent / str(base)).resolve()
    if parent in seen or parent == path.resolve():
        raise ConfigError(f"{path}: extends {base} again (a cycle)")
    return _merged(_read_raw(parent, seen=(*seen, path.resolve())), raw)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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
    config = config.model_copy(update={"workdir": base.resolve(), "quality": quality})
    if not config.lake_is_local or not config.checkpoint_location.is_local:
        # delta-rs, polars and boto3 read an object store's keys from the environment: those kept in
        # the secrets file are exported there (the environment wins), for every command, not only runs.
        from ingest import secrets

        secrets.prepare((), config.secrets_path)
    return config
