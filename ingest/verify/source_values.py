"""Source values as the engine writes them: what every source database's column plans share.

A source database's module (:mod:`ingest.verify.pg_source`, :mod:`ingest.verify.mysql_source`) says,
for each of its column types, how a column is selected, which Arrow type the engine's Delta column has
and how a fetched value becomes the engine's value (a :class:`SourceColumn`); the conversions that
more than one source needs live here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

import pyarrow as pa

from ingest.decode.values import ConvertError, fit_decimal

Convert = Callable[[Any], Any]


@dataclass(frozen=True)
class SourceColumn:
    """How one source column is selected, converted and compared.

    Attributes:
        name: column name.
        source_type: the source database's name of its type (for messages).
        arrow: the Arrow type of the engine's Delta column; ``None``: not compared.
        select: the select-list expression, in the source database's client's terms.
        convert: turns the fetched value into the engine's value (``None``: as fetched).
        normalize: applied to both sides before comparing (``None``: compare as is).
        note: why the column is not compared.
    """

    name: str
    source_type: str
    arrow: pa.DataType | None
    select: Any
    convert: Convert | None = None
    normalize: Convert | None = None
    note: str | None = None


def decimal_convert(precision: int, scale: int) -> Convert:
    """The engine's own rule for a ``decimal(precision, scale)`` column: exact, or :class:`NotRepresentable`."""

    def convert(value: Decimal) -> Decimal:
        if not value.is_finite():  # PostgreSQL's NaN and ±Infinity
            raise NotRepresentable(f"{value} has no Delta decimal, and Debezium sends it as null")
        try:
            return fit_decimal(value, precision, scale)  # the engine's own rule: exact or refused
        except ConvertError as exc:
            raise NotRepresentable(f"{exc}, and the engine quarantines it") from None

    return convert


#: What Debezium sends, as text, for a decimal that is not a number (``decimal.handling.mode=string``).
_DECIMAL_NAMES: Final = {"NaN": "NAN", "Infinity": "POSITIVE_INFINITY", "-Infinity": "NEGATIVE_INFINITY"}


def decimal_text(value: Decimal) -> str:
    """A decimal as ``decimal.handling.mode=string`` sends it: plain notation with its scale kept
    (``1E-20`` is ``0.00000000000000000001``), and ``NaN`` and ``±Infinity`` by Debezium's names."""
    return _DECIMAL_NAMES[str(value)] if not value.is_finite() else format(value, "f")


def same_nan(value: Any) -> Any:
    """A float with NaN made equal to NaN, for comparing (``decimal.handling.mode=double`` sends NaN)."""
    return "NaN" if isinstance(value, float) and value != value else value


def binary_text(mode: str) -> Convert:
    """Bytes as ``binary.handling.mode`` ``mode`` (``hex``, ``base64``, ``base64-url-safe``) sends them."""
    if mode == "hex":
        return lambda b: bytes(b).hex()
    encode = base64.urlsafe_b64encode if mode == "base64-url-safe" else base64.b64encode
    return lambda b: encode(bytes(b)).decode()


def to_millis(value: Any) -> Any:
    """Microseconds, or a timestamp, down to the millisecond before them (``time.precision.mode=connect``)."""
    if isinstance(value, int):
        return value - value % 1000
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


class NotRepresentable(ValueError):
    """A source value the engine's column type cannot hold; the message says what becomes of it."""


#: microseconds in a day
_DAY_MICROS: Final = 86_400_000_000


def zoned_time(utc_micros: int) -> str:
    """A ``timetz`` as Debezium's ``ZonedTime`` text, from its microseconds past midnight UTC (which may
    lie before or beyond that day, as PostgreSQL's ``extract(epoch ...)`` gives them): the time of day
    in UTC, ``HH:MM:SS[.f]Z``."""
    micros = utc_micros % _DAY_MICROS
    whole = micros // 1_000_000
    text = f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"
    if micros % 1_000_000:
        text += "." + f"{micros % 1_000_000:06d}".rstrip("0")
    return text + "Z"


def geometry_json(wkb: bytes, srid: int | None, point: tuple[float, float] | None = None) -> str:
    """Debezium's ``Geometry`` struct (its WKB and SRID), or its ``Point`` struct (with the point's
    coordinates too), as the engine writes a struct: JSON text, the WKB in base64."""
    value: dict[str, Any] = {"wkb": base64.b64encode(wkb).decode(), "srid": srid}
    if point is not None:
        value["x"], value["y"] = point
    return json.dumps(value)


def parse_json(text: Any) -> Any:
    """JSON text parsed (numbers as ``Decimal``), or the text itself if it is not JSON."""
    if not isinstance(text, str):
        return text
    try:
        return _Frozen.of(json.loads(text, parse_float=Decimal))
    except ValueError:
        return text


class _Frozen:
    """Parsed JSON compared by value: an object's key order does not matter, numbers compare exactly."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    @classmethod
    def of(cls, value: Any) -> _Frozen:
        return cls(value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Frozen) and _json_equal(self.value, other.value)

    def __hash__(self) -> int:
        return hash(json.dumps(self.value, sort_keys=True, default=str))

    def __repr__(self) -> str:
        return json.dumps(self.value, sort_keys=True, ensure_ascii=False, default=str)


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | Decimal) and isinstance(b, int | Decimal):
        return Decimal(a) == Decimal(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
