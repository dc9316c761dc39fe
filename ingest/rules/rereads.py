"""Incremental snapshot reads that contradict the change streamed just before them: suspect reads.

See docs/operations.md#reads-taken-before-a-commit-was-visible.

Debezium's incremental snapshot reads a table in chunks and drops a chunk's read of a row that
changed while the chunk was open; a change streamed before the chunk opened it takes as visible to
the chunk's query. PostgreSQL streams a commit from its WAL a moment before other sessions see it,
so a chunk that reads in that moment reads the row as it was before the change, and the read comes
after the change in source order: applied by position, it puts the older row back (or brings back
a deleted one).

A read contradicts the streamed change before it only so, or when the table lost that change (rows
changed behind the engine's back, a topic that lost messages); either way reading the row again is
right. So the rule names the keys whose incremental read differs from the key's previous event --
a streamed image, on the columns both know, or a delete -- and the engine asks the connector to read
those rows again (:func:`condition`). A read after a read is never suspect, so the re-reads end.

A read again cannot undo a read that followed a delete: a row the source no longer holds is not read
at all. So such a read is applied as that delete, at the read's own position (:attr:`SuspectReads.deleted`):
the key stays deleted unless the read again finds the row. A delete at a read's position (phase
:data:`~ingest.model.SNAPSHOT`, which no streamed delete has) counts as a read, so the read again
that finds the row is not suspect and brings it back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ingest.rules.ordering import at_snapshot_phase_sql
from ingest.rules.sql import connect, ident, key_list, keys_equal, literal, query

#: A column name both PostgreSQL and MySQL/MariaDB read unquoted as itself.
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True, slots=True)
class SuspectReads:
    """The keys (values of ``key_columns``) whose incremental read contradicts what was streamed before it."""

    key_columns: tuple[str, ...]
    keys: tuple[tuple[Any, ...], ...]
    #: The suspect reads that follow a delete, to be applied as that delete: each its key values and
    #: the read's ``_cdc_position``.
    deleted: tuple[tuple[Any, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.keys)


def suspect_reads(images: pa.Table, stored: pa.Table | None, deletes: pa.Table | None,
                  key_columns: tuple[str, ...], columns: Sequence[str], *, history: bool) -> SuspectReads:
    """The keys whose incremental snapshot read contradicts the key's previous event, in key order, and
    of those reads the ones whose previous event is a delete (:attr:`SuspectReads.deleted`).

    A key's events are its batch's changes, its stored row (or scd2 versions) and its remembered
    delete; the previous event of a read is the last before the read's position (at one position: a
    stored image, then a delete, then the batch's changes by offset). It is contradicted when it is
    a delete, or a streamed image (not a read) that differs from the read on a column it knows. A
    delete at a read's position is a read that followed a delete, applied as it: it counts as a read.

    Args:
        images: the batch's changes of the keys (no truncates): the key columns, ``_cdc_position``,
            ``_cdc_offset``, ``_cdc_op``, ``_cdc_snapshot``, ``_cdc_toast`` and ``columns``.
        stored: the keys' stored rows: the key columns, ``_cdc_position``, ``_cdc_op``,
            ``_cdc_deleted``, ``_cdc_unknown_columns`` (if the table has it), ``_cdc_end_position``
            and ``_cdc_end_op`` (``history``: every version) and those of ``columns`` the table has.
        deletes: the keys' remembered deletes (hard deletes leave no row): the key columns and ``_cdc_position``.
        columns: the value columns to compare.
    """
    keys = key_list(key_columns)
    # Values compare as text: a column retyped since (ingest retype) or widened holds another type in
    # the table than in the batch, and one union must hold both.
    values = ", ".join(f"CAST({ident(c)} AS VARCHAR) AS v{i}" for i, c in enumerate(columns))
    nulls = "".join(f", CAST(NULL AS VARCHAR) AS v{i}" for i in range(len(columns)))
    empty = "CAST([] AS VARCHAR[])"
    parts = [f"SELECT {keys}, _cdc_position AS pos, 1 AS src, _cdc_offset AS ord, _cdc_op = 'd' AS del, "
             f"_cdc_op = 'r' AS rd, coalesce(_cdc_toast, {empty}) AS unknown{', ' + values if values else ''} "
             "FROM images"]
    tables: dict[str, pa.Table] = {"images": images}
    if stored is not None and stored.num_rows:
        tables["stored"] = stored
        has = set(stored.column_names)
        missing = [literal(c) for c in columns if c not in has]  # columns the table does not have yet
        unknown = (f"coalesce(_cdc_unknown_columns, {empty})" if "_cdc_unknown_columns" in has else empty)
        if missing:
            unknown = f"list_concat({unknown}, [{', '.join(missing)}])"
        kept = "".join(f", CAST({ident(c) if c in has else 'NULL'} AS VARCHAR) AS v{i}" for i, c in enumerate(columns))
        # An scd2 table keeps a delete of a deleted key as a row of its own (op d, ending nothing).
        parts.append(f"SELECT {keys}, _cdc_position, 0, 0, _cdc_op = 'd', _cdc_op = 'r' OR (_cdc_op = 'd' AND "
                     f"{at_snapshot_phase_sql('_cdc_position')}), {unknown}{kept} FROM stored")
        ended = ("_cdc_end_position", "_cdc_end_op = 'd'") if history else ("_cdc_position", "_cdc_deleted")
        # a delete at a read's phase is a read that followed a delete, applied as it: it counts as a read
        parts.append(f"SELECT {keys}, {ended[0]}, 0, 1, true, {at_snapshot_phase_sql(ended[0])}, {empty}{nulls} "
                     f"FROM stored WHERE {ended[1]}")
    if deletes is not None and deletes.num_rows:
        tables["deletes"] = deletes
        parts.append(f"SELECT {keys}, _cdc_position, 0, 1, true, {at_snapshot_phase_sql('_cdc_position')}, "
                     f"{empty}{nulls} FROM deletes")
    agrees = " AND ".join(f"(list_contains(p.unknown, {literal(c)}) OR CAST(r.{ident(c)} AS VARCHAR) "
                          f"IS NOT DISTINCT FROM p.v{i})" for i, c in enumerate(columns)) or "true"
    sql = f"""
        WITH events AS ({" UNION ALL ".join(parts)}),
        reads AS (SELECT row_number() OVER () AS n, * FROM images
                  WHERE _cdc_op = 'r' AND _cdc_snapshot = 'incremental'),
        prior AS (
            SELECT r.n, e.*, row_number() OVER (PARTITION BY r.n ORDER BY e.pos DESC, e.src DESC, e.ord DESC) AS rank
            FROM reads r JOIN events e ON {keys_equal("r", "e", key_columns)} AND e.pos < r._cdc_position)
        SELECT DISTINCT {key_list(key_columns, "r")}, r._cdc_position AS __read_position, p.del AS __after_delete
        FROM reads r JOIN prior p ON p.n = r.n AND p.rank = 1
        WHERE NOT p.rd AND (p.del OR NOT ({agrees}))
        ORDER BY {key_list(key_columns, "r")}, __read_position"""
    con = connect(**tables)
    try:
        found = query(con, sql)
    finally:
        con.close()
    reads = list(zip(*(found[k].to_pylist() for k in key_columns), found["__read_position"].to_pylist(),
                     found["__after_delete"].to_pylist(), strict=True))
    return SuspectReads(key_columns, tuple(dict.fromkeys(r[:-2] for r in reads)),
                        tuple(r[:-1] for r in reads if r[-1]))


def condition(suspects: SuspectReads) -> str | None:
    """An SQL condition that selects the suspect rows, read alike by PostgreSQL and MySQL/MariaDB
    (Debezium's ``additional-conditions``); ``None`` when a key column's name or value has no
    spelling both read the same way (quoted names, text with a backslash, other types)."""
    names = suspects.key_columns
    if not suspects.keys or not all(_PLAIN_NAME.fullmatch(n) for n in names):
        return None
    rows = [[_literal(v) for v in key] for key in suspects.keys]
    if any(v is None for row in rows for v in row):
        return None
    if len(names) == 1:
        return f"{names[0]} IN ({', '.join(str(row[0]) for row in rows)})"
    tuples = ", ".join(f"({', '.join(str(v) for v in row)})" for row in rows)
    return f"({', '.join(names)}) IN ({tuples})"


def _literal(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, datetime):
        return None  # time zones: the two databases read a timestamp literal differently
    if isinstance(value, date):
        return f"'{value.isoformat()}'"
    if isinstance(value, str) and "\\" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None
