"""Plausible shop rows for the simulated database, drawn from a seeded ``random.Random``.

Values are in source (Python) types; see :mod:`harness.simulator.model`.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal
from typing import Final

from harness.simulator.model import (
    CUSTOMER_SEGMENTS,
    PRODUCT_CATEGORIES,
    UTC,
    Row,
)

_EPOCH: Final = dt.datetime(1970, 1, 1)
_FIRST: Final = ("Ada", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
                 "Kemi", "Luca", "Mira", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sven", "Tara")
_LAST: Final = ("Almeida", "Berg", "Chen", "Dubois", "Eze", "Fischer", "Garcia", "Haddad", "Ivanova",
                "Jensen", "Kowalski", "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov", "Rossi", "Silva")
_DOMAINS: Final = ("example.com", "mail.test", "shop.invalid", "corp.example")
_COUNTRIES: Final = ("US", "DE", "FR", "BR", "JP", "NG", "IN", "SE", None)
_ADJECTIVES: Final = ("Compact", "Deluxe", "Eco", "Heavy", "Mini", "Pro", "Rustic", "Smart", "Vintage")
_NOUNS: Final = ("Lamp", "Kettle", "Novel", "Drone", "Planter", "Puzzle", "Blender", "Atlas", "Shovel")
_WORDS: Final = ("order", "call", "prefers", "email", "delivery", "weekend", "invoice", "refund", "vip",
                 "address", "changed", "support", "ticket", "loyal", "discount", "asked", "about", "the",
                 "new", "catalog", "returned", "item", "late", "payment", "agreed", "plan")
LOYALTY_TIERS: Final = ("bronze", "silver", "gold", None)
#: Values the demo's expectations suites (expectations/*.json) reject, per table, used in turn.
QUALITY_VIOLATIONS: Final = {"customers": ("email",), "products": ("sku",), "orders": ("quantity", "status")}
#: Notes above this size are TOASTed by PostgreSQL (stored out of line, sent as a placeholder
#: when an update leaves them unchanged).
TOAST_THRESHOLD: Final = 2000


def naive(us: int) -> dt.datetime:
    """A ``timestamp without time zone`` from microseconds since the epoch."""
    return _EPOCH + dt.timedelta(microseconds=us)


def aware(us: int) -> dt.datetime:
    """A UTC ``timestamptz`` from microseconds since the epoch."""
    return naive(us).replace(tzinfo=UTC)


def _days_after(day: dt.date, days: int) -> dt.date:
    return day + dt.timedelta(days=days)


def money(rng: random.Random, low_cents: int, high_cents: int) -> Decimal:
    return Decimal(rng.randint(low_cents, high_cents)).scaleb(-2)


class RowFactory:
    """Makes and mutates rows; owns nothing but its random source and a text corpus."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # One corpus sliced at random offsets: large notes cost nothing to make.
        self._corpus = " ".join(rng.choice(_WORDS) for _ in range(4000))

    # -- building blocks ----------------------------------------------------------------------
    def notes(self) -> str | None:
        r = self.rng.random()
        if r < 0.4:
            return None
        length = self.rng.randint(40, 300) if r < 0.8 else self.rng.randint(TOAST_THRESHOLD, 8000)
        start = self.rng.randrange(len(self._corpus) - length)
        return self._corpus[start : start + length]

    def profile(self) -> str | None:
        if self.rng.random() < 0.3:
            return None
        doc = {
            "tags": self.rng.sample(["new", "vip", "b2b", "promo", "churn-risk"], self.rng.randint(0, 3)),
            "newsletter": self.rng.random() < 0.5,
            "visits": self.rng.randint(0, 500),
        }
        # jsonb prints keys ordered by length, then bytes, with ", " and ": " separators.
        return json.dumps(dict(sorted(doc.items(), key=lambda kv: (len(kv[0]), kv[0]))))

    def zoned(self, us: int) -> dt.datetime:
        # Some values land on whole seconds or centiseconds so every ISO fraction width appears.
        r = self.rng.random()
        if r < 0.1:
            us -= us % 1_000_000
        elif r < 0.2:
            us -= us % 10_000
        return aware(us)

    def birth_date(self) -> dt.date | None:
        if self.rng.random() < 0.2:
            return None
        return _days_after(dt.date(1950, 1, 1), self.rng.randrange(20000))

    def weight(self) -> Decimal | None:
        if self.rng.random() < 0.15:
            return None
        return Decimal(self.rng.randint(1, 500_000)).scaleb(-self.rng.randint(0, 4))

    # -- new rows -----------------------------------------------------------------------------
    def customer(self, cid: int, created_us: int, updated_us: int, *, loyalty: bool) -> Row:
        rng = self.rng
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        row: Row = {
            "id": cid,
            "email": f"{first.lower()}.{last.lower()}{cid}@{rng.choice(_DOMAINS)}",
            "full_name": f"{first} {last}",
            "segment": rng.choice(CUSTOMER_SEGMENTS),
            "country_code": rng.choice(_COUNTRIES),
            "birth_date": self.birth_date(),
            "balance": money(rng, -50_000, 5_000_000),
            "created_at": naive(created_us),
            "updated_at": self.zoned(updated_us),
            "profile": self.profile(),
            "notes": self.notes(),
        }
        if loyalty:
            row["loyalty_tier"] = rng.choice(LOYALTY_TIERS)
        return row

    def product(self, pid: int, created_us: int) -> Row:
        rng = self.rng
        return {
            "id": pid,
            "sku": f"SKU-{pid:06d}",
            "name": f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}",
            "category": rng.choice(PRODUCT_CATEGORIES),
            "price": money(rng, 99, 250_000),
            "weight_kg": self.weight(),
            "in_stock": rng.random() < 0.85,
            "created_at": naive(created_us),
        }

    def order(self, oid: int, customer_id: int, product: Row, ordered_us: int, *, settled: bool) -> Row:
        """A new order; ``settled`` lets snapshot rows start in any status."""
        rng = self.rng
        quantity = rng.randint(1, 20)
        status = rng.choice(("pending", "paid", "shipped", "cancelled")) if settled else "pending"
        ordered = naive(ordered_us)
        return {
            "id": oid,
            "customer_id": customer_id,
            "product_id": product["id"],
            "quantity": quantity,
            "unit_price": product["price"],
            "amount": product["price"] * quantity,
            "status": status,
            "ordered_at": ordered,
            "ship_date": _days_after(ordered.date(), rng.randint(1, 5)) if status == "shipped" else None,
            "note": rng.choice((None, None, "gift wrap", "leave at door", "call first")),
        }

    # -- updates (return a new dict; the old one stays valid as a before image) ---------------
    def update_customer(self, old: Row, now_us: int, *, loyalty: bool) -> Row:
        rng = self.rng
        new = dict(old)
        for field in rng.sample(("balance", "segment", "email", "country_code", "profile", "full_name",
                                 "birth_date"), rng.randint(1, 3)):
            if field == "balance":
                new["balance"] = old["balance"] + money(rng, -20_000, 20_000)
            elif field == "segment":
                new["segment"] = rng.choice(CUSTOMER_SEGMENTS)
            elif field == "email":
                new["email"] = f"{old['id']}.{rng.randrange(10**6)}@{rng.choice(_DOMAINS)}"
            elif field == "country_code":
                new["country_code"] = rng.choice(_COUNTRIES)
            elif field == "profile":
                new["profile"] = self.profile()
            elif field == "full_name":
                new["full_name"] = f"{rng.choice(_FIRST)} {old['full_name'].split(' ')[-1]}"
            else:
                new["birth_date"] = self.birth_date()
        if rng.random() < 0.1:
            new["notes"] = self.notes()
        if loyalty and rng.random() < 0.3:
            new["loyalty_tier"] = rng.choice(LOYALTY_TIERS)
        new["updated_at"] = self.zoned(now_us)
        return new

    def update_product(self, old: Row) -> Row:
        rng = self.rng
        new = dict(old)
        r = rng.random()
        if r < 0.5:
            new["price"] = money(rng, 99, 250_000)
        elif r < 0.8:
            new["in_stock"] = not old["in_stock"]
        else:
            new["weight_kg"] = self.weight()
        return new

    def update_order(self, old: Row, now_us: int) -> Row:
        rng = self.rng
        new = dict(old)
        status = old["status"]
        if status == "pending":
            r = rng.random()
            if r < 0.6:
                new["status"] = "paid"
            elif r < 0.75:
                new["status"] = "cancelled"
            else:
                new["quantity"] = rng.randint(1, 20)
                new["amount"] = old["unit_price"] * new["quantity"]
        elif status == "paid":
            if rng.random() < 0.85:
                new["status"] = "shipped"
                new["ship_date"] = naive(now_us).date()
            else:
                new["status"] = "cancelled"
        else:
            new["note"] = rng.choice(("returned", "complaint filed", "re-delivered", None))
        return new

    def ledger(self, lid: int, booked_us: int) -> Row:
        rng = self.rng
        return {"id": lid, "account": f"{rng.randrange(1000, 9999)}-{rng.choice(_LAST).lower()}",
                "amount": money(rng, -500_000, 500_000), "booked_at": self.zoned(booked_us),
                "memo": rng.choice((None, *_WORDS))}

    def update_ledger(self, old: Row, now_us: int) -> Row:
        new = dict(old)
        if self.rng.random() < 0.7:
            new["amount"] = money(self.rng, -500_000, 500_000)
            new["booked_at"] = self.zoned(now_us)
        else:
            new["memo"] = self.rng.choice((None, *_WORDS))
        return new


def violate(row: Row, kind: str) -> Row:
    """Write a value a suite rejects into ``row`` (in place): see :data:`QUALITY_VIOLATIONS`."""
    if kind == "email":
        row["email"] = row["email"].replace("@", " at ")
    elif kind == "sku":
        row["sku"] = row["sku"].lower()
    elif kind == "quantity":
        row["quantity"] = -abs(row["quantity"])
        row["amount"] = row["unit_price"] * row["quantity"]
    elif kind == "status":
        row["status"] = "lost"
    else:
        raise ValueError(f"unknown quality violation {kind!r}")
    return row
