"""A source database as ``ingest verify --source-db`` reads it, and one table compared with it.

:func:`source_database` gives the module that reads a DSN's database -- :mod:`ingest.verify.pg_source`
or :mod:`ingest.verify.mysql_source`, both :class:`SourceDatabase` -- and :func:`reached` turns its
connection failures into one line. :func:`check_table` compares one configured table's live rows
(``_cdc_*`` columns dropped) with its source rows converted to the engine's representation
(:mod:`ingest.verify.source_values`), key by key (:func:`ingest.verify.compare.verify_table`).
:mod:`ingest.ops.verify_source` runs the whole command: it waits for Debezium and the tables first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ingest import secrets
from ingest.commit.state import load_state
from ingest.config import IngestConfig, TableSpec
from ingest.config.source import DEBEZIUM_DEFAULTS, DebeziumModes
from ingest.errors import ConfigError, EnvironmentProblem, SourceUnavailableError, first_line, shortened
from ingest.lake.delta import open_table, read_all
from ingest.lake.layout import TablePaths
from ingest.lake.location import LakePath
from ingest.records import quarantine
from ingest.verify.captured import CaptureResult
from ingest.verify.compare import TableVerification, keys_of, verify_table
from ingest.verify.source_values import NotRepresentable, SourceColumn

Say = Callable[[str], None]


class SourceDatabase(Protocol):
    """What ``verify`` (and ``resnapshot`` through a signal table) needs of a source database (a module:
    :mod:`ingest.verify.pg_source`, :mod:`ingest.verify.mysql_source`)."""

    @property
    def Error(self) -> type[Exception]:
        """What its client raises."""

    @property
    def OperationalError(self) -> type[Exception]:
        """What its client raises when it cannot connect."""

    def connect(self, dsn: str) -> AbstractContextManager[Any]: ...

    def read_columns(self, conn: Any, schema: str, table: str, key_override: tuple[str, ...] | None,
                     modes: DebeziumModes = ...
                     ) -> tuple[list[SourceColumn], tuple[str, ...], Iterator[tuple[Any, ...]]]: ...

    def wait_for_capture(self, dsn: str, *, timeout: float = 120.0, say: Say | None = None,
                         on_stall: Callable[[], object] | None = None) -> CaptureResult: ...

    def describe(self, dsn: str) -> str: ...

    def insert_signal(self, conn: Any, table: str, row: tuple[str, str, str]) -> None: ...


def source_table_of(spec: TableSpec) -> tuple[str, str]:
    """``(schema, table)`` of a configured table's source: ``source_table``, else from the topic name.

    Raises:
        ConfigError: no ``source_table`` and the topic is not ``<prefix>.<schema>.<table>``.
    """
    name = spec.source_table
    if name is None:
        parts = spec.topic.split(".")
        if len(parts) != 3 or not all(parts):
            raise ConfigError(f"table {spec.name!r}: topic {spec.topic!r} is not <prefix>.<schema>.<table>; "
                              "set source_table: <schema>.<table> in the configuration")
        return parts[1], parts[2]
    schema, table = name.split(".")
    return schema, table


@dataclass
class SourceRows:
    """A source table read in the engine's representation."""

    rows: pa.Table
    key: tuple[str, ...]
    columns: list[SourceColumn]
    notes: list[str] = field(default_factory=list)

    @property
    def normalizers(self) -> dict[str, Callable[[Any], Any]]:
        return {c.name: c.normalize for c in self.columns if c.normalize is not None and c.arrow is not None}


def extra_of(dsn: str) -> str:
    """The distribution's extra whose client reads ``dsn``: ``mariadb`` for ``mysql://`` and
    ``mariadb://`` URLs, ``postgres`` for anything else (a libpq connection string)."""
    return "mariadb" if dsn.split("://", 1)[0].lower() in ("mysql", "mariadb") else "postgres"


def source_database(dsn: str) -> SourceDatabase:
    """The module that reads the source database ``dsn`` names.

    ``mysql://`` and ``mariadb://`` URLs are MariaDB or MySQL (:mod:`ingest.verify.mysql_source`);
    anything else is a libpq connection string (:mod:`ingest.verify.pg_source`).

    Raises:
        EnvironmentProblem: that database's client library (an extra of the distribution) is not
            installed: one line naming the extra.
    """
    # Each source's client library is an extra of the distribution (postgres, mariadb): only the one
    # this source needs is loaded.
    try:
        if extra_of(dsn) == "mariadb":
            from ingest.verify import mysql_source  # PyMySQL: the mariadb extra

            return mysql_source
        from ingest.verify import pg_source  # psycopg: the postgres extra

        return pg_source
    except ImportError as exc:
        raise EnvironmentProblem(f"reaching a source database needs {exc.name}, which is not installed: "
                                 f"pip install 'cdc-lakehouse-ingest[{extra_of(dsn)}]'") from None


