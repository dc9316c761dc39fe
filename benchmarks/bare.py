"""The bare baseline: the same job in one process, without Spark (what a user could write instead).

Reads a table's topic from the embedded log in batches, decodes the Debezium envelopes itself
(``json`` for JsonConverter with schemas, ``fastavro`` with the embedded registry for Avro), builds
Arrow columns, keeps the latest change per key by source position, and applies each batch with one
guarded delta-rs MERGE: position guard, deletes remembered in memory against resurrection, the
truncate, unchanged-TOAST placeholders keeping the stored value, added and widened columns. No
quality gate, no quarantine, no audit, no crash safety: the bare minimum that still ends equal to
the source. The engine must be at least as fast end to end (``bench_compare.py``).

Only the position encoding (:class:`ingest.model.SourcePosition`) is shared with the engine, so
both write comparable ``_cdc_position`` text; every decode and apply step is this file's own.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from ingest.model import SourcePosition

MARKER = "__debezium_unavailable_value"
Convert = Callable[[list[Any]], pa.Array]


# -- column plans: Connect schema -> (Arrow type, converter over a column of wire values) -----------
def _decimal(scale: int, precision: int, wire: str) -> Convert:
    def convert(values: list[Any]) -> pa.Array:
        out = []
        for v in values:
            if v is None or v == MARKER:
                out.append(None)
                continue
            raw = base64.b64decode(v) if wire == "json" else v
            out.append(Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale))
        return pa.array(out, pa.decimal128(precision, scale))
    return convert


def _variable_decimal(values: list[Any]) -> pa.Array:
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        raw = base64.b64decode(v["value"]) if isinstance(v["value"], str) else v["value"]
        out.append(Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-v["scale"]).quantize(Decimal("1e-18")))
    return pa.array(out, pa.decimal128(38, 18))


def _cast(source: pa.DataType, target: pa.DataType) -> Convert:
    return lambda values: pa.array(values, source).cast(target)


def column_plan(base: str, semantic: str | None, params: dict[str, Any], wire: str) -> tuple[pa.DataType, Convert]:
    if semantic == "org.apache.kafka.connect.data.Decimal":
        precision = int(params.get("connect.decimal.precision", 38))
        scale = int(params.get("scale", 0))
        return pa.decimal128(precision, scale), _decimal(scale, precision, wire)
    if semantic == "io.debezium.data.VariableScaleDecimal":
        return pa.decimal128(38, 18), _variable_decimal
    if semantic == "io.debezium.time.MicroTimestamp":
        return pa.timestamp("us"), _cast(pa.int64(), pa.timestamp("us"))
    if semantic == "io.debezium.time.Timestamp":
        return pa.timestamp("us"), lambda v: pa.array(v, pa.int64()).cast(pa.timestamp("ms")).cast(pa.timestamp("us"))
    if semantic == "io.debezium.time.Date":
        return pa.date32(), _cast(pa.int32(), pa.date32())
    if semantic == "io.debezium.time.ZonedTimestamp":
        utc = pa.timestamp("us", tz="UTC")
        return utc, lambda v: pc.cast(pa.array([None if x == MARKER else x for x in v], pa.string()), utc)
    types = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
             "float32": pa.float32(), "float64": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}
    if base == "bytes":
        decode = (lambda x: base64.b64decode(x)) if wire == "json" else (lambda x: x)
        return pa.binary(), lambda v: pa.array([None if x is None else decode(x) for x in v], pa.binary())
    typ = types.get(base, pa.string())
    return typ, lambda v: pa.array(v, typ)


@dataclass
class ValuePlan:
    columns: list[tuple[str, pa.DataType, Convert]]


def json_plan(schema: dict[str, Any]) -> ValuePlan:
    after = next(f for f in schema["fields"] if f["field"] == "after")
    return ValuePlan([(f["field"], *column_plan(f["type"], f.get("name"), f.get("parameters") or {}, "json"))
                      for f in after["fields"]])


def _avro_field(field: dict[str, Any]) -> tuple[str, pa.DataType, Convert]:
    typ = field["type"]
    if isinstance(typ, list):
        typ = next(t for t in typ if t != "null")
    if isinstance(typ, str):
        base = {"int": "int32", "long": "int64", "float": "float32", "double": "float64", "boolean": "boolean",
                "string": "string", "bytes": "bytes"}[typ]
        return field["name"], *column_plan(base, None, {}, "avro")
    base = {"int": "int32", "long": "int64", "bytes": "bytes", "string": "string", "record": "struct",
            "enum": "string"}.get(typ["type"], "string")
    if base == "int32" and typ.get("connect.type") in ("int8", "int16"):
        base = typ["connect.type"]
    return field["name"], *column_plan(base, typ.get("connect.name"), typ.get("connect.parameters") or {}, "avro")


def avro_plan(schema: dict[str, Any]) -> ValuePlan:
    # The row record is defined in `before` and referenced by name in `after` (or the other way round).
    images = [f for f in schema["fields"] if f["name"] in ("before", "after")]
    record = next(t for f in images for t in f["type"] if isinstance(t, dict))
    return ValuePlan([_avro_field(f) for f in record["fields"]])


def _strip_logical(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strip_logical(s) for s in schema]
    if isinstance(schema, dict):
        out = {k: _strip_logical(v) for k, v in schema.items() if k != "logicalType"}
        return out
    return schema


# -- decode one batch into columns -----------------------------------------------------------------
class Decoder:
    """Messages -> (op, position, coordinates, image row) with plans cached per schema."""

    def __init__(self, value_format: str, registry_dir: Path | None) -> None:
        self.value_format = value_format
        self.registry_dir = registry_dir
        self._json: dict[bytes, ValuePlan] = {}
        self._avro: dict[int, tuple[Any, ValuePlan]] = {}

    def decode(self, value: bytes) -> tuple[dict[str, Any], ValuePlan]:
        if self.value_format == "json":
            cut = value.find(b',"payload":')
            head = value[:cut]
            plan = self._json.get(head)
            if plan is None:
                plan = self._json[head] = json_plan(json.loads(value)["schema"])
            return json.loads(value[cut + 11:-1]), plan
        schema_id = int.from_bytes(value[1:5], "big")
        entry = self._avro.get(schema_id)
        if entry is None:
            raw = json.loads((self.registry_dir / "ids" / f"{schema_id}.json").read_text())["schema"]  # type: ignore[operator]
            entry = self._avro[schema_id] = (fastavro.parse_schema(_strip_logical(raw)), avro_plan(raw))
        return fastavro.schemaless_reader(io.BytesIO(value[5:]), entry[0], None), entry[1]


def position(op: str, source: dict[str, Any]) -> str:
    sequence = source.get("sequence")
    committed = None
    if sequence:
        first = json.loads(sequence)[0]
        committed = int(first) if first is not None else None
    lsn = int(source["lsn"])
    return SourcePosition(lsn if committed is None else committed, lsn, 0, 0 if op == "r" else 1).encode()


# -- apply --------------------------------------------------------------------------------------------
@dataclass
class BareTable:
    """One target table and what the bare job remembers of it."""

    path: Path
    key: tuple[str, ...]
    #: position of the last change applied per key (deletes included: no resurrection)
    applied: dict[tuple[Any, ...], str] = field(default_factory=dict)
    truncated_at: str | None = None
    #: merge with delta-spark in this session instead of delta-rs (:class:`SparkMerge`)
    spark: Any = None

    def apply(self, decoder: Decoder, messages: list[tuple[int, int, bytes | None]]) -> None:
        rows: list[tuple[str, str, int, int, dict[str, Any]]] = []
        plans: dict[int, ValuePlan] = {}
        truncate: str | None = None
        for partition, offset, value in messages:
            if value is None:
                continue  # tombstone after a delete
            record, plan = decoder.decode(value)
            op = record["op"]
            pos = position(op, record["source"])
            if op == "t":
                truncate = max(truncate or "", pos)
                continue
            image = record["after"] if op != "d" else record["before"]
            plans[id(plan)] = plan
            rows.append((op, pos, partition, offset, image))
        if truncate and (self.truncated_at is None or truncate > self.truncated_at):
            self.truncated_at = truncate
        else:
            truncate = None
        # Latest change per key, by position (ties: the lowest coordinates).
        latest: dict[tuple[Any, ...], tuple[str, str, int, int, dict[str, Any]]] = {}
        history: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in sorted(rows, key=lambda r: (r[1], -r[2], -r[3])):
            k = tuple(row[4][c] for c in self.key)
            if self.truncated_at is not None and row[1] < self.truncated_at:
                continue
            if k in self.applied and row[1] <= self.applied[k]:
                continue  # stale: the table already holds this change or a newer one
            history.setdefault(k, []).append(row[4] if row[0] != "d" else {})
            latest[k] = row
        for k, (_op, pos, *_rest) in latest.items():
            self.applied[k] = pos
        columns: dict[str, tuple[pa.DataType, Convert]] = {}
        for plan in plans.values():
            for name, typ, convert in plan.columns:
                if name not in columns or (pa.types.is_integer(typ) and typ.bit_width > columns[name][0].bit_width):
                    columns[name] = (typ, convert)
        winners = list(latest.items())
        images = []
        for k, (_op, _pos, _p, _o, image) in winners:
            if any(v == MARKER for v in image.values()):  # fill a TOAST placeholder from earlier in the batch
                filled = dict(image)
                for earlier in reversed(history[k][:-1]):
                    if not earlier:
                        break
                    for c, v in image.items():
                        if v == MARKER and earlier.get(c) not in (None, MARKER) and filled[c] == MARKER:
                            filled[c] = earlier[c]
                image = filled
            images.append(image)
        data: dict[str, pa.Array] = {}
        for name, (_typ, convert) in columns.items():
            values = [img.get(name) for img in images]
            data["__toast_" + name] = pa.array([v == MARKER for v in values], pa.bool_())
            data[name] = convert([None if v == MARKER else v for v in values])
        data["_cdc_op"] = pa.array([w[1][0] for w in winners], pa.string())
        data["_cdc_position"] = pa.array([w[1][1] for w in winners], pa.string())
        data["_cdc_deleted"] = pa.array([w[1][0] == "d" for w in winners], pa.bool_())
        self._merge(pa.table(data), list(columns), truncate)

    def _merge(self, source: pa.Table, user: list[str], truncate: str | None) -> None:
        if self.spark is not None:
            return SparkMerge(self.spark, self.path, self.key).merge(source, user, truncate)
        table = _open(self.path)
        plain = source.select([c for c in source.column_names if not c.startswith("__toast_")])
        if table is None:
            write_deltalake(str(self.path), plain.filter(pc.invert(plain["_cdc_deleted"])))
            return
        stored = {f.name: f.type for f in pa.schema(table.schema().to_arrow())}
        wider = {c for c in user if c in stored and pa.types.is_integer(stored[c])
                 and source.schema.field(c).type.bit_width > stored[c].bit_width}
        if wider:  # a widened column: rewrite the table with the wider type first
            current = table.to_pyarrow_table()
            target = pa.schema([source.schema.field(f.name) if f.name in wider else f for f in current.schema])
            write_deltalake(table, current.cast(target), mode="overwrite", schema_mode="overwrite")
            table = DeltaTable(str(self.path))
        on = " AND ".join(f't."{k}" = s."{k}"' for k in self.key)
        sets = {f'"{c}"': f'CASE WHEN s."__toast_{c}" THEN t."{c}" ELSE s."{c}" END' if c in stored else f's."{c}"'
                for c in user}
        sets.update({c: f"s.{c}" for c in ("_cdc_op", "_cdc_position", "_cdc_deleted")})
        merger = (table.merge(source, on, source_alias="s", target_alias="t", merge_schema=True)
                  .when_matched_delete("s._cdc_deleted AND s._cdc_position > t._cdc_position")
                  .when_matched_update(sets, "NOT s._cdc_deleted AND s._cdc_position > t._cdc_position")
                  .when_not_matched_insert({f'"{c}"': f's."{c}"' for c in [*user, "_cdc_op", "_cdc_position",
                                                                             "_cdc_deleted"]}, "NOT s._cdc_deleted"))
        if truncate:
            merger = merger.when_not_matched_by_source_delete(f"t._cdc_position < '{truncate}'")
        merger.execute()


@dataclass
class SparkMerge:
    """The same MERGE with delta-spark (deletion vectors on), for a user who has Spark but not this
    framework: the source DataFrame made from the Arrow batch, new columns added first."""

    spark: Any
    path: Path
    key: tuple[str, ...]

    def merge(self, source: pa.Table, user: list[str], truncate: str | None) -> None:
        from delta.tables import DeltaTable as SparkTable
        from pyspark.sql.pandas.types import from_arrow_schema, from_arrow_type

        def frame(table: pa.Table) -> Any:
            return self.spark.createDataFrame(table, schema=from_arrow_schema(table.schema, prefer_timestamp_ntz=True))

        plain = source.select([c for c in source.column_names if not c.startswith("__toast_")])
        uri = self.path.resolve().as_uri()
        if not (self.path / "_delta_log").exists():
            (frame(plain.filter(pc.invert(plain["_cdc_deleted"]))).write.format("delta")
             .option("delta.enableDeletionVectors", "true").save(uri))
            return
        current = self.spark.read.format("delta").load(uri)
        stored = {f.name: f.dataType for f in current.schema.fields}
        wanted = {c: from_arrow_type(source.schema.field(c).type, prefer_timestamp_ntz=True) for c in user}
        new = [c for c in user if c not in stored]
        if new:
            self.spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS ("
                           + ", ".join(f"`{c}` {wanted[c].simpleString()}" for c in new) + ")")
        wider = [c for c in user if c in stored and stored[c] != wanted[c]]
        if wider:  # a widened column: rewrite the table with the wider type first
            (current.select([current[f"`{c}`"].cast(wanted[c]).alias(c) if c in wider else current[f"`{c}`"]
                             for c in current.columns])
             .write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(uri))
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.key)
        sets = {f"`{c}`": f"CASE WHEN s.`__toast_{c}` THEN t.`{c}` ELSE s.`{c}` END" for c in user}
        sets.update({c: f"s.{c}" for c in ("_cdc_op", "_cdc_position", "_cdc_deleted")})
        merger = (SparkTable.forPath(self.spark, uri).alias("t").merge(frame(source).alias("s"), on)
                  .whenMatchedDelete("s._cdc_deleted AND s._cdc_position > t._cdc_position")
                  .whenMatchedUpdate("NOT s._cdc_deleted AND s._cdc_position > t._cdc_position", sets)
                  .whenNotMatchedInsert("NOT s._cdc_deleted", {f"`{c}`": f"s.`{c}`" for c in
                                                               [*user, "_cdc_op", "_cdc_position", "_cdc_deleted"]}))
        if truncate:
            merger = merger.whenNotMatchedBySourceDelete(f"t._cdc_position < '{truncate}'")
        merger.execute()


def _open(path: Path) -> DeltaTable | None:
    try:
        return DeltaTable(str(path))
    except Exception:
        return None


def batches(log: Any, topic: str, size: int) -> Iterator[list[tuple[int, int, bytes | None]]]:
    """The topic in batches of ``size`` records, each partition's share in proportion, like Spark's limit."""
    ends = log.end_offsets(topic)
    start = dict.fromkeys(ends, 0)
    while any(start[p] < e for p, e in ends.items()):
        lag = {p: e - start[p] for p, e in ends.items()}
        total = sum(lag.values())
        batch: list[tuple[int, int, bytes | None]] = []
        for p in sorted(ends):
            take = lag[p] if total <= size else max(1 if lag[p] else 0, lag[p] * size // total)
            if take:
                chunk = log.read(topic, p, start[p], start[p] + take)
                batch += zip(chunk["partition"].to_pylist(), chunk["offset"].to_pylist(), chunk["value"].to_pylist(),
                             strict=True)
                start[p] += take
        yield batch


def run(tables: list[tuple[str, str, tuple[str, ...]]], *, log: Any, value_format: str, registry_dir: Path,
        root: Path, batch: int, spark: Any = None) -> list[float]:
    """Apply every table's topic; returns the seconds of each batch. ``spark``: MERGE with delta-spark
    in that session (:class:`SparkMerge`) instead of delta-rs."""
    decoder = Decoder(value_format, registry_dir)
    seconds = []
    for name, topic, key in tables:
        target = BareTable(root / name, key, spark=spark)
        chunks = batches(log, topic, batch)
        while True:
            t0 = time.perf_counter()  # reading the batch counts, as it does for the engine
            chunk = next(chunks, None)
            if chunk is None:
                break
            target.apply(decoder, chunk)
            seconds.append(time.perf_counter() - t0)
    return seconds


def main() -> None:
    """``bare.py --spark CONFIG``: the bare job with delta-spark's MERGE, in a process of its own (a JVM
    of its own, that no engine run warmed up); prints the batches' seconds as JSON. The session's
    start (the same local session and jars as the engine's) is not timed."""
    import argparse
    import sys

    from harness.demo import truth_dir
    from harness.simulator import Truth

    from ingest.config import SparkSpec, load_config
    from ingest.source.topiclog import TopicLog
    from ingest.spark.session import delta_session

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--spark", type=Path, required=True, help="the workload's configuration")
    parser.add_argument("--root", type=Path, required=True, help="where the tables go")
    parser.add_argument("--batch", type=int, required=True)
    args = parser.parse_args()
    config = load_config(args.spark)
    truth = Truth.load(truth_dir(config))
    spark = delta_session(SparkSpec(master=config.spark.master, shuffle_partitions=config.spark.shuffle_partitions))
    seconds = run([(t.name, t.topic, truth.key_columns[t.name]) for t in config.tables], log=TopicLog(config.log_dir),
                  value_format=config.source.value_format, registry_dir=config.registry_dir, root=args.root,
                  batch=args.batch, spark=spark)
    sys.stdout.write(json.dumps({"batches": seconds}) + "\n")


if __name__ == "__main__":
    main()
