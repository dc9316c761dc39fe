"""Tables found by topic name: ``discover.topic_pattern`` in the configuration.

Debezium captures a whole database into one topic per table, named ``<prefix>.<schema>.<table>``
(``<prefix>.<database>.<table>`` for MySQL). With ``discover`` set, every topic whose whole name
matches ``topic_pattern`` is ingested into a table of its own, without listing it:

* **Name.** ``table_name`` (default ``{schema}_{table}``) with the topic's last two dot-separated
  parts as ``{schema}`` and ``{table}`` and everything before them as ``{prefix}``; a character a
  table name cannot hold becomes ``_``, and a name that starts with a digit gets ``t_`` in front.
  ``shop.public.order-lines`` -> ``public_order_lines``.
* **Settings.** ``discover.defaults`` (any table field but name, topic and source_table); without
  them: primary key from the Kafka key, hard deletes, Kafka tombstones ``auto``, no suite.
* **Overrides.** A table listed under ``tables`` with the same topic is that table: its own
  settings win and it is not discovered a second time.
* **Refusals, never a silent skip.** A matching topic with fewer than three parts (Debezium's
  schema-change topic ``<prefix>``, its transaction topic ``<prefix>.transaction``) is no table's:
  :class:`~ingest.errors.ConfigError` names it so the pattern can be narrowed, e.g.
  ``shop\\.[^.]+\\.[^.]+``. Two topics that give one name, or a discovered name that a listed table
  with another topic already has, are refused the same way.

A continuous run looks again every ``discover.refresh_seconds`` and starts the tables of new topics
without a restart (:class:`ingest.stream.runner.Runner`).
"""

from __future__ import annotations

import logging
import re
from typing import Final

from ingest.config import IngestConfig, TableSpec
from ingest.errors import ConfigError, SourceUnavailableError
from ingest.source.catalog import Catalog, catalog_for

log = logging.getLogger(__name__)
_NOT_IN_NAME: Final = re.compile(r"[^A-Za-z0-9_]")


def table_name(template: str, topic: str) -> str:
    """The table name a topic maps to (see the module docstring).

    Raises:
        ConfigError: the topic is not ``<prefix>.<schema>.<table>``, or the name is reserved.
    """
    parts = topic.split(".")
    if len(parts) < 3 or not all(parts[-2:]):
        raise ConfigError(f"topic {topic!r} matches discover.topic_pattern but is not <prefix>.<schema>.<table>, so "
                          "it is not a table's topic (Debezium's schema-change and transaction topics look like "
                          "this); narrow the pattern, e.g. to '<prefix>\\.[^.]+\\.[^.]+'")
    name = _NOT_IN_NAME.sub("_", template.format(prefix=".".join(parts[:-2]), schema=parts[-2], table=parts[-1]))
    if name[:1].isdigit():
        name = f"t_{name}"
    if name.startswith("_cdc_"):
        raise ConfigError(f"topic {topic!r} maps to table {name!r}, and names starting with '_cdc_' are reserved; "
                          "change discover.table_name")
    return name[:128]


def discovered(config: IngestConfig, topics: list[str]) -> list[TableSpec]:
    """The tables ``config.discover`` finds among ``topics`` that ``config.tables`` does not list.

    Raises:
        ConfigError: a matching topic is not a table's, or two tables would share a name.
    """
    spec = config.discover
    if spec is None:
        return []
    pattern = re.compile(spec.topic_pattern)
    listed = {t.topic: t.name for t in config.tables}
    names = {t.name: t.topic for t in config.tables}
    found = []
    for topic in sorted(topics):
        if topic in listed or not pattern.fullmatch(topic):
            continue
        name = table_name(spec.table_name, topic)
        if name in names:
            raise ConfigError(f"topics {names[name]!r} and {topic!r} both give table {name!r}; list one of them "
                              "under 'tables' with a name of its own, or change discover.table_name")
        names[name] = topic
        found.append(spec.spec(name, topic))
    return found


def with_discovered(config: IngestConfig, source: Catalog | None = None, *, strict: bool = True) -> IngestConfig:
    """``config`` with the tables its pattern finds now added after the listed ones (unchanged without ``discover``).

    Args:
        strict: raise when the source cannot list its topics. Readers (``ingest status``, the
            Dagster location) pass ``False``: they then warn and show the listed tables only.

    Raises:
        ConfigError: see :func:`discovered`.
        SourceUnavailableError: the source cannot list its topics (``strict`` only).
    """
    if config.discover is None:
        return config
    try:
        topics = (source or catalog_for(config)).topics()
    except SourceUnavailableError as exc:
        if strict:
            raise
        log.warning("discovered tables left out: %s", exc)
        return config
    found = discovered(config, topics)
    if found:
        log.info("discovered %d tables: %s", len(found), ", ".join(t.name for t in found))
    return config.model_copy(update={"tables": config.tables + tuple(found)})
