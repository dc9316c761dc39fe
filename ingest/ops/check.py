"""A deployment's pre-flight (``ingest check``): can a run start, reach everything and write where it must?

Each check asks the real thing -- the broker for its topics with the configured credentials, the
registry for the topics' subjects, the newest schema (or JSON change) of each topic for the columns
its table names and its suite reads, the object store for a put and a delete, Java for its version,
Maven Central (or the configured classpath) for the JVM artifacts, Great Expectations for each
table's suite -- and
says, in one line, what it found or why it failed and what to do.
Nothing a check writes is left behind; nothing is ingested.
"""

from __future__ import annotations

import functools
import re
import subprocess
import uuid
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass

from ingest import secrets
from ingest.commit.state import TableState, load_state
from ingest.config import IngestConfig, TableSpec
from ingest.decode.registry import confluent_registry
from ingest.errors import ConfigError, DecodeError, IngestError, SuiteError, TopicBehindTableError, first_line
from ingest.lake.location import LakePath, s3_client
from ingest.ops.resnapshot import signals_for
from ingest.ops.source_columns import ColumnsOf, SourceColumns, columns_from
from ingest.quality import QualityGate
from ingest.quality.suites import LoadedSuite, check_columns
from ingest.source.catalog import Catalog, catalog_for
from ingest.spark.jars import classpath_conf
from ingest.spark.java import check_java, java_binary
from ingest.verify.source_db import source_database


