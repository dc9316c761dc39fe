"""The ``shop`` schema: four related tables whose columns cover the PostgreSQL types that matter.

* ``customers``: ``integer`` key, ``text``, an enum, ``uuid``, ``numeric(12,2)``, plain ``numeric``,
  ``timestamptz``, ``date``, ``jsonb``, ``text[]`` and ``notes``, a large text (> 8 kB for some rows,
  so PostgreSQL TOASTs it) that most updates leave unchanged.
* ``products``: ``numeric(12,2)``, plain ``numeric``, ``jsonb``, ``bytea``, ``date``, ``time``,
  ``timestamp`` (no zone) and a large ``description``.
* ``orders``: ``bigint`` key, foreign key to ``customers`` (``ON UPDATE/DELETE CASCADE``), an enum,
  ``timestamptz``, ``numeric(12,2)``, ``jsonb``, ``text[]``.
* ``order_items``: composite key ``(order_id, line_no)``, foreign keys to ``orders`` (cascade) and
  ``products``, ``integer`` quantity (the workload widens it to ``bigint``), ``numeric`` discount.

Every table keeps ``REPLICA IDENTITY DEFAULT`` (Debezium then sees only the key of a deleted row, and
an unchanged TOASTed value as a placeholder). Creation is a reset: the schema is dropped with
everything in it and created again, so it can be run any number of times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import sql

#: The default schema name (topics ``<prefix>.shop.<table>``).
DEFAULT_SCHEMA: Final = "shop"
_SCHEMA_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class TableDef:
    """One table of the schema: its name and primary-key columns."""

    name: str
    key: tuple[str, ...]


#: Tables in creation order (parents first).
TABLES: Final[tuple[TableDef, ...]] = (
    TableDef("customers", ("id",)),
    TableDef("products", ("id",)),
    TableDef("orders", ("id",)),
    TableDef("order_items", ("order_id", "line_no")),
)

#: ``{s}`` is replaced by the quoted schema name.
_DDL: Final = """
CREATE TYPE {s}.customer_segment AS ENUM ('consumer', 'smb', 'enterprise', 'öffentlich');
CREATE TYPE {s}.order_status AS ENUM ('new', 'paid', 'shipped', 'delivered', 'cancelled');

CREATE TABLE {s}.customers (
    id              integer PRIMARY KEY,
    email           text NOT NULL,
    full_name       text NOT NULL,
    segment         {s}.customer_segment NOT NULL,
    external_ref    uuid NOT NULL,
    credit_limit    numeric(12,2),
    lifetime_value  numeric,
    signed_up_at    timestamptz NOT NULL,
    birth_date      date,
    preferences     jsonb,
    tags            text[] NOT NULL DEFAULT '{{}}',
    notes           text
);

CREATE TABLE {s}.products (
    id              integer PRIMARY KEY,
    sku             text NOT NULL UNIQUE,
    name            text NOT NULL,
    price           numeric(12,2) NOT NULL,
    weight_kg       numeric,
    attributes      jsonb,
    thumbnail       bytea,
    available_from  date,
    restock_at      time,
    updated_local   timestamp NOT NULL,
    description     text
);

CREATE TABLE {s}.orders (
    id               bigint PRIMARY KEY,
    customer_id      integer NOT NULL REFERENCES {s}.customers (id) ON UPDATE CASCADE ON DELETE CASCADE,
    status           {s}.order_status NOT NULL,
    ordered_at       timestamptz NOT NULL,
    total            numeric(12,2) NOT NULL,
    shipping_address jsonb,
    coupon_code      text,
    tags             text[]
);

CREATE TABLE {s}.order_items (
    order_id    bigint NOT NULL REFERENCES {s}.orders (id) ON DELETE CASCADE,
    line_no     integer NOT NULL,
    product_id  integer NOT NULL REFERENCES {s}.products (id),
    quantity    integer NOT NULL,
    unit_price  numeric(12,2) NOT NULL,
    discount    numeric,
    PRIMARY KEY (order_id, line_no)
);

-- Ids for the load generator (harness.postgres.load), far above the workload's.
CREATE SEQUENCE {s}.load_ids START 1000000000;
"""


def check_schema_name(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case identifier; raise ``ValueError`` otherwise."""
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"schema name {schema!r} must match {_SCHEMA_NAME.pattern}")
    return schema


def ddl(schema: str = DEFAULT_SCHEMA) -> str:
    """The ``CREATE`` statements of the schema's types, tables and sequence."""
    return _DDL.format(s=_quoted(schema))


def reset(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> None:
    """Drop ``schema`` with everything in it and create it again, empty, in one transaction.

    Dropping emits no change events (DDL is not logically decoded); whoever keeps target tables
    fed from the old tables must forget them too (see :mod:`harness.stack_proofs.demo`).
    """
    check_schema_name(schema)
    with conn.transaction():
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(ddl(schema).encode())


def drop(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> None:
    """Drop ``schema`` with everything in it (no error if it does not exist)."""
    check_schema_name(schema)
    with conn.transaction():
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def qualified(schema: str, table: str) -> sql.Composed:
    """``"schema"."table"`` as a SQL fragment."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def _quoted(schema: str) -> str:
    return '"' + check_schema_name(schema) + '"'
