"""``source:``: the embedded topic log or a Kafka cluster, the schema registry and the value format."""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, field_validator, model_validator

from ingest.config.base import SECRET_OPTION, URL_USERINFO, Model
from ingest.config.tables import topic_prefix

#: Java client options (``kafka.<name>`` in ``source.kafka.options``) that mean the same to librdkafka,
#: which the admin client and the engine's own reader use.
SHARED_KAFKA_OPTIONS: Final = frozenset({
    "security.protocol", "sasl.mechanism", "ssl.ca.location", "ssl.endpoint.identification.algorithm",
    "client.id", "client.dns.lookup",
})
#: Options the engine's own reader (``reader: python``) also reads for its consumer.
READER_KAFKA_OPTIONS: Final = SHARED_KAFKA_OPTIONS | {"fetch.max.wait.ms", "isolation.level"}
#: The values of ``kafka.isolation.level`` both Kafka clients accept.
ISOLATION_LEVELS: Final = ("read_uncommitted", "read_committed")


class TlsSpec(Model):
    """TLS to a Kafka cluster or a schema registry: which CA to trust, and the client's own certificate
    for a server that asks for one. Paths are relative to the configuration file; on a cluster they
    must exist on every worker too. The key's password, if it has one, comes from the environment or
    the secrets file only."""

    ca_file: Path | None = Field(
        None, description="PEM file of the CA certificate(s) that signed the server's certificate; unset: the "
        "system's trust store", examples=["certs/ca.pem"])
    cert_file: Path | None = Field(
        None, description="the client's certificate chain (PEM), for a server that requires one; it may hold the "
        "private key too (Spark's Kafka source reads both from one file)", examples=["certs/client.pem"])
    key_file: Path | None = Field(
        None, description="the client certificate's private key (PEM); unset: read from cert_file")
    key_password_env: str = Field(
        "CDC_INGEST_TLS_KEY_PASSWORD", description="environment variable (or secrets-file key) holding the private "
        "key's password, if the key is encrypted (never the secret itself)")

    @model_validator(mode="after")
    def _key_needs_certificate(self) -> TlsSpec:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs cert_file (the certificate the key belongs to)")
        return self

    def files(self) -> dict[str, Path]:
        """The files it names, by setting."""
        return {name: path for name, path in (("ca_file", self.ca_file), ("cert_file", self.cert_file),
                                              ("key_file", self.key_file)) if path is not None}

    def client_settings(self, key_password: str | None) -> dict[str, str]:
        """The ``ssl.*`` settings librdkafka and the schema registry client both take."""
        out = {"ssl.ca.location": str(self.ca_file)} if self.ca_file else {}
        if self.cert_file is not None:
            out["ssl.certificate.location"] = str(self.cert_file)
            out["ssl.key.location"] = str(self.key_file or self.cert_file)
            if key_password:
                out["ssl.key.password"] = key_password
        return out

    def java_options(self, key_password: str | None) -> dict[str, str]:
        """The same for the Java Kafka client (Spark's Kafka source): PEM trust and key stores."""
        out = {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": str(self.ca_file)} \
            if self.ca_file else {}
        if self.cert_file is not None:
            out.update({"kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": str(self.cert_file)})
            if key_password:
                out["kafka.ssl.key.password"] = key_password
        return out


class RegistrySpec(Model):
    """Where Avro schemas are looked up by id."""

    kind: Literal["embedded", "confluent"] = Field(
        "embedded", description="embedded files or a Confluent-compatible registry"
    )
    dir: Path = Field(Path("schemas"), description="embedded: directory of the registry, relative to workdir")
    url: str | None = Field(None, description="confluent: the root of the registry's Confluent-compatible API "
                                              "(Apicurio's ends in /apis/ccompat/v7)")
    credentials_env: str = Field(
        "SCHEMA_REGISTRY_USER_INFO",
        description="confluent: name of the environment variable holding 'user:password' (never the secret itself)",
    )
    tls: TlsSpec | None = Field(None, description="confluent, over https: the CA to trust and the client certificate")

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        # The message must not echo the URL: it holds the secret.
        if value and URL_USERINFO.match(value.strip()):
            raise ValueError("must not contain credentials (user:password@); put 'user:password' in the "
                             "environment variable named by credentials_env or in the secrets file")
        if value is not None and urlsplit(value.strip()).scheme not in ("http", "https"):
            raise ValueError(f"expected an http:// or https:// URL, not {value!r}")
        return value


class KafkaSpec(Model):
    """Connection to a Kafka cluster, and which reader consumes it."""

    bootstrap_servers: str = Field(description="host:port list, comma separated")
    options: dict[str, str] = Field(
        default_factory=dict, description="extra kafka.* options of the Java client (no secrets), passed to "
        "Spark's Kafka source, and those librdkafka shares to the admin client and the engine's reader; "
        "kafka.fetch.max.wait.ms is 50 unless set here"
    )
    credentials_env: str = Field(
        "KAFKA_SASL_JAAS_CONFIG", description="environment variable holding the SASL JAAS config, if any"
    )
    tls: TlsSpec | None = Field(
        None, description="with kafka.security.protocol SSL or SASL_SSL: the CA to trust and the client certificate, "
        "given to every Kafka client the engine starts (librdkafka's ssl.* and the Java client's PEM stores)")
    commit_group: str | None = Field(
        None, description="a Kafka consumer group to which each table's applied offsets are committed after its "
        "Delta commit, so consumer-group lag tools (kafka-consumer-groups --describe, Burrow, Grafana) see the "
        "pipeline; never read back: the Delta logs stay where runs resume from", examples=["cdc-lakehouse"])
    signal_topic: str = Field(
        "{prefix}-signal", description="the connectors' Kafka signal topic (their signal.kafka.topic), where "
        "ingest resnapshot asks for an incremental snapshot; {prefix} is the table's topic prefix (its topic "
        "without .<schema>.<table>), as in Debezium's default")
    heartbeat_topic: str = Field(
        "__debezium-heartbeat.{prefix}", description="the connectors' heartbeat topic (Debezium's "
        "topic.heartbeat.prefix, a dot and its topic.prefix), written every heartbeat.interval.ms: when its "
        "newest record was written is served as cdc_ingest_source_heartbeat_timestamp_seconds and shown by "
        "ingest status, so a connector that stopped is seen; {prefix} is the table's topic prefix; empty: none")
    reread_suspect_reads: bool = Field(
        False, description="when an incremental snapshot read contradicts the change streamed just before it (on "
        "PostgreSQL: a chunk read before that change's commit was visible), write an execute-snapshot signal "
        "for those rows to the signal topic (or signal_table), so the connector reads them again; off: the run "
        "logs the ingest resnapshot --where command that does it")
    signal_table: str | None = Field(
        None, description="the connectors' signal table, <schema>.<table> (their signal.data.collection): "
        "reread_suspect_reads inserts its signals there, in the database signal_db_env names, instead of writing "
        "them to the signal topic (for connectors that take no signals from Kafka)", examples=["cdc.debezium_signal"])
    signal_db_env: str = Field(
        "CDC_SIGNAL_DB", description="with signal_table: the environment variable (or secrets-file entry) holding "
        "the address of the database that has it, a libpq string or mysql://user:password@host:port/database; "
        "its user needs INSERT on the table")
    reader: Literal["spark", "python"] = Field(
        "python", description="spark: Spark's Kafka source (Java client), decoded by mapInArrow; python: the "
        "engine's own reader, which consumes with librdkafka in the Python workers and decodes as it reads "
        "(faster; understands only the options " + ", ".join(sorted(f"kafka.{o}" for o in READER_KAFKA_OPTIONS))
        + ")"
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        if not all(server.strip() for server in value.split(",")):
            raise ValueError(f"expected host:port[,host:port...], not {value!r}")
        return value

    def heartbeat_topic_of(self, topic: str) -> str | None:
        """The heartbeat topic of the connector that writes ``topic`` (``None``: none watched, or a topic
        not named ``<prefix>.<schema>.<table>``)."""
        prefix = topic_prefix(topic)
        return self.heartbeat_topic.format(prefix=prefix) if self.heartbeat_topic and prefix is not None else None

    @field_validator("signal_topic", "heartbeat_topic")
    @classmethod
    def _prefix_only(cls, value: str) -> str:
        try:
            value.format(prefix="p")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"may use only {{prefix}}, not {exc}") from None
        return value

    @field_validator("options")
    @classmethod
    def _no_secret_options(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if SECRET_OPTION.search(key):
                raise ValueError(f"option {key!r} carries a secret; supply it through the environment "
                                 "(credentials_env) or the secrets file, not the configuration")
        return value

    @field_validator("options")
    @classmethod
    def _reader_values(cls, value: dict[str, str]) -> dict[str, str]:
        # Both readers need these two right; a wrong one would otherwise fail in every Python worker
        # (librdkafka) or in Spark's consumers, once the stream runs.
        wait = value.get("kafka.fetch.max.wait.ms")
        if wait is not None and not (wait.strip().isdigit() and int(wait) <= 300_000):
            raise ValueError(f"kafka.fetch.max.wait.ms must be a whole number of milliseconds from 0 to 300000, "
                             f"not {wait!r}")
        level = value.get("kafka.isolation.level")
        if level is not None and level not in ISOLATION_LEVELS:
            raise ValueError(f"kafka.isolation.level must be one of {', '.join(ISOLATION_LEVELS)}, not {level!r}")
        return value

    @model_validator(mode="after")
    def _one_file_for_java(self) -> KafkaSpec:
        tls = self.tls
        if (self.reader == "spark" and tls is not None and tls.key_file is not None
                and tls.key_file != tls.cert_file):
            raise ValueError("reader 'spark': Spark's Kafka source (the Java client) reads the client's certificate "
                             "and key from one PEM file: put both in tls.cert_file and leave tls.key_file unset")
        return self

    @model_validator(mode="after")
    def _reader_understands_options(self) -> KafkaSpec:
        if self.reader == "python":
            unknown = sorted(k for k in self.options if k.removeprefix("kafka.") not in READER_KAFKA_OPTIONS)
            if unknown:
                raise ValueError(f"reader 'python' (librdkafka) does not understand the Java client options "
                                 f"{', '.join(unknown)}; use reader: spark, or leave them out")
        return self


class TransactionsSpec(Model):
    """Cuts across tables: readers can ask for every table at one source transaction boundary.

    Needs the connector's transaction metadata (Debezium ``provide.transaction.metadata: true``),
    which writes BEGIN and END records to ``<topic.prefix>.transaction`` and a ``transaction`` block
    into every change (docs/consistency.md).
    """

    topic: str = Field(description="the connector's transaction topic, <topic.prefix>.transaction "
                       "(e.g. shop.transaction)")
    tables: tuple[str, ...] | None = Field(
        None, description="the tables whose reads are kept consistent with each other (their topics must "
        "come from this connector: <topic.prefix>.<schema>.<table>); unset: every configured table")

    @property
    def prefix(self) -> str:
        """The connector's topic prefix: the transaction topic without ``.transaction``."""
        return self.topic.removesuffix(".transaction")

    @field_validator("topic")
    @classmethod
    def _is_transaction_topic(cls, value: str) -> str:
        if not value.endswith(".transaction") or value == ".transaction":
            raise ValueError(f"{value!r} is not a transaction topic: Debezium names it <topic.prefix>.transaction")
        return value


class DebeziumModes(Model):
    """How the Debezium connector sends values, as its configuration sets it (``decimal.handling.mode`` ...).

    The engine writes what the connector sends, in every mode: a decimal sent as text is a ``string``
    column, one sent as a float a ``double``. ``ingest verify --source-db`` reads the source table as the
    connector sends it, so it has to know the connector's modes where they are not Debezium's defaults
    (docs/types.md#other-handling-modes).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    decimal_handling_mode: Literal["precise", "double", "string"] = Field(
        "precise", alias="decimal.handling.mode", description="numeric, decimal and money columns: precise "
        "(decimals), double or string")
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect"] = Field(
        "adaptive", alias="time.precision.mode", description="adaptive and adaptive_time_microseconds (the "
        "PostgreSQL and MySQL connectors' defaults) both keep microseconds; connect keeps milliseconds")
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = Field(
        "bytes", alias="binary.handling.mode", description="binary columns (bytea, blob, binary ...): bytes, "
        "or text in base64, base64-url-safe or hex")
    interval_handling_mode: Literal["numeric", "string"] = Field(
        "numeric", alias="interval.handling.mode", description="PostgreSQL interval columns: numeric "
        "(microseconds) or string (ISO 8601, P1Y2M3DT4H5M6.78S)")


#: Debezium's own handling modes (each connector keeps microseconds by default).
DEBEZIUM_DEFAULTS: Final = DebeziumModes()


class SourceSpec(Model):
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
    max_records_per_table: int | None = Field(
        None, gt=0, description="upper bound on one table's records per micro-batch, so that each MERGE stays "
        "within it however many tables share the query (the engine's own reader only: not with "
        "kafka.reader: spark); unset: only max_records_per_batch bounds them"
    )
    queries: int = Field(
        1, gt=0, description="streaming queries the tables share (tables are dealt to them in turn); each "
        "micro-batch of a query is decoded once and applied per table"
    )
    trigger_seconds: float = Field(
        2.0, gt=0, description="continuous runs: how often a micro-batch starts (Spark's processing-time trigger). "
        "Shorter: fresher tables; longer: fewer Delta commits per table and hour (3,600 / this, when changes "
        "keep coming) and bigger files; ingest maintain compacts the small ones either way")
    driver_seconds: float = Field(
        30.0, ge=0, description="draining runs: apply the backlog on the driver, without starting Spark, when "
        "the driver expects to finish within this many seconds (measured on its first batches; a run that "
        "falls behind hands the rest to Spark). Worth about what Spark's session and query take to start, or "
        "a few times that on a single machine, where Spark adds little speed. Only tables the driver can "
        "apply alone: the engine's own reader, the delta-rs writer, planned and validated on the driver, "
        "outside a transaction group. 0: always Spark")
    retry_stopped_seconds: float = Field(
        30.0, gt=0, description="continuous runs: a table stopped by a transient error (a registry or broker "
        "that does not answer, a concurrent writer) is tried again after this long, then twice as long each "
        "time up to 10 minutes, at the next micro-batch; it first catches up from the offsets its Delta log "
        "records. A table stopped by any other error stays stopped until the run is restarted"
    )
    debezium: DebeziumModes = Field(
        default_factory=DebeziumModes, description="the connector's handling modes, where they are not "
        "Debezium's defaults: what verify --source-db reads the source as")
    transactions: TransactionsSpec | None = Field(
        None, description="publish cuts: points at which every table of the group holds exactly the same "
        "source transactions, for readers that ask for consistency across tables (query --consistent)")

    @property
    def table_batch_records(self) -> int:
        """The most records of one table a batch takes (``max_records_per_table``, within ``max_records_per_batch``)."""
        return min(self.max_records_per_batch, self.max_records_per_table or self.max_records_per_batch)

    @model_validator(mode="after")
    def _kafka_needs_connection(self) -> SourceSpec:
        if self.kind == "kafka" and self.kafka is None:
            raise ValueError("source.kind is 'kafka' but source.kafka (bootstrap_servers) is missing")
        if (self.max_records_per_table is not None and self.kind == "kafka" and self.kafka is not None
                and self.kafka.reader == "spark"):
            raise ValueError("max_records_per_table needs the engine's own reader: Spark's Kafka source "
                             "(kafka.reader: spark) bounds only the whole micro-batch; use "
                             "max_records_per_batch, or kafka.reader: python")
        if self.registry.kind == "confluent" and not self.registry.url:
            raise ValueError("source.registry.kind is 'confluent' but source.registry.url is missing")
        return self
