"""A new pipeline's files (``ingest init``): a commented configuration for the user's own stack, a first
quality suite, and, when asked, a Dagster code location over them.

The configuration reads Debezium's topics from Kafka over SASL, Avro through a Confluent-compatible
registry, writes the lake and the checkpoints to S3, finds its tables by topic pattern and overrides
one of them, with one quality suite. Every secret is named, never written: the file says which
environment variable holds it. What is written loads as it is (:func:`write_pipeline` checks it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from string import Template

from ingest.config import IngestConfig, load_config
from ingest.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Stack:
    """What ``ingest init`` asks about the user's stack; each has a placeholder to replace later."""

    bootstrap_servers: str = "broker-1.example.internal:9093,broker-2.example.internal:9093"
    registry_url: str = "https://schema-registry.example.internal"
    lake: str = "s3://my-lake/cdc"
    region: str = "us-east-1"
    topic_pattern: str = r"dbserver1\.inventory\.[^.]+"
    value_format: str = "avro"


@dataclass(frozen=True, slots=True)
class Written:
    """The files ``ingest init`` wrote, and the configuration they load as."""

    files: list[Path]
    config: IngestConfig


def write_pipeline(path: Path, stack: Stack, *, force: bool = False, dagster: Path | None = None) -> Written:
    """Write the configuration at ``path`` (and its suite; and a Dagster code location in ``dagster``).

    Raises:
        ConfigError: a file exists (without ``force``), or what was written does not load (the files
            are then taken back: those that existed get their content again).
    """
    example_table, example_topic = _example(stack.topic_pattern)
    values = {
        "config_name": path.name, "bootstrap_servers": stack.bootstrap_servers, "registry_url": stack.registry_url,
        "lake": f"{stack.lake.rstrip('/')}/tables", "checkpoints": f"{stack.lake.rstrip('/')}/checkpoints",
        "region": stack.region, "topic_pattern": stack.topic_pattern, "value_format": stack.value_format,
        "example_table": example_table, "example_topic": example_topic,
    }
    outputs = {path: _template("pipeline.yaml").substitute(values),
               path.parent / "expectations" / f"{example_table}.json":
                   _template("suite.json").substitute(suite=example_table, key_column="id")}
    if dagster is not None:
        outputs[dagster / "definitions.py"] = _template("dagster_definitions.py.txt").substitute(
            config=str(path.resolve()))
        outputs[dagster / "workspace.yaml"] = "load_from:\n  - python_file: definitions.py\n"
    existing = [p for p in outputs if p.exists()]
    if existing and not force:
        raise ConfigError(f"{existing[0]} exists; choose another path or pass --force to replace it")
    before = {target: target.read_bytes() if target.exists() else None for target in outputs}
    made = sorted({d for target in outputs for d in (target.parent, *target.parent.parents) if not d.exists()},
                  key=lambda d: len(d.parts), reverse=True)
    try:
        for target, text in outputs.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        json.loads(outputs[path.parent / "expectations" / f"{example_table}.json"])  # the suite is JSON
        return Written(list(outputs), load_config(path))
    except ConfigError:  # a value the configuration refuses: leave the directory as it was
        for target, content in before.items():
            if content is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(content)
        for directory in made:
            directory.rmdir()
        raise


def _example(pattern: str) -> tuple[str, str]:
    """A table and topic the pattern matches, for the override example: ``<prefix>.<schema>.customers``."""
    parts = re.split(r"\\\.", pattern)
    if len(parts) >= 2 and all(re.fullmatch(r"[A-Za-z0-9_-]+", p) for p in parts[:2]):
        return f"{parts[1]}_customers", f"{parts[0]}.{parts[1]}.customers"
    return "customers", "dbserver1.inventory.customers"


def _template(name: str) -> Template:
    return Template(files("ingest.ops").joinpath("templates", name).read_text())