@contextmanager
def reached(source: SourceDatabase, where: str) -> Iterator[None]:
    """Turn a connection failure of ``source`` into one redacted line naming ``where``.

    Raises:
        SourceUnavailableError: the database did not take the connection.
    """
    try:
        yield
    except source.OperationalError as exc:
        raise SourceUnavailableError(secrets.redact(f"source database {where}: {first_line(exc)}")) from None


def read_source(source: SourceDatabase, conn: Any, schema: str, table: str,
                key_override: tuple[str, ...] | None = None, modes: DebeziumModes | None = None) -> SourceRows:
    """Read ``schema.table`` with each compared column converted to the engine's value and type, as
    a connector of ``modes`` (default: Debezium's defaults) sends it.

    Raises:
        ConfigError: the table does not exist or has neither a primary key nor an override.
    """
    plans, key, rows = source.read_columns(conn, schema, table, key_override, modes or DEBEZIUM_DEFAULTS)
    if not key:
        raise ConfigError(f"source table {schema}.{table} has no primary key; set primary_key in the configuration")
    compared = [p for p in plans if p.arrow is not None]
    notes = [f"column {p.name!r}: {p.note}" for p in plans if p.arrow is None]
    missing_key = [k for k in key if k not in {p.name for p in compared}]
    if missing_key:
        raise ConfigError(f"source table {schema}.{table}: key column(s) {missing_key} cannot be compared")
    values: list[list[Any]] = [[] for _ in compared]
    unrepresentable = 0
    for row in rows:
        for i, (plan, value) in enumerate(zip(compared, row, strict=True)):
            if value is not None and plan.convert is not None:
                try:
                    value = plan.convert(value)
                except NotRepresentable as exc:
                    unrepresentable += 1
                    if unrepresentable <= 3:
                        notes.append(f"column {plan.name!r}: {exc}; compared as null")
                    value = None
            values[i].append(value)
    arrays = {p.name: pa.array(v, type=p.arrow) for p, v in zip(compared, values, strict=True)}
    return SourceRows(pa.table(arrays), key, plans, notes)


@dataclass
class TableCheck:
    """One configured table against its source table."""

    table: str
    source_table: str
    verification: TableVerification | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    unknown_rows: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.verification is not None and self.verification.ok


def check_table(config: IngestConfig, spec: TableSpec, conn: Any, source: SourceDatabase) -> TableCheck:
    """Compare one configured table with its source table (``conn``: a connection of ``source``)."""
    try:
        schema, table = source_table_of(spec)
    except ConfigError as exc:
        return TableCheck(spec.name, "?", error=str(exc))
    check = TableCheck(spec.name, f"{schema}.{table}")
    path = config.table_path(spec.name)
    # The lake's rows are keyed as the engine keyed them: by the configured key, else by the one its
    # commits record (Debezium's message key, which need not be a primary key of the source table).
    key = spec.primary_key or load_state(path).key_columns
    try:
        rows = read_source(source, conn, schema, table, key, config.source.debezium)
    except (ConfigError, source.Error) as exc:
        check.error = first_line(exc)
        return check
    if repeated := _repeated_keys(rows):
        check.error = repeated
        return check
    rows = _selected(rows, spec)
    check.notes = list(rows.notes)
    held = held_in_quarantine(TablePaths.of(config, spec.name).quarantine, spec.name, rows)
    check.verification = verify_table(spec.name, path, rows.rows, rows.key, held=held, normalizers=rows.normalizers)
    if check.verification.other_types:
        check.notes.append(_modes_hint(check.verification.other_types, config.source.debezium))
    if check.verification.held:
        check.notes.append(f"{check.verification.held} of the differences are rows whose changes are held in "
                           f"quarantine: `ingest quarantine list -t {spec.name}` shows them, and after a fix "
                           f"`ingest quarantine replay -t {spec.name}` applies them")
    check.unknown_rows, unknown_note = _unknown_values(path, rows.key)
    if unknown_note:
        check.notes.append(unknown_note)
    return check


