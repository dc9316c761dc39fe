"""Writes docs/reference/configuration.md from the configuration's pydantic models (ingest/config/).

Every key of every section, with its type, default, constraints and description, comes from the
models themselves; the example of each section is written here and validated by the section's model
before it is printed, so neither the table nor the example can drift from what ``load_config``
accepts. ``tests/docs/test_generated_pages.py`` fails when the committed page differs from this
script's output.

    .venv/bin/python scripts/gen_config_reference.py            # rewrite the page
    .venv/bin/python scripts/gen_config_reference.py --check    # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's models, not an installed copy's

from ingest.config import (  # noqa: E402 -- after the path above
    RENAMED_KEYS,
    ColumnSelection,
    DagsterSpec,
    DebeziumModes,
    DiscoverySpec,
    IngestConfig,
    KafkaSpec,
    QualitySpec,
    RegistrySpec,
    SourceSpec,
    SparkSpec,
    StorageSpec,
    TableSpec,
    TargetSpec,
    TlsSpec,
    TransactionsSpec,
)

PAGE = ROOT / "docs" / "reference" / "configuration.md"


@dataclass(frozen=True)
class Section:
    """One mapping of the file: where it sits, its model, why a user goes there, and an example."""

    key: str
    model: type[BaseModel]
    example: str  # YAML of the section's own mapping (a list item for tables)


SECTIONS = (
    Section("(top level)", IngestConfig, """\
extends: base.yaml              # optional: read base.yaml first, then override it key by key
workdir: ../work                # topic log, checkpoints and quality results go under here
secrets_file: secrets.yaml      # NAME: value entries, consulted after the environment (chmod 600)
tables:
  - {name: customers, topic: shop.public.customers}
"""),
    Section("source", SourceSpec, """\
kind: kafka
value_format: avro
max_records_per_batch: 20000
max_records_per_table: 5000
kafka:
  bootstrap_servers: broker-1:9092,broker-2:9092
registry:
  kind: confluent
  url: https://registry.example.internal
"""),
    Section("source.transactions", TransactionsSpec, """\
topic: shop.transaction
tables: [orders, order_items, customers]
"""),
    Section("source.debezium", DebeziumModes, """\
decimal.handling.mode: string     # as the connector's own configuration sets them
time.precision.mode: connect
binary.handling.mode: hex
interval.handling.mode: string
"""),
    Section("source.kafka", KafkaSpec, """\
bootstrap_servers: broker-1:9092,broker-2:9092
options:
  kafka.security.protocol: SASL_SSL
  kafka.sasl.mechanism: SCRAM-SHA-512
credentials_env: KAFKA_SASL_JAAS_CONFIG
tls: {ca_file: certs/ca.pem}
reader: python
"""),
    Section("source.kafka.tls", TlsSpec, """\
ca_file: certs/ca.pem             # also source.registry.tls
cert_file: certs/client.pem
key_password_env: CDC_INGEST_TLS_KEY_PASSWORD
"""),
    Section("source.registry", RegistrySpec, """\
kind: confluent
url: https://registry.example.internal
credentials_env: SCHEMA_REGISTRY_USER_INFO
tls: {ca_file: certs/ca.pem}
"""),
    Section("target", TargetSpec, """\
root: s3://lake/cdc
checkpoint_dir: s3://lake/checkpoints
writer: delta-rs
change_data_feed: true
"""),
    Section("target.storage", StorageSpec, """\
endpoint_url: http://minio.example.internal:9000
region: us-east-1
path_style: true
lease_seconds: 60
retry_seconds: 120
"""),
    Section("spark", SparkSpec, """\
master: local[2]
shuffle_partitions: 2
jit: auto
conf:
  spark.driver.memory: 4g
"""),
    Section("quality", QualitySpec, """\
expectations_dir: expectations
results_dir: quality
keep_results: 200
validate_on: auto
"""),
    Section("dagster", DagsterSpec, """\
analytics: false
max_lag_records: 1000
max_staleness: 15m
"""),
    Section("tables[]", TableSpec, """\
name: orders
topic: shop.public.orders
primary_key: [id]
delete_mode: soft
tombstone_retention: 7d
expectations: orders
quality_policy: quarantine
expectation_policies:
  expect_column_values_to_be_between(quantity): fail
history_mode: scd2
track_history: {exclude: [updated_at]}
"""),
    Section("tables[].columns, tables[].track_history", ColumnSelection, """\
exclude: [birth_date, notes]
"""),
    Section("discover", DiscoverySpec, """\
