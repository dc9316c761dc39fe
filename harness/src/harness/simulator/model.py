"""The simulated PostgreSQL source: table definitions, column types and the live rows.

Rows hold plain Python values of the types the decoder produces (see :mod:`ingest.model`):
``int``, ``bool``, ``str`` (also for ``Json`` and ``Enum``), ``decimal.Decimal``,
``datetime.date``, naive ``datetime`` for ``MicroTimestamp`` (``timestamp without time zone``)
and UTC-aware ``datetime`` for ``ZonedTimestamp`` (``timestamptz``). Keeping the source state in
the decoder's types means the true final state needs no conversion beyond Arrow.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final, Literal

import pyarrow as pa

ColumnKind = Literal[
    "int16", "int32", "int64", "boolean", "string", "decimal", "variable_decimal",
    "date", "micro_timestamp", "zoned_timestamp", "json", "enum",
]
ReplicaIdentity = Literal["full", "default"]
Row = dict[str, Any]
Key = tuple[Any, ...]

#: ``VariableScaleDecimal`` lands in ``decimal(38,18)``; the truth holds it quantized like that.
VARIABLE_DECIMAL_PRECISION: Final = 38
VARIABLE_DECIMAL_SCALE: Final = 18
_VARIABLE_QUANTUM: Final = Decimal(1).scaleb(-VARIABLE_DECIMAL_SCALE)

EPOCH_DATE: Final = dt.date(1970, 1, 1)
UTC: Final = dt.UTC

CUSTOMER_SEGMENTS: Final = ("consumer", "smb", "enterprise")
PRODUCT_CATEGORIES: Final = ("books", "electronics", "home", "garden", "toys")
ORDER_STATUSES: Final = ("pending", "paid", "shipped", "cancelled")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a source table, described by its Debezium semantic type.

    Args:
        name: column name, as PostgreSQL and the target table spell it.
        kind: the Debezium/Connect type family the connector emits for the column.
        nullable: ``False`` for ``NOT NULL`` columns (Connect ``optional: false``).
        precision: digits for ``decimal``.
        scale: fractional digits for ``decimal``.
        allowed: the labels of a PostgreSQL enum type (``io.debezium.data.Enum``).
    """

    name: str
    kind: ColumnKind
    nullable: bool = False
    precision: int | None = None
    scale: int | None = None
    allowed: tuple[str, ...] = ()

    def arrow_type(self) -> pa.DataType:
        """The Arrow type of this column in the truth (and in the Delta target)."""
        if self.kind == "decimal":
            assert self.precision is not None and self.scale is not None
            return pa.decimal128(self.precision, self.scale)
        return _ARROW_TYPES[self.kind]

    def fallback(self) -> Any:
        """The value Debezium puts in a ``NOT NULL`` column the WAL did not carry.

        With ``REPLICA IDENTITY DEFAULT`` a delete's old tuple holds only the key; Debezium fills
        the other required fields with the converter's fallback (zero, empty string, epoch) rather
        than null, so a consumer must never trust a key-only ``before`` image.
        """
        if self.nullable:
            return None
        return _FALLBACKS[self.kind] if self.kind != "decimal" else Decimal(0).scaleb(-(self.scale or 0))


_ARROW_TYPES: Final[dict[str, pa.DataType]] = {
    "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "boolean": pa.bool_(),
    "string": pa.string(), "json": pa.string(), "enum": pa.string(),
    "variable_decimal": pa.decimal128(VARIABLE_DECIMAL_PRECISION, VARIABLE_DECIMAL_SCALE),
    "date": pa.date32(), "micro_timestamp": pa.timestamp("us"),
    "zoned_timestamp": pa.timestamp("us", tz="UTC"),
}
_FALLBACKS: Final[dict[str, Any]] = {
    "int16": 0, "int32": 0, "int64": 0, "boolean": False, "string": "", "json": "", "enum": "",
    "variable_decimal": Decimal(0), "date": EPOCH_DATE, "micro_timestamp": dt.datetime(1970, 1, 1),
    "zoned_timestamp": dt.datetime(1970, 1, 1, tzinfo=UTC),
}