def _selected(source: SourceRows, spec: TableSpec) -> SourceRows:
    """The source rows without the columns the table leaves out (``tables[].columns``), which never
    reach the lake; a note names them instead of what was said of them."""
    if spec.columns is None:
        return source
    left_out = [c.name for c in source.columns if not spec.columns.keeps(c.name, source.key)]
    if not left_out:
        return source
    said = tuple(f"column {name!r}" for name in left_out)
    notes = [n for n in source.notes if not n.startswith(said)]
    notes.append(f"column(s) {', '.join(map(repr, left_out))}: left out by tables[].columns "
                 f"{spec.columns.selects}, so not in the lake; not compared")
    return SourceRows(source.rows.drop_columns([c for c in left_out if c in source.rows.column_names]), source.key,
                      [c for c in source.columns if c.name not in left_out], notes)


def _modes_hint(other: dict[str, tuple[pa.DataType, pa.DataType]], modes: DebeziumModes) -> str:
    """What to set when columns hold another kind of value than verify reads the source as: most
    likely the connector's handling modes, which ``source.debezium`` names."""
    columns = ", ".join(f"{name!r} {lake} (verify reads {source})" for name, (source, lake) in other.items())
    named = ", ".join(f"{k}={v}" for k, v in modes.model_dump(by_alias=True).items())
    return (f"columns of another kind than verify reads from the source: {columns}; if the connector's "
            f"decimal.handling.mode, binary.handling.mode, interval.handling.mode or time.precision.mode differs "
            f"from what source.debezium names ({named}), name its values there (docs/types.md#other-handling-modes)")


def _repeated_keys(source: SourceRows) -> str | None:
    """Why the source rows cannot be compared key by key, when their key holds a value twice: the
    configured ``primary_key`` is not unique in the source, and the lake keeps one row per key."""
    if not source.rows.num_rows:
        return None
    counts = source.rows.group_by(list(source.key)).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1))
    if not repeated.num_rows:
        return None
    first = repeated.slice(0, 1).to_pylist()[0]
    example = ", ".join(f"{k}={first[k]!r}" for k in source.key)
    return (f"the key ({', '.join(source.key)}) is not unique in the source table: {repeated.num_rows} value(s) "
            f"held by more than one row, e.g. ({example}) by {first['count_all']}; the lake keeps one row per key, "
            f"so name columns the source holds unique in tables[].primary_key")


def held_in_quarantine(quarantine_path: LakePath, table: str, source: SourceRows) -> dict[tuple[Any, ...], str]:
    """The table's changes held in quarantine and not replayed yet, by the key of the row each would
    change, as ``held in quarantine: <message id> (<stage>: <reason>)``: what a difference there comes from."""
    named = quarantine.pending_row_keys(quarantine_path, table)
    keys = keys_of((key for key, _ in named), source.key, source.rows)
    held: dict[tuple[Any, ...], list[str]] = {}
    for key, (_, r) in zip(keys, named, strict=True):
        held.setdefault(key, []).append(f"{r['topic']}:{r['partition']}:{r['offset']} ({r['stage']}: "
                                        f"{shortened(first_line(r['reason']), 120)})")
    return {key: "held in quarantine: " + ", ".join(ids[:2]) + (f" and {len(ids) - 2} more" if len(ids) > 2 else "")
            for key, ids in held.items()}


def _unknown_values(path: Any, key: tuple[str, ...]) -> tuple[int, str | None]:
    """Live rows whose ``_cdc_unknown_columns`` is not empty (an unchanged-TOAST value never seen)."""

    delta = open_table(path)
    if delta is None:
        return 0, None
    names = {f.name for f in delta.schema().fields}
    if "_cdc_unknown_columns" not in names or not set(key) <= names:
        return 0, None
    rows = read_all(delta, columns=[*key, "_cdc_unknown_columns", *(["_cdc_deleted"] if "_cdc_deleted" in names
                                                                      else [])])
    if "_cdc_deleted" in rows.column_names:
        rows = rows.filter(pc.invert(pc.fill_null(rows["_cdc_deleted"], False)))
    marked = [r for r in rows.to_pylist() if r["_cdc_unknown_columns"]]
    if not marked:
        return 0, None
    sample = ", ".join("(" + ", ".join(f"{k}={r[k]!r}" for k in key) + f") {r['_cdc_unknown_columns']}"
                       for r in marked[:3])
    return len(marked), (f"{len(marked)} live row(s) hold values the engine marked unknown (unchanged TOAST "
                         f"with no stored value, written as null), e.g. {sample}")