@dataclass(frozen=True, slots=True)
class Check:
    """One check's verdict: what was checked, whether it holds, what was found (or why not), and the fix."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def run_checks(config: IngestConfig, *, only: Callable[[str], bool] = lambda name: True) -> Iterator[Check]:
    """Every check of ``config``'s deployment, in the order a run needs them (see module docstring).

    The object store is asked once per request, not ridden out for ``target.storage.retry_seconds`` as a
    run does: a check says what holds now, and an endpoint that does not answer fails it in seconds.
    """
    storage = config.target.storage.model_copy(update={"retry_seconds": 0})
    config = config.model_copy(update={"target": config.target.model_copy(update={"storage": storage})})
    catalog = functools.cache(functools.partial(catalog_for, config))  # one client for every check
    names = functools.cache(lambda: catalog().topics())  # one listing for three checks
    states = functools.cache(lambda table: load_state(config.table_path(table)))  # one read for two checks
    failed: set[str] = set()
    source_columns = SourceColumns(config, failed)  # asked by two checks, once per table
    steps: list[tuple[str, Callable[[IngestConfig], Check | list[Check]]]] = [
        ("java", _java), ("jvm artifacts", _artifacts),
        ("source", functools.partial(_source, names=names, catalog=catalog)),
        ("topics", functools.partial(_topics, names=names)), ("registry", _registry),
        ("columns", functools.partial(_columns, newest=source_columns)),
        ("keys", functools.partial(_keys, tails=source_columns)), ("lake", _lake),
        ("checkpoints", _checkpoints),
        ("tables", functools.partial(_tables, states=states,
                                     source=lambda: None if "source" in failed else catalog())),
        ("quality", functools.partial(_quality, states=states, newest=source_columns, failed=failed)),
        ("signals", functools.partial(_signals, names=names))]
    # what a step asks: when that failed, the step says so in one line instead of asking again (each
    # question waiting its timeout) or failing once per table
    asks = {"topics": "source", "columns": source_columns.subject, "keys": "source", "tables": "lake"}
    if _signal_topics(config):
        asks["signals"] = "source"
    try:
        for name, step in steps:
            if not only(name):
                continue
            if (needed := asks.get(name)) in failed:
                yield Check(name, False, f"not checked: the {needed} check failed", _fix(needed))
                continue
            try:
                found = step(config)
            except IngestError as exc:
                found = Check(name, False, secrets.redact(str(exc)), _fix(name))
            except Exception as exc:  # a check must report, never stop the others
                found = Check(name, False, secrets.redact(f"{type(exc).__name__}: {first_line(exc)}"), _fix(name))
            results = found if isinstance(found, list) else [found]
            failed.update(c.name for c in results if not c.ok)
            yield from results
    finally:
        source_columns.close()


def _fix(name: str) -> str:
    return {
        "java": "install a JDK/JRE 17 or set JAVA_HOME",
        "jvm artifacts": "let the machine reach Maven Central once, or name local jars in spark.conf spark.jars",
        "source": "check source.kafka.bootstrap_servers, the network, the SASL credentials "
                  "(source.kafka.credentials_env) and, over TLS, source.kafka.tls",
        "topics": "check the topic names (tables[].topic, discover.topic_pattern) and that Debezium has written",
        "registry": "check source.registry.url, its credentials (source.registry.credentials_env) and, over "
                    "https, source.registry.tls",
        "columns": "name the source's columns, as the schema spells them, in tables[].primary_key, columns and "
                   "track_history",
        "keys": "give the source table a primary key, or name columns it holds unique in tables[].primary_key, "
                "then replay what was held (docs/operations.md#a-table-without-a-primary-key)",
        "lake": "check target.root, target.storage and the store's credentials (AWS_ACCESS_KEY_ID, ...)",
        "checkpoints": "check target.checkpoint_dir, target.storage and the store's credentials",
        "tables": "see the cause: a table's Delta log must be readable with the lake's credentials",
        "quality": "correct the suite (quality.expectations_dir/<suite>.json) or the table's expectations",
        "signals": "let the connectors take signals from Kafka (signal.kafka.topic; source.kafka.signal_topic), or "
                   "name their signal table in source.kafka.signal_table and its database's address in the "
                   "variable source.kafka.signal_db_env names",
    }.get(name, "")


def _java(config: IngestConfig) -> Check:
    check_java()
    java = java_binary()
    shown = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30, check=False)
    version = re.search(r'version "([^"]+)"', shown.stderr)
    return Check("java", True, f"{version.group(1) if version else 'found'} at {java}")


def _artifacts(config: IngestConfig) -> Check:
    from ingest.spark.session import connectors_of  # the session module brings pyspark: only when checked

    connectors = connectors_of(config)
    if not connectors:
        return Check("jvm artifacts", True, "none needed (delta-rs, local checkpoints, the engine's own reader)")
    conf = classpath_conf(connectors, config.spark.conf)
    if not conf:
        return Check("jvm artifacts", True, f"{', '.join(connectors)}: the configuration's spark.conf sets the "
                                            "classpath")
    jars = [j for value in conf.values() for j in value.split(",") if j]
    return Check("jvm artifacts", True, f"{', '.join(connectors)}: {len(jars)} artifacts ready")


def _source(config: IngestConfig, *, names: Callable[[], list[str]], catalog: Callable[[], Catalog]) -> Check:
    if config.source.kind != "kafka":
        return Check("source", True, f"embedded topic log at {config.log_dir}: {len(names())} topics")
    spec = config.source.kafka
    assert spec is not None
    topics = names()
    how = spec.options.get("kafka.security.protocol", "PLAINTEXT")
    return Check("source", True, f"{catalog().describe()} answered over {how}: {len(topics)} topics")


def _topics(config: IngestConfig, *, names: Callable[[], list[str]]) -> list[Check]:
    present = set(names())
    out = []
    for spec in config.tables:
        found = spec.topic in present
        out.append(Check("topics", found, f"{spec.name}: topic {spec.topic}" + ("" if found else " is missing"),
                         "" if found else _fix("topics")))
    if config.discover is not None:
        pattern = re.compile(config.discover.topic_pattern)
        matched = sorted(t for t in present if pattern.fullmatch(t))
        out.append(Check("topics", bool(matched), f"discover.topic_pattern matches {len(matched)} topics"
                         + (f" ({', '.join(matched[:3])}{', ...' if len(matched) > 3 else ''})" if matched else ""),
                         "" if matched else _fix("topics")))
    return out


def _registry(config: IngestConfig) -> Check:
    registry = config.source.registry
    client = confluent_registry(config)
    if client is None:
        return Check("registry", True, f"{registry.kind} registry: nothing to reach")
    subjects = [f"{spec.topic}-value" for spec in config.tables]
    found = client.subject_schemas(subjects) if subjects else {}
    where = secrets.redact(registry.url)
    if config.source.value_format == "avro" and subjects and not found:
        return Check("registry", False, f"{where} answered, but none of {len(subjects)} subjects "
                                        f"({subjects[0]}, ...) has a schema", "check that Debezium's Avro "
                                        "converter writes to this registry and has sent a record")
    return Check("registry", True, f"{where} answered: {len(found)} schemas for {len(subjects)} subjects")


def _columns(config: IngestConfig, *, newest: ColumnsOf) -> list[Check]:
    """The columns each table names -- ``primary_key``, ``columns``, ``track_history`` -- against its
    topic's newest value schema (Avro) or newest change (JSON): a misspelled key sends every change to
    quarantine, a misspelled ``include`` leaves a column out and a misspelled ``exclude`` keeps the
    column it meant to drop."""
    out = []
    for spec in config.tables:
        named = spec.named_columns()
        if not named:
            continue
        try:
            where, columns = newest(spec)
        except IngestError as exc:
            fix = ("check tables[].topic and source.value_format" if isinstance(exc, DecodeError)
                   else _fix(columns_from(config)))
            out.append(Check("columns", False, secrets.redact(f"{spec.name}: {exc}"), fix))
            continue
        if columns is None:
            out.append(Check("columns", True, f"{spec.name}: not checked, no {where} yet"))
            continue
        if missing := spec.not_in(columns):
            out.append(Check("columns", False, f"{spec.name}: {'; '.join(missing)}, not in the newest {where} "
                                               f"(its columns: {', '.join(columns)})", _fix("columns")))
        else:
            found = ", ".join(f"{setting} ({', '.join(names)})" for setting, names in named.items())
            out.append(Check("columns", True, f"{spec.name}: {found} found in the newest {where}"))
    return out


def _keys(config: IngestConfig, *, tails: SourceColumns) -> list[Check]:
    """A table without ``primary_key`` is keyed by the Kafka message key: a topic none of whose newest
    changes has one (Debezium's, for a source table without a primary key) sends every change to
    quarantine. (A truncate has no key either, so one unkeyed change says nothing.)"""
    out, keyed, empty = [], 0, 0
    for spec in config.tables:
        if spec.primary_key:
            continue
        changes, with_key = tails.keyed(spec)
        if changes and not with_key:
            out.append(Check("keys", False, f"{spec.name}: none of the newest {changes} changes in topic "
                                            f"{spec.topic} has a Kafka key (a source table without a primary key), "
                                            "and a run holds them in quarantine", _fix("keys")))
        elif changes:
            keyed += 1
        else:
            empty += 1
    if out:
        return out
    keyed_by = f"{keyed} tables keyed by the message key: their newest changes have one" if keyed else ""
    unread = f"{empty} not checked, no change yet" if empty else ""
    return [Check("keys", True, "; ".join(filter(None, (keyed_by, unread))) or "no table is keyed by the message key")]


def _writable(name: str, where: LakePath) -> Check:
    """A real write and delete under ``where``, as a run's first commit would make."""
    probe = f"_cdc_check/{uuid.uuid4().hex}"
    if where.is_local:
        target = where.local / probe
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"ingest check")
        target.unlink()
        target.parent.rmdir()
        return Check(name, True, f"{where.uri}: writable")
    bucket, _, prefix = where.uri.removeprefix("s3://").removeprefix("s3a://").partition("/")
    key = f"{prefix.rstrip('/')}/{probe}" if prefix else probe
    client = s3_client(where)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"ingest check")
        client.delete_object(Bucket=bucket, Key=key)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""
        cause = {"NoSuchBucket": "the bucket does not exist", "AccessDenied": "the store refused the write",
                 "InvalidAccessKeyId": "the store does not know the access key",
                 "SignatureDoesNotMatch": "the secret key is wrong"}.get(code, "")
        text = cause or secrets.redact(first_line(exc))
        return Check(name, False, f"{where.uri}: cannot write ({text})", _fix(name))
    return Check(name, True, f"{where.uri}: writable (put and delete of one object)")


