"""``tables:`` and ``discover:``: each table fed by one Debezium topic (key, deletes, quality, history,
columns), and the tables found by topic name."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from ingest.config.base import NAME, SOURCE_TABLE, TOPIC, Duration, Model, PlacementName, QualityPolicy, WriterName


class ColumnSelection(Model):
    """Which source columns a table keeps: ``include`` (only these) or ``exclude`` (all but these).

    Primary-key columns are always kept. A column left out never reaches the table: its values,
    its type and any change of its type are ignored, and ``verify --source-db`` does not compare it.
    """

    include: tuple[str, ...] | None = Field(None, description="keep only these columns (and the key)")
    exclude: tuple[str, ...] | None = Field(None, description="keep every column but these (never the key)")

    @model_validator(mode="after")
    def _one_list(self) -> ColumnSelection:
        if (self.include is None) == (self.exclude is None):
            raise ValueError("give exactly one of include or exclude")
        return self

    @property
    def selects(self) -> str:
        """Which list is given: ``include`` or ``exclude``."""
        return "include" if self.include is not None else "exclude"

    def keeps(self, name: str, key_columns: Iterable[str] = ()) -> bool:
        if name in key_columns:
            return True
        return name in self.include if self.include is not None else name not in (self.exclude or ())


def topic_prefix(topic: str) -> str | None:
    """The topic prefix (Debezium's ``topic.prefix``) of a connector's table topic: the topic without
    ``.<schema>.<table>``; ``None`` for a topic not named that way."""
    parts = topic.rsplit(".", 2)
    return parts[0] if len(parts) == 3 and all(parts) else None


class TableSpec(Model):
    """One target table fed by one Debezium topic."""

    name: str = Field(description="table name: letters, digits and underscores; also its directory name")
    topic: str = Field(description="Debezium topic carrying this table's changes")
    primary_key: tuple[str, ...] | None = Field(
        None, description="primary-key columns (one column may be given as a name), unique in the source: a "
        "source table without a primary key names them here; default: the fields of the Kafka message key"
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
    writer: WriterName | None = Field(
        None, validation_alias=AliasChoices("writer", "engine"),
        description="who writes this table's Delta commits (delta-rs or delta-spark; also accepted as engine); "
        "default: target.writer")
    plan_on: PlacementName | None = Field(
        None, description="where this table's batches are assembled, reduced and planned (driver or executors); "
        "default: target.plan_on")
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

    def topic_prefix(self) -> str | None:
        """The connector's topic prefix (:func:`topic_prefix`)."""
        return topic_prefix(self.topic)

    def named_columns(self) -> dict[str, tuple[str, ...]]:
        """The source columns this table's settings name, by setting (``primary_key``,
        ``columns.include`` ...)."""
        named: dict[str, tuple[str, ...]] = {}
        if self.primary_key:
            named["primary_key"] = self.primary_key
        for setting, selection in (("columns", self.columns), ("track_history", self.track_history)):
            if selection is not None:
                named[f"{setting}.{selection.selects}"] = tuple(getattr(selection, selection.selects) or ())
        return named

    def not_in(self, columns: Iterable[str]) -> list[str]:
        """What this table's settings name that ``columns`` (the source's) lack, one phrase per setting:
        ``["primary_key names idd"]``."""
        have = set(columns)
        return [f"{setting} names {', '.join(absent)}" for setting, names in self.named_columns().items()
                if (absent := [n for n in names if n not in have])]

    def kept(self, columns: Iterable[str]) -> list[str]:
        """The columns the table keeps of its source's ``columns`` (``columns.include``/``exclude``). The
        key's are always kept; without ``primary_key`` the key is the message key's, unknown from the
        row, so then every column counts as kept."""
        if self.columns is None or self.primary_key is None:
            return list(columns)
        return [c for c in columns if self.columns.keeps(c, self.primary_key)]

    @field_validator("primary_key", mode="before")
    @classmethod
    def _one_column(cls, value: object) -> object:
        """``primary_key: id`` is the one-column key ``[id]``, as people write it."""
        if isinstance(value, str):
            if "," in value:
                raise ValueError(f"give the columns as a list, [{value}], not as one string")
            return (value,)
        return value

    @field_validator("primary_key")
    @classmethod
    def _key(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and (not value or not all(column.strip() for column in value)):
            raise ValueError("name at least one column, or leave primary_key out to key by the message key")
        return value

    @field_validator("source_table")
    @classmethod
    def _schema_dot_table(cls, value: str | None) -> str | None:
        if value is not None and not SOURCE_TABLE.match(value):
            raise ValueError("must be <schema>.<table>: two names of letters, digits, underscores or $, "
                             "separated by one dot")
        return value

    @field_validator("topic")
    @classmethod
    def _kafka_topic(cls, value: str) -> str:
        # Kafka's own rules; they also keep the name safe as a directory and in `cdc:<topic>:<p>` ids.
        if not TOPIC.match(value) or value in (".", ".."):
            raise ValueError("must be 1-249 characters from [A-Za-z0-9._-] and not '.' or '..' (Kafka's topic rules)")
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not NAME.match(value) or value.startswith("_cdc_"):
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


class DiscoverySpec(Model):
    """Tables found by topic name: every topic matching ``topic_pattern`` becomes a table.

    A topic named ``<prefix>.<schema>.<table>`` (Debezium's naming) gets the table
    ``table_name`` with ``{prefix}``, ``{schema}`` and ``{table}`` filled in; characters a table
    name cannot hold become ``_``. A table listed under ``tables`` with the same topic wins: that is
    how one discovered table is configured differently. See :mod:`ingest.source.discovery`.
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
