"""Seeded row values for the ``shop`` schema, shared by the workload and the load generator.

Values are chosen to be awkward on purpose: non-ASCII and quote-laden text, empty arrays, JSON
with unicode and decimals, bytes with zeros, dates and timestamps before 1970, the last
microsecond of a day, negative and high-precision numerics, and large random text that PostgreSQL
stores out of line (TOAST) because it neither fits a page nor compresses.
"""

from __future__ import annotations

import json
import random
import re
import string
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Final

from psycopg.types.json import Jsonb

NAMES: Final = ("Ada Lovelace", "Zoë Ångström", "李雷", "O'Brien; DROP TABLE x", "Renée \"Q\" Müller",
                "Ñandú Pérez", "Grace Hopper", "Σωκράτης", "  padded  ", "Émile\tZola")
TAGS: Final = ("vip", "newsletter", "b2b", "ümlaut", "comma,inside", 'quote"inside', "", "emoji 🚀", "back\\slash")
STATUSES: Final = ("new", "paid", "shipped", "delivered")
SEGMENTS: Final = ("consumer", "smb", "enterprise", "öffentlich")
ZONES: Final = (UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)),
                timezone(timedelta(hours=14)))
_EPOCH_2015: Final = datetime(2015, 1, 1, tzinfo=UTC)
_DECIMAL_MARK: Final = "\x00decimal:"
_MARKED: Final = re.compile(r'"\\u0000decimal:(-?[0-9.]+)"')
#: Random text this long is stored out of line (TOAST) and sent by Debezium as a placeholder when an
#: update leaves it unchanged.
LARGE_TEXT_CHARS: Final = (9_000, 14_000)


def large_text(rng: random.Random) -> str:
    """Random letters, 9-14 kB: larger than a page and incompressible enough to be TOASTed."""
    alphabet = string.ascii_letters + string.digits + " äöüß€"
    return "".join(rng.choices(alphabet, k=rng.randint(*LARGE_TEXT_CHARS)))


def notes(rng: random.Random) -> str | None:
    """A customer's notes or a product's description: large (TOASTed), short, or null."""
    roll = rng.random()
    if roll < 0.35:
        return large_text(rng)
    if roll < 0.75:
        return rng.choice(("", "call before delivery", "prefers e-mail ✉", "Türklingel defekt", "a\nb"))
    return None


def money(rng: random.Random, low: int = 0, high: int = 10**7, *, negative: float = 0.0) -> Decimal:
    """A ``numeric(12,2)`` value; ``negative`` is the chance of a negative one."""
    value = Decimal(rng.randint(low, high)).scaleb(-2)
    return -value if rng.random() < negative else value


def plain_numeric(rng: random.Random) -> Decimal | None:
    """A plain ``numeric`` value of varying scale (0-18 digits), sometimes negative, huge or tiny."""
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return Decimal("123456789012345678.123456789012345678") * rng.choice((1, -1))
    if roll < 0.2:
        return Decimal("0.000000000000000001")
    return Decimal(rng.randint(-10**9, 10**12)).scaleb(-rng.randint(0, 8))


def instant(rng: random.Random, *, before_1970: float = 0.05) -> datetime:
    """A ``timestamptz`` value with microseconds, in one of several zones (stored as an instant)."""
    if rng.random() < before_1970:
        base = datetime(1901, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 2_000_000_000))
    else:
        base = _EPOCH_2015 + timedelta(seconds=rng.randint(0, 400_000_000))
    return (base + timedelta(microseconds=rng.randint(0, 999_999))).astimezone(rng.choice(ZONES))


def local_timestamp(rng: random.Random) -> datetime:
    """A ``timestamp`` (no zone) value, sometimes before 1970, with microseconds."""
    return instant(rng, before_1970=0.1).replace(tzinfo=None)


def day(rng: random.Random, first: date = date(1930, 1, 1), span_days: int = 30_000) -> date:
    """A ``date``; the default range starts well before 1970."""
    return first + timedelta(days=rng.randint(0, span_days))


def time_of_day(rng: random.Random) -> time:
    """A ``time``: often on the minute, sometimes midnight or the last microsecond of the day."""
    roll = rng.random()
    if roll < 0.1:
        return time(23, 59, 59, 999_999)
    if roll < 0.15:
        return time(0, 0)
    return time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), rng.choice((0, 500_000, 123_456)))