topic_pattern: 'shop\\.[^.]+\\.[^.]+'
table_name: '{schema}_{table}'
defaults: {delete_mode: soft}
refresh_seconds: 30
"""),
)


def _type(annotation: Any) -> str:
    """A reader's name for a field's type."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is timedelta:
        return "duration (`7d`, `12h`, `30m`, `45s`, seconds, or ISO 8601)"
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        inner = " or ".join(_type(a) for a in kept)
        return f"{inner}, optional" if len(kept) < len(args) else inner
    if origin is tuple:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        key = next(s.key for s in SECTIONS if s.model is annotation)
        return f"mapping: [`{key}`](#{_anchor(key)})"
    if get_origin(annotation) is not None and hasattr(annotation, "__metadata__"):
        return _type(get_args(annotation)[0])
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    if annotation in names:
        return names[annotation]
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds % size == 0:
                return f"`{seconds // size}{unit}`"
        return f"`{seconds}s`"
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, dict | tuple | list) and not value:
        return "`{}`" if isinstance(value, dict) else "`[]`"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    return f"`{value}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _value(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "**required**"
    return _value(field.default)


def _constraints(field: FieldInfo) -> str:
    said = []
    for item in field.metadata:
        for cls, sign in ((annotated_types.Gt, ">"), (annotated_types.Ge, ">=")):
            if isinstance(item, cls):
                said.append(f"{sign} {getattr(item, cls.__name__.lower())}")
    return ", ".join(said)


def _names(name: str, field: FieldInfo) -> str:
    others = []
    if isinstance(field.validation_alias, AliasChoices):
        others = [c for c in field.validation_alias.choices if isinstance(c, str) and c != name]
    if field.alias:  # the name users write (a Debezium property's), and the field's own
        name, others = field.alias, [name]
    return f"`{name}`" + "".join(f" (also `{o}`)" for o in others)


def _cell(text: str) -> str:
    """Plain text as a table cell: one line, and outside code spans no character Markdown would take
    for a tag, emphasis or a column break (descriptions name `<schema>.<table>` and `_cdc_*` columns)."""
    parts = " ".join(text.split()).split("`")
    for n in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[n] = (parts[n].replace("\\", "\\\\").replace("_", "\\_").replace("*", "\\*")
                    .replace("<", "&lt;").replace(">", "&gt;"))
    return "`".join(parts).replace("|", "\\|")


def _anchor(key: str) -> str:
    return "".join(c for c in key.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _section(section: Section) -> list[str]:
    model = section.model
    parsed = yaml.safe_load(section.example)
    parsed.pop("extends", None)  # read by load_config before the models see the file
    model.model_validate(parsed)  # an example the models refuse stops the generator
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    lines = [f"## `{section.key}`", "", " ".join(doc.split()), "",
             "| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        bounds = _constraints(field)
        kind = _type(field.annotation) + (f" ({bounds})" if bounds else "")
        lines.append(f"| {_names(name, field)} | {_cell(kind)} | {_default(field)} | "
                     f"{_cell(field.description or '')} |")
    lines += ["", "Example:", "", "```yaml", section.example.rstrip("\n"), "```", ""]
    return lines


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/gen_config_reference.py from the models in ingest/config/: do not edit. -->",
        "",
        "One YAML file configures a run: where changes come from (`source`), where the tables go "
        "(`target`), Spark, data quality, and the tables themselves (`tables`, or `discover` for every "
        "topic matching a pattern). `ingest.config.load_config` validates the file when any command "
        "starts; an unknown key or a bad value stops it with a message naming the file and the key. "
        "Relative paths resolve against `workdir`, itself relative to the file, except "
        "`quality.expectations_dir`, which is relative to the file (suites are versioned with the "
        "configuration, not kept with the data).",
        "",
        "`extends: other.yaml` (relative to the file) reads the other file first and merges this one into "
        "it, mapping by mapping; anything else is replaced. Renamed keys still load under their old "
        "name: " + ", ".join(f"`{old}` is now `{new}`" for old, new in sorted(RENAMED_KEYS.items()))
        + " (in `target`, in a table, and in `discover.defaults`).",
        "",
        "Secrets never go in this file: the registry's `user:password`, the Kafka SASL JAAS "
        "configuration and the object store's keys come from the environment, or from `secrets_file`.",
        "",
        "Sections: " + ", ".join(f"[`{s.key}`](#{_anchor(s.key)})" for s in SECTIONS) + ".",
        "",
    ]
    for section in SECTIONS:
        lines += _section(section)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is stale")
    args = parser.parse_args()
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            raise SystemExit(f"{os.path.relpath(PAGE, ROOT)} is stale: run scripts/gen_config_reference.py")
        return
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page)
    print(f"wrote {os.path.relpath(PAGE, ROOT)}")


if __name__ == "__main__":
    main()
