"""Compare a Delta target table with the true source state, key by key and column by column.

The target is read as readers see it: live rows only (``_cdc_deleted`` false or null when the
table keeps soft deletes), framework columns (``_cdc_*``) dropped. Values are compared after
lining types up: the target may store a wider type (``long`` for ``int``, a larger decimal) or
timestamps in another unit or zone; timestamps are compared as instants (naive ones read as UTC).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from ingest.decode.columns import EPOCH_UTC
from ingest.errors import shortened
from ingest.lake.delta import open_table, read_all
from ingest.lake.location import Location

CDC_PREFIX: Final = "_cdc_"
DELETED_COLUMN: Final = "_cdc_deleted"
MAX_EXAMPLES: Final = 5
_CAST_ERRORS: Final = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


@dataclass
class TableVerification:
    """How one target table compares with the truth.

    Args:
        table: table name.
        expected_rows: rows in the truth.
        actual_rows: live rows in the target.
        missing: expected keys absent from the target.
        unexpected: target keys absent from the truth (and extra rows of a repeated key).
        different: keys present in both whose values differ.
        ok: no missing, unexpected or different keys.
        examples: up to :data:`MAX_EXAMPLES` readable findings, mismatches first.
        explained: keys that differ but are explained elsewhere (e.g. quarantined); not counted.
        held: findings, counted, on keys whose changes are held back (``held`` of :func:`verify_table`).
        other_types: the columns whose table type is of another kind than the truth's (a string
            where a decimal is expected), with both types: their values cannot be equal.
    """

    table: str
    expected_rows: int
    actual_rows: int
    missing: int
    unexpected: int
    different: int
    ok: bool
    examples: list[str] = field(default_factory=list)
    explained: int = 0
    held: int = 0
    other_types: dict[str, tuple[pa.DataType, pa.DataType]] = field(default_factory=dict)


def verify_table(
    name: str,
    delta_path: Location,
    expected: pa.Table,
    key_columns: tuple[str, ...],
    *,
    explained_keys: set[tuple[Any, ...]] | None = None,
    held: Mapping[tuple[Any, ...], str] | None = None,
    normalizers: Mapping[str, Callable[[Any], Any]] | None = None,
) -> TableVerification:
    """Compare the Delta table at ``delta_path`` with ``expected``.

    Args:
        name: table name, for the report.
        delta_path: the Delta table; a missing table means every expected row is missing.
        expected: the true rows (e.g. ``Truth.tables[name]``).
        key_columns: primary-key columns.
        explained_keys: keys whose mismatch is explained elsewhere; reported, not counted.
        held: keys (as :func:`keys_of` gives them) whose changes are held back, with where: a
            finding on such a key says so, and still counts, for the table does differ.
        normalizers: per non-key column, a function applied to both sides' non-null values before
            they are compared (e.g. parse JSON text, so that formatting does not count).

    Returns:
        The comparison; ``ok`` is true when nothing unexplained differs.
    """
    missing_keys = [k for k in key_columns if k not in expected.column_names]
    if missing_keys:
        raise ValueError(f"table {name!r}: key columns {missing_keys} are not in the expected rows")
    actual = _read_live(delta_path)
    lacking = [k for k in key_columns if actual is not None and k not in actual.column_names]
    if actual is not None and lacking:
        # Without its key no target row can be matched: all expected rows are missing.
        return TableVerification(
            table=name, expected_rows=expected.num_rows, actual_rows=actual.num_rows,
            missing=expected.num_rows, unexpected=actual.num_rows, different=0,
            ok=expected.num_rows == actual.num_rows == 0,
            examples=[f"{name}: the table has no key column(s) {lacking}"],
        )
    explained = {_norm_key(k) for k in (explained_keys or set())}
    exp_rows = _index(expected, key_columns, expected, normalizers)
    act_rows = _index(actual, key_columns, expected, normalizers) if actual is not None else {}
    problems: list[str] = []
    notes: list[str] = []
    missing = unexpected = different = explained_hits = held_hits = 0

    def record(key: tuple[Any, ...], message: str) -> bool:
        """Count unless explained; returns True when counted."""
        nonlocal explained_hits, held_hits
        text = f"{name} {_fmt_key(key_columns, key)}: {message}"
        if held and (where := held.get(key)):
            held_hits += 1
            text += f"; {where}"
        if key in explained:
            explained_hits += 1
            notes.append(f"{text} (explained)")
            return False
        problems.append(text)
        return True

    columns = [c for c in expected.column_names if c not in key_columns]
    absent = set(columns) - set(actual.column_names if actual is not None else columns)
    for key, (exp_norm, exp_raw) in exp_rows.items():
        found = act_rows.get(key)
        if found is None:
            missing += record(key, "missing")
            continue
        act_norm, act_raw, copies = found
        diffs = []
        for i, col in enumerate(columns):
            e = exp_norm[i]
            if col in absent:
                if e is not None:
                    diffs.append(f"column {col!r} expected {_short(exp_raw[i])}, the table lacks the column")
            elif e != act_norm[col]:
                diffs.append(f"column {col!r} expected {_short(exp_raw[i])}, got {_short(act_raw[col])}")
        if copies > 1:
            unexpected += sum(record(key, "key appears more than once") for _ in range(copies - 1))
        if diffs:
            different += record(key, "; ".join(diffs))
    for key, (_, act_raw, copies) in act_rows.items():
        if key not in exp_rows:
            for _ in range(copies):
                unexpected += record(key, f"unexpected row {_short(act_raw)}")
    return TableVerification(
        table=name,
        expected_rows=expected.num_rows,
        actual_rows=actual.num_rows if actual is not None else 0,
        missing=missing,
        unexpected=unexpected,
        different=different,
        ok=not (missing or unexpected or different),
        examples=(problems + notes)[:MAX_EXAMPLES],
        explained=explained_hits,
        held=held_hits,
        other_types=_other_types(expected.schema, actual) if actual is not None else {},
    )


def _other_types(expected: pa.Schema, actual: pa.Table) -> dict[str, tuple[pa.DataType, pa.DataType]]:
    """Columns of both whose types are of different kinds, where the table holds values (a column
    first seen holding only nulls is a string). Timestamps of any unit are one kind, but a zoned one
    is not a naive one: their values compare as instants all the same."""
    kinds = {}
    for f in expected:
        if f.name not in actual.column_names or actual[f.name].null_count == actual.num_rows:
            continue
        held = actual.schema.field(f.name).type
        if pa.types.is_timestamp(f.type) and pa.types.is_timestamp(held):
            if (f.type.tz is None) != (held.tz is None):
                kinds[f.name] = (f.type, held)
        elif not _compatible(f.type, held):
            kinds[f.name] = (f.type, held)
    return kinds


def keys_of(keys: Iterable[Mapping[str, Any]], key_columns: tuple[str, ...], reference: pa.Table
            ) -> list[tuple[Any, ...]]:
    """Keys given as ``{column: value}`` (values may be text, as JSON holds a date or a decimal), in
    the form :func:`verify_table` finds ``reference``'s keys in; a value that does not read as its
    column's type stays as it is, and so matches no key."""
    keys = list(keys)
    columns = [_read_as([key.get(k) for key in keys], reference.schema.field(k).type) for k in key_columns]
    return list(zip(*columns, strict=True)) if keys else []


