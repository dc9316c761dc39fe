"""Confluent-framed Avro values and keys, as Debezium's AvroConverter writes them.

Each schema id is fetched from the registry, parsed by fastavro and turned into a plan once; every
later message with that id costs one fastavro read plus the prepared column conversions.

Logical types are stripped from the schema fastavro reads with, so it always returns the raw wire
values (``bytes`` for decimals, ``int`` for dates and timestamps) and one code path converts them by
their Connect name. The plan is built from the unstripped schema, so an Avro ``logicalType`` still
decides the column type where no ``connect.name`` is given.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Final

import fastavro
from fastavro.schema import expand_schema

from ingest.decode.envelope import RecordKind, ValuePlan, classify, make_value_plan
from ingest.decode.registry import ConfluentSchemaRegistry, EmbeddedSchemaRegistry, SchemaRegistry, unframe
from ingest.decode.semantic import FieldPlan, as_key_field, convert_image, field_plan
from ingest.errors import DecodeError, SchemaRegistryError

_PRIMITIVES: Final = {
    "null": "null", "boolean": "boolean", "int": "int32", "long": "int64", "float": "float32",
    "double": "float64", "bytes": "bytes", "string": "string",
}
_COMPLEX: Final = {
    "record": "struct", "error": "struct", "enum": "string", "fixed": "bytes", "array": "array", "map": "map",
}
_MAX_CACHED: Final = 1024  # schema ids kept per codec; a registry rarely holds more for one job
# Debezium's schemas are a few levels deep and a few hundred nodes. Far beyond that a schema is
# hostile: fastavro's compiled reader recurses on the C stack (a recursive or very deep schema
# crashes the worker) and expanding named types can grow exponentially.
MAX_SCHEMA_DEPTH: Final = 64
MAX_SCHEMA_NODES: Final = 100_000


class AvroCodec:
    """Reads Confluent-framed Avro with plans cached per schema id.

    Args:
        registry: where schema ids are resolved.
    """

    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry
        self._values: dict[int, tuple[Any, ValuePlan]] = {}
        self._keys: dict[int, tuple[Any, tuple[FieldPlan, ...]]] = {}

    def read_value(self, message: bytes) -> tuple[dict[str, Any], ValuePlan]:
        """Decode a framed value into ``(record, plan)``.

        Raises:
            DecodeError: bad framing, unknown schema id, or a payload the schema cannot read.
        """
        schema_id, payload = unframe(message)
        entry = self._values.get(schema_id)
        if entry is None:
            entry = self._value_entry(schema_id)
            _remember(self._values, schema_id, entry)
        parsed, plan = entry
        return _read(payload, parsed, schema_id, "avro"), plan

    def read_key(self, message: bytes | None) -> dict[str, Any] | None:
        """Decode a framed key into ``{column: value}`` (``None`` for a message without key).

        Raises:
            DecodeError: as for values, with reasons prefixed ``key:``.
        """
        if message is None:
            return None
        try:
            schema_id, payload = unframe(message)
        except DecodeError as exc:
            raise DecodeError(f"key: {exc.reason}") from exc
        entry = self._keys.get(schema_id)
        if entry is None:
            entry = self._key_entry(schema_id)
            _remember(self._keys, schema_id, entry)
        parsed, fields = entry
        record = _read(payload, parsed, schema_id, "key: avro")
        values, _unavailable = convert_image(record, fields)
        return values

    def key_names(self, message: bytes | None) -> tuple[str, ...] | None:
        """The key's column names from its schema alone (cached per id); ``None`` if it cannot say."""
        if message is None or len(message) < 5 or message[0] != 0:
            return None
        schema_id = int.from_bytes(message[1:5], "big")
        entry = self._keys.get(schema_id)
        if entry is None:
            try:
                entry = self._key_entry(schema_id)
            except DecodeError:
                return None
            _remember(self._keys, schema_id, entry)
        if any(f.spec.nullable for f in entry[1]):
            return None  # a key that may be null is read message by message (a null key is refused)
        return tuple(f.name for f in entry[1])

    def _value_entry(self, schema_id: int) -> tuple[Any, ValuePlan]:
        schema, parsed = self._load(schema_id, "avro")
        kind, row, meta = _row_fields(schema, schema_id)
        return parsed, make_value_plan(kind, tuple(_field(f) for f in row), f"avro:{schema_id}", meta)

    def _key_entry(self, schema_id: int) -> tuple[Any, tuple[FieldPlan, ...]]:
        schema, parsed = self._load(schema_id, "key: avro")
        return parsed, tuple(as_key_field(_field(f)) for f in _record_fields(schema, schema_id, "key: avro"))

    def _load(self, schema_id: int, what: str) -> tuple[dict[str, Any], Any]:
        try:
            raw = self._registry.get_schema(schema_id)
        except SchemaRegistryError as exc:
            raise DecodeError(f"{what}: unknown schema id {schema_id}") from exc
        _check_shape(raw, schema_id, what)
        try:
            parsed = fastavro.parse_schema(_strip_logical_types(raw))
            expanded = expand_schema(raw)
        except Exception as exc:  # fastavro raises several unrelated types for a bad schema
            raise DecodeError(f"{what}: schema id {schema_id} is not a valid Avro schema: {exc}") from exc
        if not isinstance(expanded, dict):
            raise DecodeError(f"{what}: schema id {schema_id} is not a record schema")
        return expanded, parsed