@dataclass(frozen=True, slots=True)
class TableDef:
    """A table's shape at one schema version.

    Args:
        name: table name in schema ``public``.
        columns: columns in table order (new columns are appended, as ``ALTER TABLE ADD``).
        key: primary-key column names, in key order.
        replica_identity: ``full`` sends whole old rows on update/delete; ``default`` sends no old
            row on update and only the key (plus fallbacks) on delete, as PostgreSQL does.
        version: schema version, bumped by every column change.
    """

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    replica_identity: ReplicaIdentity = "full"
    version: int = 1

    def column(self, name: str) -> Column:
        for col in self.columns:
            if col.name == name:
                return col
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(self.column(k) for k in self.key)

    def with_column(self, column: Column) -> TableDef:
        """This table after ``ALTER TABLE ... ADD COLUMN`` (a new schema version)."""
        if not column.nullable:
            raise ValueError(f"added column {column.name!r} must be nullable: existing rows hold null")
        return replace(self, columns=(*self.columns, column), version=self.version + 1)

    def with_column_type(self, name: str, kind: ColumnKind) -> TableDef:
        """This table after ``ALTER TABLE ... ALTER COLUMN ... TYPE`` (a new schema version)."""
        columns = tuple(replace(c, kind=kind) if c.name == name else c for c in self.columns)
        if columns == self.columns:
            raise KeyError(f"table {self.name!r} has no column {name!r} to alter")
        return replace(self, columns=columns, version=self.version + 1)

    def key_only_image(self, row: Row) -> Row:
        """The ``before`` image of a delete under ``REPLICA IDENTITY DEFAULT``."""
        keys = set(self.key)
        return {c.name: row[c.name] if c.name in keys else c.fallback() for c in self.columns}

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type(), nullable=c.nullable) for c in self.columns])


def truth_value(column: Column, value: Any) -> Any:
    """Turn a source value into the value the target table must hold."""
    if value is not None and column.kind == "variable_decimal":
        return value.quantize(_VARIABLE_QUANTUM)
    return value


def default_tables() -> dict[str, TableDef]:
    """The demo shop schema: customers, products and orders (orders reference the other two)."""
    customers = TableDef(
        "customers",
        (
            Column("id", "int32"),
            Column("email", "string"),
            Column("full_name", "string"),
            Column("segment", "enum", allowed=CUSTOMER_SEGMENTS),
            Column("country_code", "string", nullable=True),
            Column("birth_date", "date", nullable=True),
            Column("balance", "decimal", precision=12, scale=2),
            Column("created_at", "micro_timestamp"),
            Column("updated_at", "zoned_timestamp"),
            Column("profile", "json", nullable=True),
            Column("notes", "string", nullable=True),
        ),
        ("id",),
        "full",
    )
    products = TableDef(
        "products",
        (
            Column("id", "int32"),
            Column("sku", "string"),
            Column("name", "string"),
            Column("category", "enum", allowed=PRODUCT_CATEGORIES),
            Column("price", "decimal", precision=10, scale=2),
            Column("weight_kg", "variable_decimal", nullable=True),
            Column("in_stock", "boolean"),
            Column("created_at", "micro_timestamp"),
        ),
        ("id",),
        # DEFAULT on purpose: updates arrive without a before image and deletes with a key-only one.
        "default",
    )
    orders = TableDef(
        "orders",
        (
            Column("id", "int64"),
            Column("customer_id", "int32"),
            Column("product_id", "int32"),
            Column("quantity", "int16"),
            Column("unit_price", "decimal", precision=10, scale=2),
            Column("amount", "decimal", precision=12, scale=2),
            Column("status", "enum", allowed=ORDER_STATUSES),
            Column("ordered_at", "micro_timestamp"),
            Column("ship_date", "date", nullable=True),
            Column("note", "string", nullable=True),
        ),
        ("id",),
        "full",
    )
    return {t.name: t for t in (customers, products, orders)}


