"""The hostile-input corpus: every kind of bad message we know of, and hostile-but-legal ones.

Each :class:`Bad` message is produced into a topic between good ones and must end in quarantine
with a reason containing ``reason``; tables in :data:`AVRO_STOPPERS` / :data:`JSON_STOPPERS` get input
that must stop *that table* with a named error (a schema-level problem no single message can be
blamed for); the ``*legal`` tables get hostile-but-legal names and keys that must be applied exactly.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import fastavro

from ingest.decode.registry import EmbeddedSchemaRegistry, frame
from ingest.source.topiclog import ProducerRecord, TopicLog
from tests.decode.fixtures import cfield, pg_source
from tests.decode.fixtures import envelope_schema as json_envelope
from tests.decode.fixtures import key_schema as json_key

TS = 1_700_000_000_000
BIG = 50 * 1024 * 1024  # the 50 MB value
EPOCH = dt.date(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class Bad:
    """A message that must be quarantined with a reason containing ``reason``."""

    kind: str
    key: bytes | None
    value: bytes | None
    reason: str
    row_key: str | None = '{"id": 2}'  # how the quarantine names its row: from the Kafka key, where it decodes


@dataclass(slots=True)
class Topic:
    """Messages for one topic (partition 0) and the rows the table must end with."""

    name: str
    records: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)  # (kind, key, value)
    expected: dict[Any, dict[str, Any]] = field(default_factory=dict)
    bad: dict[int, Bad] = field(default_factory=dict)  # offset -> bad message

    def good(self, key: bytes | None, value: bytes, row: dict[str, Any] | None, key_value: Any) -> None:
        self.records.append(("good", key, value))
        if row is None:
            self.expected.pop(key_value, None)
        else:
            self.expected[key_value] = row

    def add_bad(self, bad: Bad) -> None:
        self.bad[len(self.records)] = bad
        self.records.append((bad.kind, bad.key, bad.value))

    def produce(self, log: TopicLog) -> None:
        log.create_topic(self.name, 1)
        log.append(self.name, [ProducerRecord(0, k, v, TS) for _, k, v in self.records])


# -- Avro -------------------------------------------------------------------------------------------
def _decimal_field(name: str) -> dict[str, Any]:
    return {"name": name, "default": None, "type": ["null", {
        "type": "bytes", "scale": 2, "precision": 10, "connect.version": 1, "logicalType": "decimal",
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "connect.name": "org.apache.kafka.connect.data.Decimal"}]}


ITEM_FIELDS: list[dict[str, Any]] = [
    {"name": "id", "type": "int"},
    {"name": "name", "type": ["null", "string"], "default": None},
    _decimal_field("amount"),
    {"name": "born", "default": None, "type": ["null", {
        "type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date", "logicalType": "date"}]},
    {"name": "seen", "default": None, "type": ["null", {
        "type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}]},
]


def envelope_schema(ns: str, value_fields: list[dict[str, Any]], *, op_type: Any = "string") -> dict[str, Any]:
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
        {"name": "connector", "type": "string"}, {"name": "lsn", "type": ["null", "long"], "default": None},
        {"name": "sequence", "type": ["null", "string"], "default": None}, {"name": "ts_ms", "type": "long"}]}
    value = {"type": "record", "name": "Value", "namespace": ns, "fields": value_fields}
    return {"type": "record", "name": "Envelope", "namespace": ns, "connect.name": f"{ns}.Envelope", "fields": [
        {"name": "before", "type": ["null", value], "default": None},
        {"name": "after", "type": ["null", f"{ns}.Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": op_type},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def _plain(schema: Any) -> Any:
    """The schema without logical types, so fastavro writes the raw wire values we give it."""
    if isinstance(schema, list):
        return [_plain(s) for s in schema]
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def _avro(schema: Any, datum: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(_plain(schema)), datum)
    return buf.getvalue()


def unscaled(value: int) -> bytes:
    return value.to_bytes((value.bit_length() + 8) // 8 or 1, "big", signed=True)


class AvroTable:
    """Debezium-through-AvroConverter messages of one table, schemas in the embedded registry."""

    def __init__(self, registry: EmbeddedSchemaRegistry, topic: str, fields: list[dict[str, Any]],
                 key_type: Any = "int", *, op_type: Any = "string", subject_suffix: str = "") -> None:
        self.topic = topic
        ns = topic.replace("-", "_")
        self.schema = envelope_schema(ns, fields, op_type=op_type)
        self.key_schema = {"type": "record", "name": "Key", "namespace": ns,
                           "fields": [{"name": "id", "type": key_type}]}
        self.value_id = registry.register(f"{topic}-value{subject_suffix}", self.schema)
        self.key_id = registry.register(f"{topic}-key{subject_suffix}", self.key_schema)

    def key(self, id_: Any) -> bytes:
        return frame(self.key_id, _avro(self.key_schema, {"id": id_}))

    def value(self, op: Any, row: dict[str, Any] | None, lsn: int, *, sequence: str | None = None,
              before: dict[str, Any] | None = None) -> bytes:
        datum = {"before": before, "after": row, "op": op, "ts_ms": TS,
                 "source": {"connector": "postgresql", "lsn": lsn, "ts_ms": TS,
                            "sequence": sequence if sequence is not None else json.dumps([str(lsn - 1), str(lsn)])}}
        return frame(self.value_id, _avro(self.schema, datum))


def item(id_: int, name: str | None = "x", amount: int = 1234, born: int = 19000, seen: int = 1_700_000_000_000_000
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """An ``items`` row on the wire, and as the target table must hold it."""
    wire = {"id": id_, "name": name, "amount": unscaled(amount), "born": born, "seen": seen}
    try:
        target = {"id": id_, "name": name, "amount": Decimal(amount).scaleb(-2),
                  "born": EPOCH + dt.timedelta(days=born),
                  "seen": dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=seen)}
    except OverflowError:
        target = {}  # out of range on purpose: never expected in a table
    return wire, target


def avro_corpus(registry: EmbeddedSchemaRegistry) -> tuple[Topic, Topic, dict[str, Topic]]:
    """``(healthy, hostile, stoppers)`` topics for a run with ``value_format: avro``."""
    healthy, hostile = Topic("good.items"), Topic("bad.items")
    good_items = AvroTable(registry, healthy.name, ITEM_FIELDS)
    for i in range(1, 31):
        wire, target = item(i, f"healthy {i}")
        healthy.good(good_items.key(i), good_items.value("c", wire, 100 + i), target, i)

    t = AvroTable(registry, hostile.name, ITEM_FIELDS)
    lsn = iter(range(1000, 100_000))

    def good(i: int, **kw: Any) -> bytes:
        wire, target = item(i, **kw)
        value = t.value("c", wire, next(lsn))
        hostile.good(t.key(i), value, target, i)
        return value

    ok = good(1)
    bads = [
        Bad("wrong_magic", t.key(2), b"\x01" + ok[1:], "magic byte"),
        Bad("unknown_schema_id", t.key(2), frame(987_654, ok[5:]), "unknown schema id 987654"),
        Bad("truncated_avro", t.key(2), ok[: 5 + (len(ok) - 5) // 2], "truncated or corrupt payload"),
        Bad("trailing_bytes", t.key(2), ok + b"\x02\x04", "bytes left after the record"),
        Bad("empty_value", t.key(2), b"", "shorter than the 5-byte header"),
        Bad("too_short_for_header", t.key(2), b"\x00\x00", "shorter than the 5-byte header"),
        Bad("invalid_utf8", t.key(2),
            t.value("c", item(2, name="~~~~")[0], next(lsn)).replace(b"~~~~", b"\xff\xfe\xfd\xfc"),
            "UnicodeDecodeError"),
        Bad("unknown_op", t.key(2), t.value("x", item(2)[0], next(lsn)), "unknown op 'x'"),
        Bad("create_without_after", t.key(2), t.value("c", None, next(lsn)), "without an 'after' image"),
        Bad("bad_sequence", t.key(2), t.value("u", item(2)[0], next(lsn), sequence="not json"), "source.sequence"),
        Bad("decimal_overflow", t.key(2), t.value("c", item(2, amount=10**12)[0], next(lsn)), "decimal overflow"),
        Bad("timestamp_out_of_range", t.key(2), t.value("c", item(2, seen=2**62)[0], next(lsn)),
            "timestamp out of range"),
        Bad("date_out_of_range", t.key(2), t.value("c", item(2, born=2**31 - 1)[0], next(lsn)), "date out of range"),
        Bad("key_wrong_magic", b"\x07garbage", t.value("c", item(2)[0], next(lsn)), "key: confluent framing", None),
        Bad("key_missing", None, t.value("c", item(2)[0], next(lsn)), "no Kafka key", None),
    ]
    missing_op = AvroTable(registry, hostile.name, ITEM_FIELDS, op_type=["null", "string"], subject_suffix="-v2")
    bads.append(Bad("missing_op", t.key(2), missing_op.value(None, item(2)[0], next(lsn)), "missing 'op'"))
    null_key = AvroTable(registry, hostile.name, ITEM_FIELDS, key_type=["null", "int"], subject_suffix="-nullable")
    bads.append(Bad("null_primary_key", null_key.key(None), t.value("c", item(2)[0], next(lsn)),
                    "null primary key column 'id'", '{"id": null}'))
    string_id = registry.register("plain-string", {"type": "string"})
    bads.append(Bad("not_a_record_schema", t.key(2), frame(string_id, _avro("string", "hello")), "not a record schema"))
    bads += _hostile_schemas(registry, t)
    for n, bad in enumerate(bads):
        hostile.add_bad(bad)
        good(10 + n)  # good rows keep flowing between the bad ones
    good(100, name="y" * BIG)  # a 50 MB value is applied, not lost and not a crash
    return healthy, hostile, _avro_stoppers(registry)


def _hostile_schemas(registry: EmbeddedSchemaRegistry, t: AvroTable) -> list[Bad]:
    """Schemas that would crash or exhaust a naive reader: recursive, very deep, exponentially large."""
    out = []
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    recursive = envelope_schema("rec", [{"name": "id", "type": "int"}, {"name": "n", "type": ["null", node]}])
    rid = registry.register("recursive-value", recursive)
    # after = Value(id=2, n=Node(Node(Node(...)))) 200k levels deep: fastavro would recurse on the C stack.
    depth = 200_000
    payload = b"\x00" + b"\x02" + b"\x04" + b"\x02" + b"\x02" * depth + b"\x00"
    out.append(Bad("recursive_schema", t.key(2), frame(rid, payload + b"\x00" * 8), "is recursive"))
    deep: Any = "int"
    for i in range(70):
        deep = {"type": "record", "name": f"D{i}", "fields": [{"name": "x", "type": deep}]}
    did = registry.register("deep-value", envelope_schema("deep", [{"name": "id", "type": "int"},
                                                                    {"name": "d", "type": deep}]))
    out.append(Bad("deep_schema", t.key(2), frame(did, b"\x00\x02\x04\x02"), "nests deeper than"))
    # B39 expands to 2^39 empty records: zero bytes on the wire, unbounded memory when read.
    nested: dict[str, Any] = {"type": "record", "name": "B0", "fields": []}
    for i in range(1, 40):
        nested = {"type": "record", "name": f"B{i}", "fields": [{"name": "l", "type": nested},
                                                                  {"name": "r", "type": f"B{i - 1}"}]}
    bid = registry.register("bomb-value", envelope_schema("bomb", [{"name": "id", "type": "int"},
                                                                    {"name": "b", "type": nested}]))
    out.append(Bad("schema_bomb", t.key(2), frame(bid, b"\x00\x02\x04"), "expands to more than"))
    return out


def _avro_stoppers(registry: EmbeddedSchemaRegistry) -> dict[str, Topic]:
    """Input that must stop its table with a named error: key type changed, reserved and case-colliding names."""
    out = {}
    keytype = Topic("stop.keytype")
    v1 = AvroTable(registry, keytype.name, ITEM_FIELDS)
    keytype.good(v1.key(1), v1.value("c", item(1)[0], 10), None, 1)
    v2_fields = [{"name": "id", "type": "string"}, *ITEM_FIELDS[1:]]
    v2 = AvroTable(registry, keytype.name, v2_fields, key_type="string", subject_suffix="-v2")
    keytype.good(v2.key("abc"), v2.value("u", {**item(1)[0], "id": "abc"}, 20), None, "abc")
    out["keytype"] = keytype
    reserved = Topic("stop.reserved")
    r = AvroTable(registry, reserved.name,
                  [*ITEM_FIELDS, {"name": "_cdc_op", "type": ["null", "string"], "default": None}])
    reserved.good(r.key(1), r.value("c", {**item(1)[0], "_cdc_op": "zz"}, 10), None, 1)
    out["reserved"] = reserved
    case = Topic("stop.case")
    c = AvroTable(registry, case.name, [*ITEM_FIELDS, {"name": "Name", "type": ["null", "string"], "default": None}])
    case.good(c.key(1), c.value("c", {**item(1)[0], "Name": "other"}, 10), None, 1)
    out["casecollide"] = case
    return out


#: Table -> (error class, substrings its error must contain).
AVRO_STOPPERS = {
    "keytype": ("SchemaIncompatibleError", ("'id'", "integer", "string")),
    "reserved": ("TableError", ("'_cdc_op'", "reserved prefix")),
    "casecollide": ("TableError", ("'name'", "'Name'", "differ only in case")),
}


# -- JSON (JsonConverter) ---------------------------------------------------------------------------
JSON_ITEM_FIELDS = [
    cfield("id", "int32", optional=False),
    cfield("name", "string"),
    cfield("amount", "bytes", name="org.apache.kafka.connect.data.Decimal",
           parameters={"scale": "2", "connect.decimal.precision": "10"}),
    cfield("at", "string", name="io.debezium.time.ZonedTimestamp"),
]


class JsonTable:
    """Debezium-through-JsonConverter messages (``schemas.enable=true``) of one table."""

    def __init__(self, topic: str, fields: list[dict[str, Any]],
                 key_fields: list[dict[str, Any]] | None = None) -> None:
        self.topic = topic
        self.schema = json_envelope(fields, topic=topic)
        self.key_schema = json_key(key_fields or [cfield("id", "int32", optional=False)], topic=topic)

    def key(self, **values: Any) -> bytes:
        return json.dumps({"schema": self.key_schema, "payload": values}).encode()

    def value(self, op: Any, row: dict[str, Any] | None, lsn: Any, *, before: dict[str, Any] | None = None,
              drop: tuple[str, ...] = (), schema: dict[str, Any] | None = None) -> bytes:
        payload = {"before": before, "after": row, "source": pg_source(lsn=lsn, committed=None), "op": op,
                   "ts_ms": TS}
        for name in drop:
            payload.pop(name)
        return json.dumps({"schema": schema or self.schema, "payload": payload}).encode()


def json_item(id_: int, name: str = "x", amount: str = "AQI=", at: str = "2024-01-02T03:04:05Z"
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    wire = {"id": id_, "name": name, "amount": amount, "at": at}
    unscaled_ = int.from_bytes(base64.b64decode(amount), "big", signed=True)
    target = {"id": id_, "name": name, "amount": Decimal(unscaled_).scaleb(-2),
              "at": dt.datetime.fromisoformat(at).astimezone(dt.UTC)}
    return wire, target


def json_corpus() -> tuple[Topic, Topic, Topic, Topic, dict[str, Topic]]:
    """``(healthy, hostile, legal names, hostile keys, stoppers)`` for ``value_format: json``."""
    healthy, hostile = Topic("good.jitems"), Topic("bad.jitems")
    g = JsonTable(healthy.name, JSON_ITEM_FIELDS)
    for i in range(1, 21):
        wire, target = json_item(i, f"healthy {i}")
        healthy.good(g.key(id=i), g.value("c", wire, 100 + i), target, i)

    t = JsonTable(hostile.name, JSON_ITEM_FIELDS)
    lsn = iter(range(1000, 100_000))

    def good(i: int) -> bytes:
        wire, target = json_item(i)
        value = t.value("c", wire, next(lsn))
        hostile.good(t.key(id=i), value, target, i)
        return value

    ok = good(1)
    k2 = t.key(id=2)
    w2 = json_item(2)[0]
    unknown_type = json_envelope([*JSON_ITEM_FIELDS, cfield("huge", "int128")], topic=hostile.name)
    bads = [
        Bad("malformed_json", k2, ok[: len(ok) // 2], "invalid JSON"),
        Bad("empty_value", k2, b"", "invalid JSON"),
        Bad("invalid_utf8", k2, ok.replace(b'"x"', b'"\xff\xfe"'), "UTF-8"),
        Bad("deeply_nested", k2, b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
        Bad("value_is_array", k2, b"[1, 2, 3]", "not a record"),
        Bad("value_is_string", k2, b'"hello"', "not a record"),
        Bad("missing_op", k2, t.value(None, w2, next(lsn), drop=("op",)), "missing 'op'"),
        Bad("unknown_op", k2, t.value("z", w2, next(lsn)), "unknown op 'z'"),
        Bad("int_out_of_range", k2, t.value("c", {**w2, "id": 2**40}, next(lsn)), "expected int32"),
        Bad("wrong_type", k2, t.value("c", {**w2, "name": 17}, next(lsn)), "expected a string"),
        Bad("unknown_connect_type", k2, t.value("c", w2, next(lsn), schema=unknown_type), "unknown Connect type"),
        Bad("bad_base64_decimal", k2, t.value("c", {**w2, "amount": "!!notbase64!!"}, next(lsn)), "invalid base64"),
        Bad("decimal_overflow", k2, t.value("c", {**w2, "amount": _b64(unscaled(10**15))}, next(lsn)),
            "decimal overflow"),
        Bad("zoned_timestamp_garbage", k2, t.value("c", {**w2, "at": "99999-99-99T99:99:99Z"}, next(lsn)),
            "timestamp out of range or malformed"),
        Bad("bad_lsn", k2, t.value("c", w2, "not-a-number"), "lsn"),
        Bad("null_primary_key", t.key(id=None), t.value("c", {**w2, "id": None}, next(lsn)), "null primary key",
            '{"id": null}'),
        Bad("key_not_json", b"\x00\x01garbage", t.value("c", w2, next(lsn)), "key", None),
    ]
    for n, bad in enumerate(bads):
        hostile.add_bad(bad)
        good(10 + n)
    return healthy, hostile, _json_legal_names(), _json_hostile_keys(), {"ctrlname": _json_ctrl_name()}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


#: Column names that are hostile to SQL and paths but legal: they must be applied as they are.
HOSTILE_COLUMNS = ('a"b', "c'd", "x; DROP TABLE jlegal; --", "first name", "naïve ☃", "../../etc/passwd", "`tick`")


def _json_legal_names() -> Topic:
    topic = Topic("legal.names")
    fields = [cfield("id", "int32", optional=False)] + [cfield(c, "string") for c in HOSTILE_COLUMNS]
    t = JsonTable(topic.name, fields)
    for i in range(1, 4):
        row = {"id": i, **{c: f"{c}={i}'; --" for c in HOSTILE_COLUMNS}}
        topic.good(t.key(id=i), t.value("c", row, 10 + i), row, i)
    row = {"id": 2, **{c: "updated \\" for c in HOSTILE_COLUMNS}}
    topic.good(t.key(id=2), t.value("u", row, 20), row, 2)
    return topic


#: String primary keys with quotes, SQL, backslashes, NUL and unicode: updated and deleted by key.
HOSTILE_KEYS = ("O'Brien\\", "'; DROP TABLE jkeys; --", '"quoted"', "nul\x00byte", "ünï☃", "%_*?", "")


def _json_hostile_keys() -> Topic:
    topic = Topic("legal.keys")
    fields = [cfield("code", "string", optional=False), cfield("v", "int64")]
    t = JsonTable(topic.name, fields, [cfield("code", "string", optional=False)])
    lsn = 10
    for code in HOSTILE_KEYS:
        lsn += 1
        topic.good(t.key(code=code), t.value("c", {"code": code, "v": 1}, lsn), {"code": code, "v": 1}, code)
    for code in HOSTILE_KEYS[:3]:
        lsn += 1
        topic.good(t.key(code=code), t.value("u", {"code": code, "v": 2}, lsn), {"code": code, "v": 2}, code)
    lsn += 1
    gone = HOSTILE_KEYS[1]
    topic.good(t.key(code=gone), t.value("d", None, lsn, before={"code": gone, "v": 2}), None, gone)
    return topic


def _json_ctrl_name() -> Topic:
    topic = Topic("stop.ctrlname")
    t = JsonTable(topic.name, [cfield("id", "int32", optional=False), cfield("bad\nname", "string")])
    topic.good(t.key(id=1), t.value("c", {"id": 1, "bad\nname": "v"}, 10), None, 1)
    return topic


JSON_STOPPERS = {"ctrlname": ("TableError", ("control characters",))}