def _read(payload: memoryview, parsed: Any, schema_id: int, what: str) -> dict[str, Any]:
    buffer = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(buffer, parsed, None)
    except Exception as exc:  # EOFError, ValueError, IndexError ...: all mean "not this schema's bytes"
        raise DecodeError(
            f"{what}: truncated or corrupt payload for schema id {schema_id}: {type(exc).__name__}: {exc}"
        ) from exc
    left = len(payload) - buffer.tell()
    if left:
        raise DecodeError(
            f"{what}: {left} bytes left after the record for schema id {schema_id} (wrong schema?)"
        )
    if not isinstance(record, dict):
        raise DecodeError(f"{what}: schema id {schema_id} does not describe a record")
    return record


def _remember(cache: dict[int, Any], schema_id: int, entry: Any) -> None:
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    cache[schema_id] = entry


def _record_fields(schema: Mapping[str, Any], schema_id: int, what: str) -> list[dict[str, Any]]:
    fields = schema.get("fields")
    if schema.get("type") not in ("record", "error") or not isinstance(fields, list):
        raise DecodeError(f"{what}: schema id {schema_id} is not a record schema")
    return fields


def row_columns(schema: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The names of the row columns a Debezium value schema carries, in its order: the envelope's
    ``after`` struct, or a flattened row without its ``__`` fields (``None``: its records carry no row).

    Raises:
        DecodeError: ``schema`` is not a record schema.
    """
    _check_shape(schema, 0, "avro")
    expanded = expand_schema(dict(schema))
    if not isinstance(expanded, dict):
        raise DecodeError("avro: not a record schema")
    kind, row, _ = _row_fields(expanded, 0)
    return tuple(f["name"] for f in row) if kind in ("envelope", "flattened") else None


def newest_row_columns(registry: ConfluentSchemaRegistry | EmbeddedSchemaRegistry, topic: str
                       ) -> tuple[str, ...] | None:
    """The row columns of the schema last registered under ``<topic>-value`` (``None``: none is).

    Raises:
        DecodeError: that schema is not a Debezium change's (a wrong topic).
        RegistryUnavailableError: the registry did not answer, or refused.
    """
    subject = f"{topic}-value"
    schema = registry.newest_schema(subject)
    if schema is None:
        return None
    try:
        found = row_columns(schema)
    except DecodeError:
        found = None
    if found is None:
        raise DecodeError(f"the newest schema under {subject} is not a Debezium change's")
    return found


def _row_fields(schema: Mapping[str, Any], schema_id: int) -> tuple[RecordKind, list[dict[str, Any]], tuple[str, ...]]:
    """What records of the (expanded) value ``schema`` are, the fields of their row and a flattened
    row's ``__`` metadata fields."""
    fields = _record_fields(schema, schema_id, "avro")
    names = [f["name"] for f in fields]
    kind = classify(names, schema.get("connect.name") or schema.get("name"))
    if kind == "envelope":
        by_name = {f["name"]: f for f in fields}
        struct = _image_record(by_name.get("after")) or _image_record(by_name.get("before"))
        return kind, list(struct["fields"]) if struct is not None else [], ()
    if kind == "flattened":
        meta = tuple(n for n in names if n.startswith("__"))
        return kind, [f for f in fields if f["name"] not in meta], meta
    return kind, [], ()


def _image_record(field: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The record type of an envelope's ``before``/``after`` field (a ``["null", record]`` union)."""
    if field is None:
        return None
    branches = field["type"] if isinstance(field["type"], list) else [field["type"]]
    for branch in branches:
        if isinstance(branch, dict) and branch.get("type") in ("record", "error"):
            return branch
    return None


def _field(field: Mapping[str, Any]) -> FieldPlan:
    return _describe(field["name"], field["type"], nullable=False, default=field.get("default"))


def _describe(name: str, avro_type: Any, *, nullable: bool, default: Any = None) -> FieldPlan:
    """Map an (expanded) Avro type to a Connect description and build the column plan.

    ``default`` is the field's Avro default; the Connect converters also keep a column's default
    on its type, as ``connect.default``, which is read when the field gives none.
    """
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        nullable = nullable or len(branches) < len(avro_type)
        if len(branches) != 1:  # not something Connect writes; keep the value, as JSON
            return field_plan(name, base="union", semantic=None, params={}, nullable=nullable, wire="avro")
        avro_type = branches[0]
    if isinstance(avro_type, str):
        base = _PRIMITIVES.get(avro_type, "null")
        return field_plan(name, base=base, semantic=None, params={}, nullable=nullable, wire="avro",
                          default=_avro_default(base, default))
    if default is None:
        default = avro_type.get("connect.default")
    inner = avro_type.get("type")
    if isinstance(inner, dict | list):  # {"type": {"type": ...}} nesting
        return _describe(name, inner, nullable=nullable, default=default)
    base = _COMPLEX.get(inner) or _PRIMITIVES.get(inner, "null")
    if base == "int32" and avro_type.get("connect.type") in ("int8", "int16"):
        base = avro_type["connect.type"]
    params = {str(k): v for k, v in (avro_type.get("connect.parameters") or {}).items()}
    logical = avro_type.get("logicalType")
    if logical == "decimal":
        params.setdefault("scale", avro_type.get("scale", 0))
        if "precision" in avro_type:
            params.setdefault("connect.decimal.precision", avro_type["precision"])
    semantic = avro_type.get("connect.name")
    if semantic is None and logical is not None:
        semantic = "org.apache.kafka.connect.data.Decimal" if logical == "decimal" else str(logical)
    if semantic is None and base == "struct":
        semantic = avro_type.get("name")
    items = _describe(name, avro_type["items"], nullable=True) if base == "array" and "items" in avro_type else None
    return field_plan(name, base=base, semantic=semantic, params=params, nullable=nullable, wire="avro",
                      default=_avro_default(base, default), items=items)


def _avro_default(base: str, default: Any) -> Any:
    """A default as its wire value: Avro's JSON writes a ``bytes`` default as a string of code points
    0-255 (Avro specification, "Complex Types", field defaults)."""
    if base == "bytes" and isinstance(default, str):
        try:
            return default.encode("latin-1")
        except UnicodeEncodeError:
            return None
    return default


def _strip_logical_types(schema: Any) -> Any:
    """Copy of ``schema`` without ``logicalType``, so fastavro returns raw wire values."""
    if isinstance(schema, list):
        return [_strip_logical_types(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "logicalType"}
    kind = out.get("type")
    if isinstance(kind, dict | list):
        out["type"] = _strip_logical_types(kind)
    elif kind in ("record", "error") and isinstance(out.get("fields"), list):
        out["fields"] = [{**f, "type": _strip_logical_types(f.get("type"))} if isinstance(f, dict) else f
                         for f in out["fields"]]
    elif kind == "array" and "items" in out:
        out["items"] = _strip_logical_types(out["items"])
    elif kind == "map" and "values" in out:
        out["values"] = _strip_logical_types(out["values"])
    return out


def _check_shape(schema: Any, schema_id: int, what: str) -> None:
    """Refuse recursive, very deep or explosively large schemas before fastavro sees them.

    Raises:
        DecodeError: the schema refers to itself, nests deeper than :data:`MAX_SCHEMA_DEPTH` or
            expands to more than :data:`MAX_SCHEMA_NODES` types.
    """
    sizes: dict[str, int] = {}  # named type -> expanded size (names defined so far)

    def visit(node: Any, depth: int, path: frozenset[str], namespace: str) -> int:
        if depth > MAX_SCHEMA_DEPTH:
            raise DecodeError(f"{what}: schema id {schema_id} nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, str):
            full = node if "." in node or not namespace else f"{namespace}.{node}"
            if node in path or full in path:
                raise DecodeError(f"{what}: schema id {schema_id} is recursive (type {node!r} contains itself)")
            return sizes.get(full, sizes.get(node, 1))
        if isinstance(node, list):
            return 1 + sum(visit(branch, depth + 1, path, namespace) for branch in node)
        if not isinstance(node, dict):
            return 1
        kind = node.get("type")
        name = node.get("name") if kind in ("record", "error", "enum", "fixed") else None
        if isinstance(name, str):
            declared = node.get("namespace")
            namespace = declared if isinstance(declared, str) else namespace
            full = name if "." in name or not namespace else f"{namespace}.{name}"
            path = path | {name, full}
        total = 1
        if kind in ("record", "error") and isinstance(node.get("fields"), list):
            for field in node["fields"]:
                if isinstance(field, dict):
                    total += visit(field.get("type"), depth + 1, path, namespace)
        elif kind == "array":
            total += visit(node.get("items"), depth + 1, path, namespace)
        elif kind == "map":
            total += visit(node.get("values"), depth + 1, path, namespace)
        elif isinstance(kind, dict | list):
            total += visit(kind, depth + 1, path, namespace)
        if total > MAX_SCHEMA_NODES:
            raise DecodeError(f"{what}: schema id {schema_id} expands to more than {MAX_SCHEMA_NODES} types")
        if isinstance(name, str):
            sizes[name] = sizes[full] = total
        return total

    visit(schema, 0, frozenset(), "")