def _lake(config: IngestConfig) -> Check:
    return _writable("lake", config.tables_root)


def _checkpoints(config: IngestConfig) -> Check:
    return _writable("checkpoints", config.checkpoint_location)


def _tables(config: IngestConfig, *, states: Callable[[str], TableState], source: Callable[[], Catalog | None]
            ) -> list[Check]:
    """Each table's Delta log (``states``), and whether its topic (``source``: ``None`` when the source
    did not answer its check) still reaches the offsets the table applied: a recreated topic stops the
    table."""
    out = []
    catalog = None
    for spec in config.tables:
        state = states(spec.name)
        if state.table is None:
            out.append(Check("tables", True, f"{spec.name}: not created yet (its first run creates it)"))
            continue
        catalog = catalog or source()
        behind = state.ends_before(spec.topic, catalog.end_offsets(spec.topic)) if catalog is not None else {}
        if behind:
            # the error says what to do, as a run says it
            out.append(Check("tables", False, f"{spec.name}: {TopicBehindTableError(spec.name, spec.topic, behind)}"))
            continue
        out.append(Check("tables", True, f"{spec.name}: Delta version {state.version}, "
                                         f"{len(state.offsets)} partitions applied"))
    return out


def _quality(config: IngestConfig, *, states: Callable[[str], TableState], newest: ColumnsOf,
             failed: Container[str]) -> list[Check]:
    """Each table's quality gate builds as a run builds it at start-up: the suite loads with Great
    Expectations, strictly, and its policy overrides name its expectations. The columns it reads must be
    the table's, as a run asks at its start, or, before the table's first commit, the columns the table
    will take from its source's newest schema or change (``newest``), which a run would otherwise find
    missing at its first batch. When the lake's check ``failed``, the suites still load, and their
    columns are not checked: whether a table exists, and with which columns, is the lake's to say."""
    specs = [spec for spec in config.tables if spec.expectations]
    if not specs:
        return [Check("quality", True, "no table names an expectations suite")]
    lake = "lake" not in failed
    out = []
    for spec in specs:
        columns = states(spec.name).columns if lake else None
        try:
            gate = QualityGate.for_table(config, spec, table_columns=columns)
            assert gate is not None
            fits = ("; the columns it reads not checked: the lake check failed" if not lake
                    else "; the table has the columns it reads" if columns is not None
                    else _suite_fits_source(spec, gate.suite, newest))
        except SuiteError as exc:
            out.append(Check("quality", False, f"{spec.name}: {exc}", _fix("quality")))
            continue
        out.append(Check("quality", True, f"{spec.name}: suite {spec.expectations}, "
                                          f"{len(gate.suite.expectations)} expectations{fits}"))
    return out


