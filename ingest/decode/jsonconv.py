"""Kafka Connect ``JsonConverter`` messages: ``{"schema": ..., "payload": ...}`` or a bare payload.

With ``schemas.enable=true`` every message repeats its schema, usually larger than the row itself.
Plans are cached by the schema's canonical JSON (its SHA-1 prefix is the ``schema_ref``). For the
compact layout JsonConverter writes (``{"schema":<schema>,"payload":<payload>}``) the raw schema text
is also remembered, so a repeat message is recognised by a substring lookup and only its payload is
parsed; any other layout takes the general path (parse everything, fingerprint the schema).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar

import orjson

from ingest.decode import columns
from ingest.decode.envelope import ValuePlan, classify, make_value_plan
from ingest.decode.semantic import FieldPlan, as_key_field, convert_image, field_plan, infer_image
from ingest.decode.values import Converter, ConvertError, b64decode
from ingest.errors import DecodeError

_HEAD: Final = '{"schema":'
_JOINT: Final = ',"payload":'
_HEAD_BYTES: Final = _HEAD.encode()
_JOINT_BYTES: Final = _JOINT.encode()
_DECODER: Final = json.JSONDecoder()
_MAX_CACHED: Final = 256  # distinct schemas kept; more than one job's topics ever need
_INT_BITS: Final = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}

_Plan = TypeVar("_Plan")


class JsonCodec:
    """Reads JsonConverter values and keys with plans cached per schema fingerprint."""

    def __init__(self) -> None:
        self._values: _PlanCache[ValuePlan] = _PlanCache(_value_plan, "value")
        self._keys: _PlanCache[tuple[FieldPlan, ...]] = _PlanCache(_key_plan, "key")

    def read_value(self, message: bytes) -> tuple[Any, ValuePlan | None]:
        """Decode a value into ``(payload, plan)``; ``plan`` is ``None`` when there is no schema.

        Raises:
            DecodeError: not UTF-8, not JSON, or a schema that is not a Connect struct.
        """
        return self._values.read(message, "json")

    def read_key(self, message: bytes | None) -> dict[str, Any] | None:
        """Decode a key into ``{column: value}`` (``None`` for a message without key).

        Raises:
            DecodeError: as for values, with reasons prefixed ``key: json:``.
        """
        if message is None:
            return None
        payload, fields = self._keys.read(message, "key: json")
        if payload is None:
            return None
        if not isinstance(payload, dict):
            raise DecodeError(f"key: json: key is a {type(payload).__name__}, not an object of key columns")
        if fields is None:
            values, _columns, _unavailable = infer_image(payload)
            return values
        values, _unavailable = convert_image(payload, fields)
        return values


    def key_names(self, message: bytes | None) -> tuple[str, ...] | None:
        """The key's column names from its schema alone (cached per schema text); ``None`` if it cannot say."""
        if message is None:
            return None
        fields = self._keys.known(message)
        if fields is None:
            try:
                self.read_key(message)  # parses and remembers the schema, or says what is wrong
            except DecodeError:
                return None
            fields = self._keys.known(message)
        if fields is None or any(f.spec.nullable for f in fields):
            return None  # a key that may be null is read message by message (a null key is refused)
        return tuple(f.name for f in fields)


class _PlanCache(Generic[_Plan]):
    """Parses wrapped messages and keeps one plan per distinct schema."""

    def __init__(self, build: Callable[[dict[str, Any], str, str], _Plan], noun: str) -> None:
        self._build = build
        self._noun = noun
        self._by_text: dict[bytes, _Plan] = {}  # raw schema bytes -> plan (compact-layout fast path)
        self._by_canonical: dict[str, _Plan] = {}  # canonical schema JSON -> plan
        self._last: tuple[bytes, _Plan | None] = (b"", None)  # the last known prefix, up to the payload

    def _prefix(self, message: bytes) -> tuple[_Plan | None, int]:
        """The plan of a compact-layout message whose schema text was seen before, and where its payload starts."""
        # Consecutive messages usually share a schema: one memcmp against the last prefix.
        last, plan = self._last
        if plan is not None and message.startswith(last):
            return plan, len(last)
        if not message.startswith(_HEAD_BYTES):
            return None, 0
        joint = message.find(_JOINT_BYTES, len(_HEAD_BYTES))
        plan = self._by_text.get(message[len(_HEAD_BYTES):joint]) if joint > 0 else None
        if plan is None:
            return None, 0
        start = joint + len(_JOINT_BYTES)
        self._last = (message[:start], plan)
        return plan, start

    def known(self, message: bytes) -> _Plan | None:
        """The plan of a compact-layout message whose schema text was seen before, without parsing it."""
        return self._prefix(message)[0]

    def read(self, message: bytes, what: str) -> tuple[Any, _Plan | None]:
        plan, start = self._prefix(message)
        if plan is not None:
            # The schema text is one already parsed in full, so the payload is all that is left;
            # orjson reads (and checks the UTF-8 of) just those bytes.
            end = len(message.rstrip())
            if message[end - 1:end] == b"}":
                try:
                    return orjson.loads(memoryview(message)[start:end - 1]), plan
                except orjson.JSONDecodeError:
                    pass  # the general path below reports the error with its position
        try:
            text = str(message, "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{what}: {self._noun} is not valid UTF-8 (byte {exc.start})"
                              f"{_if_framed(message)}") from exc
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise DecodeError(f"{what}: invalid JSON at {where}: {exc.msg}{_if_framed(message)}") from exc
        wrapped = isinstance(document, dict) and len(document) == 2 and "schema" in document
        if not (wrapped and "payload" in document):
            return document, None
        schema, payload = document["schema"], document["payload"]
        if schema is None:
            return payload, None
        if not isinstance(schema, dict):
            raise DecodeError(f"{what}: 'schema' is a {type(schema).__name__}, not a Connect schema object")
        canonical = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        plan = self._by_canonical.get(canonical)
        if plan is None:
            ref = "json:" + hashlib.sha1(canonical.encode(), usedforsecurity=False).hexdigest()[:12]
            plan = self._build(schema, ref, what)
            _remember(self._by_canonical, canonical, plan)
        if text.startswith(_HEAD + "{"):  # compact layout only: raw_decode does not skip whitespace
            raw_schema, end = _DECODER.raw_decode(text, len(_HEAD))
            # Only a text that is exactly this schema may shortcut later messages (duplicate keys).
            if raw_schema == schema and text.startswith(_JOINT, end):
                _remember(self._by_text, text[len(_HEAD):end].encode(), plan)
        return payload, plan