def ledger_table(number: int) -> TableDef:
    """Extra table ``ledger_<number>`` (three digits) of a whole-database workload.

    Plain bookkeeping rows with no references; odd numbers use ``REPLICA IDENTITY DEFAULT`` so both
    kinds of old image reach the extra tables too.
    """
    return TableDef(
        f"ledger_{number:03d}",
        (
            Column("id", "int32"),
            Column("account", "string"),
            Column("amount", "decimal", precision=12, scale=2),
            Column("booked_at", "zoned_timestamp"),
            Column("memo", "string", nullable=True),
        ),
        ("id",),
        "default" if number % 2 else "full",
    )


#: The column ``customers`` gains mid-stream.
LOYALTY_TIER: Final = Column("loyalty_tier", "string", nullable=True)


@dataclass
class TableState:
    """The live rows of one table, keyed by primary key, with O(1) uniform random choice.

    Args:
        definition: the table's current schema version.
    """

    definition: TableDef
    rows: dict[Key, Row] = field(default_factory=dict)
    _keys: list[Key] = field(default_factory=list)
    _slot: dict[Key, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, key: Key) -> bool:
        return key in self.rows

    def key_of(self, row: Row) -> Key:
        return tuple(row[k] for k in self.definition.key)

    def insert(self, row: Row) -> Key:
        key = self.key_of(row)
        if key in self.rows:
            raise KeyError(f"{self.definition.name}: duplicate key {key}")
        self.rows[key] = row
        self._slot[key] = len(self._keys)
        self._keys.append(key)
        return key

    def replace(self, key: Key, row: Row) -> None:
        if key not in self.rows:
            raise KeyError(f"{self.definition.name}: no row with key {key}")
        self.rows[key] = row

    def delete(self, key: Key) -> Row:
        row = self.rows.pop(key)
        # Swap-remove keeps random choice O(1) without rebuilding the key list.
        slot = self._slot.pop(key)
        last = self._keys.pop()
        if last != key:
            self._keys[slot] = last
            self._slot[last] = slot
        return row

    def truncate(self) -> int:
        removed = len(self.rows)
        self.rows.clear()
        self._keys.clear()
        self._slot.clear()
        return removed

    def random_key(self, rng: random.Random) -> Key | None:
        return self._keys[rng.randrange(len(self._keys))] if self._keys else None

    def add_column(self, column: Column) -> None:
        """Apply ``ALTER TABLE ADD COLUMN``: existing rows get null."""
        self.definition = self.definition.with_column(column)
        for row in self.rows.values():
            row[column.name] = None

    def alter_column_type(self, name: str, kind: ColumnKind) -> None:
        """Apply ``ALTER COLUMN ... TYPE`` to a type that holds every stored value (rows unchanged)."""
        self.definition = self.definition.with_column_type(name, kind)

    def sorted_rows(self) -> Iterator[Row]:
        for key in sorted(self.rows):
            yield self.rows[key]

    def to_arrow(self) -> pa.Table:
        """The live rows in key order, typed as the target table must be."""
        schema = self.definition.arrow_schema()
        rows = [self.rows[k] for k in sorted(self.rows)]
        arrays = [
            pa.array([truth_value(col, r[col.name]) for r in rows], type=col.arrow_type())
            for col in self.definition.columns
        ]
        return pa.Table.from_arrays(arrays, schema=schema)


class SourceDatabase:
    """The whole simulated database: one :class:`TableState` per table."""

    def __init__(self, definitions: dict[str, TableDef] | None = None) -> None:
        self.tables: dict[str, TableState] = {
            name: TableState(d) for name, d in (definitions or default_tables()).items()
        }

    def __getitem__(self, table: str) -> TableState:
        return self.tables[table]

    def definition(self, table: str) -> TableDef:
        return self.tables[table].definition

    def to_arrow(self) -> dict[str, pa.Table]:
        return {name: state.to_arrow() for name, state in self.tables.items()}