def _suite_fits_source(spec: TableSpec, suite: LoadedSuite, newest: ColumnsOf) -> str:
    """Before a table's first commit: what its suite's columns were checked against, or why not.

    Raises:
        SuiteError: the suite reads a column the table will not have.
    """
    try:
        where, columns = newest(spec)
    except IngestError as exc:
        return secrets.redact(f"; the columns it reads not checked: {first_line(exc)}")
    if columns is None:
        return f"; the columns it reads are checked at the table's first batch (no {where} yet)"
    kept = spec.kept(columns)
    less = ""
    if spec.columns is not None and len(kept) < len(columns):
        less = f" (less what columns.{spec.columns.selects} leaves out)"
    check_columns(spec, suite, kept, where=f"newest {where}{less}")
    return f"; the columns it reads are in the newest {where}"


def _signal_topics(config: IngestConfig) -> bool:
    """Whether the runs send their signals to the connectors' Kafka signal topics."""
    spec = config.source.kafka
    return spec is not None and spec.reread_suspect_reads and spec.signal_table is None and bool(config.tables)


def _signals(config: IngestConfig, *, names: Callable[[], list[str]]) -> list[Check]:
    """Where a run sends its signals for suspect reads (``source.kafka.reread_suspect_reads``): the
    connectors' signal topics exist, or the signal table's database answers."""
    spec = config.source.kafka
    if spec is None or not spec.reread_suspect_reads or not config.tables:
        return []
    if spec.signal_table is None:
        present = set(names())
        out = []
        for signal in signals_for(config, [t.name for t in config.tables]):
            found = signal.topic in present
            out.append(Check("signals", found, f"connector {signal.prefix}: signal topic {signal.topic}"
                             + ("" if found else " is missing"), "" if found else _fix("signals")))
        return out
    dsn = secrets.lookup(spec.signal_db_env, config.secrets_path)
    if dsn is None:
        return [Check("signals", False, f"signal table {spec.signal_table}: {spec.signal_db_env} (the environment or "
                                        "the secrets file) names no database", _fix("signals"))]
    source = source_database(dsn)
    try:
        where = source.describe(dsn)
        with source.connect(dsn):
            pass
    except ConfigError as exc:
        return [Check("signals", False, f"signal table {spec.signal_table}: {spec.signal_db_env}: {exc}",
                      _fix("signals"))]
    except source.Error as exc:
        return [Check("signals", False, secrets.redact(f"signal table {spec.signal_table}: {where}: {first_line(exc)}"),
                      _fix("signals"))]
    return [Check("signals", True, f"signal table {spec.signal_table} in {where}: the database answered")]