def _read_as(values: list[Any], target: pa.DataType) -> list[Any]:
    """``values`` cast to ``target`` and normalized as :func:`_index` does; value by value when some do not cast."""
    try:
        return _normalized(pa.chunked_array([pa.array(values)]).cast(target, safe=True))
    except _CAST_ERRORS:
        if len(values) == 1:
            return values
        return [v for value in values for v in _read_as([value], target)]


def _read_live(path: Location) -> pa.Table | None:
    """The rows a reader sees, without framework columns; ``None`` if there is no Delta table."""

    delta = open_table(path)
    if delta is None:
        return None
    # delta-rs's own engine, not a pyarrow dataset scan (those can abort the interpreter at exit).
    table = read_all(delta)
    if DELETED_COLUMN in table.column_names and pa.types.is_boolean(table.schema.field(DELETED_COLUMN).type):
        table = table.filter(pc.invert(pc.fill_null(table[DELETED_COLUMN], False)))
    return table.select([c for c in table.column_names if not c.startswith(CDC_PREFIX)])


def _index(
    table: pa.Table, key_columns: tuple[str, ...], reference: pa.Table,
    normalizers: Mapping[str, Callable[[Any], Any]] | None = None,
) -> dict[tuple[Any, ...], Any]:
    """Rows by normalized key: ``(normalized, raw)`` for the truth, ``(normalized, raw, copies)`` else.

    Columns are first cast to the reference (truth) type where that is lossless, so an ``int64``
    target column compares equal to an ``int32`` truth column.
    """
    is_reference = table is reference
    names = [c for c in reference.column_names if c in table.column_names]
    raw = {c: table[c].to_pylist() for c in names}
    norm = {c: _normalized(_aligned(table[c], reference.schema.field(c).type)) for c in names}
    for c, normalize in (normalizers or {}).items():
        if c in norm and c not in key_columns:
            norm[c] = [None if x is None else normalize(x) for x in norm[c]]
    keys = list(zip(*(norm[k] for k in key_columns), strict=True)) if key_columns else []
    value_columns = [c for c in reference.column_names if c not in key_columns]
    out: dict[tuple[Any, ...], Any] = {}
    for i, key in enumerate(keys):
        if is_reference:
            out[key] = ([norm[c][i] for c in value_columns], [raw[c][i] for c in value_columns])
            continue
        if key in out:
            out[key] = (out[key][0], out[key][1], out[key][2] + 1)
            continue
        out[key] = ({c: norm[c][i] for c in names}, {c: raw[c][i] for c in names}, 1)
    return out


