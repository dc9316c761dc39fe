"""Schema evolution between a batch and its target table (docs/architecture.md#schema-evolution).

New columns are added (existing rows read null, even where the source's default filled them: see
:meth:`SchemaPlan.unfilled_defaults`). Safe widenings are applied: integers to wider
integers, ``float`` to ``double``, integers to ``double`` (schemaless JSON reads ``1`` as a long
and ``1.5`` as a double in one column; integers beyond 2**53 are rounded, as any double would hold
them), decimals to more precision without fewer integer digits or less scale. Anything else stops
the table with :class:`SchemaIncompatibleError`, naming the column and both types, before anything
is committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ingest.errors import SchemaIncompatibleError, TableError
from ingest.model import UNTYPED, ColumnSpec, parse_decimal

_INT_RANK = {"byte": 0, "short": 1, "integer": 2, "long": 3}
_FLOAT_RANK = {"float": 0, "double": 1}


def holds(wide: str, narrow: str) -> bool:
    """True if every value of type ``narrow`` is exactly representable in ``wide``."""
    if wide == narrow or narrow == UNTYPED:  # a null-only schemaless column fits any type
        return True
    if wide in _INT_RANK and narrow in _INT_RANK:
        return _INT_RANK[wide] >= _INT_RANK[narrow]
    if wide in _FLOAT_RANK and narrow in _FLOAT_RANK:
        return _FLOAT_RANK[wide] >= _FLOAT_RANK[narrow]
    if wide == "double" and narrow in _INT_RANK:
        return True
    w, n = parse_decimal(wide), parse_decimal(narrow)
    if w and n:
        return w[1] >= n[1] and (w[0] - w[1]) >= (n[0] - n[1])
    return False


@dataclass(slots=True)
class SchemaPlan:
    """The user columns the table will have after this batch, and how they changed."""

    columns: list[ColumnSpec]
    added: list[ColumnSpec] = field(default_factory=list)
    widened: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened)

    def describe(self) -> str:
        parts = [f"added {c.name} {c.type}" + (_source_default(c.default) if c.default else "") for c in self.added]
        parts += [f"widened {name} {old}->{new}" for name, old, new in self.widened]
        return "; ".join(parts)

    def added_defaults(self) -> dict[str, str]:
        """The added columns that carry a default at the source, and their defaults as text."""
        return {c.name: c.default for c in self.added if c.default}

    def unfilled_defaults(self, table: str) -> str | None:
        """What to tell when columns added to an existing table carry a default at the source.

        Adding a column with a default fills the source's existing rows without a change event
        (PostgreSQL, MySQL and MariaDB alike), so the table's rows that do not change again hold
        null where the source holds the default. The engine cannot tell that from a column given
        its default later, so it says so rather than fill the rows.
        """
        defaulted = self.added_defaults()
        if not defaulted:
            return None
        named = ", ".join(f"{name!r}{_source_default(default)}" for name, default in defaulted.items())
        return (f"table {table!r}: new column{'s' if len(defaulted) > 1 else ''} {named}: the table's earlier "
                f"rows hold null there, where the source may hold the default (adding a column with a default "
                f"fills existing rows without change events). `ingest verify --source-db` shows them; "
                f"`ingest resnapshot {table}` reads them again "
                f"(docs/operations.md#a-column-added-with-a-default)")


def _source_default(default: str) -> str:
    return f" (source default {default})"


def combine(table: str, images: Iterable[Iterable[ColumnSpec]]) -> list[ColumnSpec]:
    """Union of the columns of several images (schema versions) in first-seen order."""
    merged: dict[str, ColumnSpec] = {}
    for columns in images:
        for col in columns:
            seen = merged.get(col.name)
            if seen is None:
                merged[col.name] = col
            elif holds(seen.type, col.type):
                continue
            elif holds(col.type, seen.type):
                merged[col.name] = col
            else:
                raise SchemaIncompatibleError(table, col.name, seen.type, col.type)
    return list(merged.values())


def _stored_type(col: ColumnSpec) -> ColumnSpec:
    """A column as the table stores it: one null in every schemaless message seen is a string."""
    return col if col.type != UNTYPED else ColumnSpec(col.name, "string", col.nullable, col.semantic)


def plan_schema(table: str, current: list[ColumnSpec] | None, incoming: list[ColumnSpec]) -> SchemaPlan:
    """Decide the table's user columns for a batch.

    Args:
        table: table name, for errors.
        current: the table's user columns, or ``None`` for a table not created yet.
        incoming: the batch's columns (see :func:`combine`).

    Raises:
        SchemaIncompatibleError: a column changed type in a way no widening covers.
    """
    if current is None:
        return SchemaPlan(columns=[_stored_type(c) for c in incoming], added=[])
    by_name = {c.name: c for c in current}
    result = list(current)
    plan = SchemaPlan(columns=result)
    for col in incoming:
        existing = by_name.get(col.name)
        if existing is None:
            result.append(_stored_type(col))
            plan.added.append(_stored_type(col))
        elif holds(existing.type, col.type):
            continue
        elif holds(col.type, existing.type):
            result[result.index(existing)] = ColumnSpec(col.name, col.type, existing.nullable, col.semantic)
            plan.widened.append((col.name, existing.type, col.type))
        else:
            raise SchemaIncompatibleError(table, col.name, existing.type, col.type)
    return plan


def check_column_names(table: str, columns: list[ColumnSpec]) -> None:
    """Column names Delta cannot hold stop the table with a named error, before anything is written.

    Quotes, SQL metacharacters and spaces are fine (every identifier is quoted); what Delta's
    case-insensitive schema or a reader cannot tell apart is not.
    """
    seen: dict[str, str] = {}
    for col in columns:
        if not col.name or any(ord(ch) < 32 or ord(ch) == 127 for ch in col.name):
            raise TableError(table, f"source column {col.name!r} is empty or holds control characters; "
                                    "Delta cannot store it (rename it in the source or drop it in Debezium)")
        other = seen.setdefault(col.name.lower(), col.name)
        if other != col.name:
            raise TableError(table, f"source columns {other!r} and {col.name!r} differ only in case; Delta "
                                    "column names are case-insensitive (rename one in the source)")