def _remember(cache: dict[Any, Any], key: str | bytes, plan: Any) -> None:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[key] = plan


def _value_plan(schema: Mapping[str, Any], ref: str, what: str) -> ValuePlan:
    fields = _struct_fields(schema, what, "value")
    names = [f["field"] for f in fields]
    name = schema.get("name")
    kind = classify(names, name if isinstance(name, str) else None)
    image: tuple[FieldPlan, ...] = ()
    meta: tuple[str, ...] = ()
    if kind == "envelope":
        by_name = {f["field"]: f for f in fields}
        for side in ("after", "before"):
            struct = by_name.get(side)
            if struct is not None and struct.get("type") == "struct":
                image = tuple(_field(f, what) for f in _struct_fields(struct, what, f"'{side}'"))
                break
    elif kind == "flattened":
        image = tuple(_field(f, what) for f in fields if not f["field"].startswith("__"))
        meta = tuple(n for n in names if n.startswith("__"))
    return make_value_plan(kind, image, ref, meta)


def _key_plan(schema: Mapping[str, Any], _ref: str, what: str) -> tuple[FieldPlan, ...]:
    return tuple(as_key_field(_field(f, what)) for f in _struct_fields(schema, what, "key"))


def _struct_fields(schema: Mapping[str, Any], what: str, label: str) -> list[dict[str, Any]]:
    fields = schema.get("fields")
    if schema.get("type") != "struct" or not isinstance(fields, list):
        raise DecodeError(f"{what}: {label} schema is not a Connect struct (type {schema.get('type')!r})")
    for field in fields:
        if not isinstance(field, dict) or not isinstance(field.get("field"), str):
            raise DecodeError(f"{what}: {label} schema has a field without a 'field' name: {field!r}"[:300])
    return fields


#: JsonConverter's names of Connect types that differ from the type's own name (FLOAT32, FLOAT64).
_JSON_TYPE_NAMES: Final = {"float": "float32", "double": "float64"}


def _field(schema: Mapping[str, Any], what: str) -> FieldPlan:
    raw = schema.get("type")
    if not isinstance(raw, str):
        raise DecodeError(f"{what}: field {schema.get('field')!r} has no Connect type")
    base = _JSON_TYPE_NAMES.get(raw.lower(), raw.lower())
    semantic = schema.get("name")
    params = schema.get("parameters")
    items = schema.get("items") if base == "array" else None
    return field_plan(
        schema["field"],
        base=base,
        semantic=semantic if isinstance(semantic, str) else None,
        params=params if isinstance(params, dict) else {},
        nullable=schema.get("optional") is True,
        wire="json",
        check=_PRIMITIVE_CHECKS.get(base),
        default=schema.get("default"),
        items=_field({**items, "field": schema["field"]}, what) if isinstance(items, dict) else None,
    )


# JSON is loosely typed: values are checked against the schema here, so that a bad row is
# quarantined on its own instead of failing a whole Arrow batch later.

def _json_int(base: str) -> Converter:
    bits = _INT_BITS[base]
    low, high = -(1 << bits), (1 << bits) - 1

    def convert(value: Any) -> int:
        if type(value) is not int or not low <= value <= high:
            raise ConvertError(f"expected {base}, got {value!r}")
        return value

    return convert


def _json_float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    if value in _NON_FINITE:  # JsonConverter writes NaN and the infinities as strings
        return float(value)
    raise ConvertError(f"expected a number, got {value!r}")


_NON_FINITE: Final = frozenset({"NaN", "Infinity", "-Infinity"})


def _json_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise ConvertError(f"expected a boolean, got {value!r}")
    return value


def _json_str(value: Any) -> str:
    if type(value) is not str:
        raise ConvertError(f"expected a string, got {value!r}")
    return value


def _json_bytes(value: Any) -> bytes:
    if type(value) is not str:
        raise ConvertError(f"expected base64 text, got {value!r}")
    return b64decode(value)


_PRIMITIVE_CHECKS: Final[dict[str, Converter]] = {
    **{b: _json_int(b) for b in _INT_BITS},
    "float32": _json_float, "float64": _json_float, "boolean": _json_bool, "string": _json_str,
    "bytes": _json_bytes,
}
# Whole-column twins of the checks (ingest.decode.columns): Arrow refuses what does not fit.
for _base in _INT_BITS:
    columns.register(_PRIMITIVE_CHECKS[_base], columns.plain(int))
columns.register(_json_float, columns.number)
columns.register(_json_bool, columns.plain(bool))
columns.register(_json_str, columns.plain(str))


def _if_framed(message: bytes) -> str:
    """A hint for a message that is not JSON: a Confluent-framed one (Avro from a registry) starts with 0."""
    if message[:1] == b"\x00" and len(message) >= 5:
        return "; it starts like Avro in the Confluent framing: is source.value_format avro?"
    return ""