_FAMILIES: Final = (
    pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean,
    lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),
    pa.types.is_date,
)


def _compatible(source: pa.DataType, target: pa.DataType) -> bool:
    """Same family (ints, decimals, strings, ...), or an integer that a decimal/float can hold."""
    if any(f(source) and f(target) for f in _FAMILIES):
        return True
    return pa.types.is_integer(source) and (pa.types.is_decimal(target) or pa.types.is_floating(target))


def _aligned(column: pa.ChunkedArray, target: pa.DataType) -> pa.ChunkedArray:
    if column.type == target or pa.types.is_timestamp(column.type) or not _compatible(column.type, target):
        # Timestamps are normalized to instants below; other kinds (a string where an int is
        # expected) keep their values and so compare unequal.
        return column
    try:
        return column.cast(target, safe=True)
    except _CAST_ERRORS:
        return column  # e.g. a value too wide for the truth's type: compare the raw values


def _normalized(column: pa.ChunkedArray) -> list[Any]:
    if pa.types.is_timestamp(column.type):
        # Instants as epoch microseconds: a naive value is read as UTC, an aware one in its zone.
        unit_per_us = {"s": None, "ms": None, "us": 1, "ns": 1000}[column.type.unit]
        ints = column.cast(pa.int64()).to_pylist()
        if unit_per_us is None:
            factor = 1_000_000 if column.type.unit == "s" else 1000
            return [None if v is None else v * factor for v in ints]
        return [None if v is None else v // unit_per_us for v in ints]
    return column.to_pylist()


def _norm_key(key: Iterable[Any]) -> tuple[Any, ...]:
    out = []
    for v in key:
        if isinstance(v, dt.datetime):
            aware = v if v.tzinfo else v.replace(tzinfo=dt.UTC)
            v = (aware - EPOCH_UTC) // dt.timedelta(microseconds=1)
        out.append(v)
    return tuple(out)


def _fmt_key(key_columns: tuple[str, ...], key: tuple[Any, ...]) -> str:
    return "(" + ", ".join(f"{c}={v!r}" for c, v in zip(key_columns, key, strict=True)) + ")"


def _short(value: Any, limit: int = 80) -> str:
    return shortened(repr(value), limit)