def json_doc(rng: random.Random) -> Jsonb | None:
    """A ``jsonb`` document with unicode, nesting, decimals, booleans and nulls, or null."""
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return Jsonb({})
    return Jsonb({
        "lang": rng.choice(("de", "fr", "zh", "ελ")),
        "score": Decimal(rng.randint(0, 1000)).scaleb(-2),
        "opt_in": rng.random() < 0.5,
        "nested": {"städte": [rng.choice(NAMES), None], "n": rng.randint(-5, 5)},
    }, dumps=json_text)


def json_text(value: Any) -> str:
    """JSON text in which ``Decimal`` values are numbers written exactly (``2.50``, not ``2.5``)."""
    text = json.dumps(value, ensure_ascii=False,
                      default=lambda v: _DECIMAL_MARK + str(v) if isinstance(v, Decimal) else str(v))
    return _MARKED.sub(r"\1", text)


def tag_list(rng: random.Random) -> list[str]:
    """A ``text[]`` value: empty, or a few tags (non-ASCII, commas, quotes, backslashes)."""
    return rng.sample(TAGS, rng.randint(0, 3))


def thumbnail(rng: random.Random) -> bytes | None:
    """A ``bytea`` value with zero bytes in it, empty, or null."""
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return b""
    return b"\x00" + rng.randbytes(rng.randint(0, 48)) + b"\x00\xff"


def customer_row(rng: random.Random, cid: int) -> dict[str, Any]:
    """All columns of a new ``customers`` row."""
    return {
        "id": cid,
        "email": f"user{cid}@example.com",
        "full_name": rng.choice(NAMES),
        "segment": rng.choice(SEGMENTS),
        "external_ref": uuid.UUID(int=rng.getrandbits(128), version=4),
        "credit_limit": None if rng.random() < 0.1 else money(rng, negative=0.05),
        "lifetime_value": plain_numeric(rng),
        "signed_up_at": instant(rng),
        "birth_date": None if rng.random() < 0.2 else day(rng),
        "preferences": json_doc(rng),
        "tags": tag_list(rng),
        "notes": notes(rng),
    }


def product_row(rng: random.Random, pid: int) -> dict[str, Any]:
    """All columns of a new ``products`` row."""
    return {
        "id": pid,
        "sku": f"SKU-{pid:05d}",
        "name": rng.choice(("Kaffeemühle", "Widget", "Teapot 🫖", "Chair", "Lamp")) + f" #{pid}",
        "price": money(rng, 1, 999_999),
        "weight_kg": plain_numeric(rng),
        "attributes": json_doc(rng),
        "thumbnail": thumbnail(rng),
        "available_from": None if rng.random() < 0.1 else day(rng, date(1965, 1, 1), 25_000),
        "restock_at": None if rng.random() < 0.1 else time_of_day(rng),
        "updated_local": local_timestamp(rng),
        "description": notes(rng),
    }


def order_row(rng: random.Random, oid: int, customer_id: int) -> dict[str, Any]:
    """All columns of a new ``orders`` row (its total is set once its items are known)."""
    return {
        "id": oid,
        "customer_id": customer_id,
        "status": "new",
        "ordered_at": instant(rng, before_1970=0.0),
        "total": Decimal("0.00"),
        "shipping_address": json_doc(rng),
        "coupon_code": rng.choice((None, None, "SAVE10", "WINTER-ÄÖÜ", "")),
        "tags": None if rng.random() < 0.3 else tag_list(rng),
    }


def item_row(rng: random.Random, order_id: int, line_no: int, product_id: int, price: Decimal, *,
             huge: bool = False) -> dict[str, Any]:
    """A new ``order_items`` row; ``huge`` quantities exceed a 32-bit integer (after the widening)."""
    quantity = rng.randint(2**31, 2**33) if huge else rng.randint(1, 20)
    discount = None if rng.random() < 0.5 else Decimal(rng.randint(0, 5000)).scaleb(-rng.randint(2, 6))
    return {"order_id": order_id, "line_no": line_no, "product_id": product_id, "quantity": quantity,
            "unit_price": price, "discount": discount}
