"""The event generator: a seeded shop workload, written to topics exactly as Debezium would.

The journey of one run (:func:`generate`):

1. **Snapshot.** The initial rows of customers, products and orders are read as ``op=r``, all at
   one snapshot LSN (``source.sequence`` is ``[null,"<lsn>"]``: no transaction has committed on
   the stream yet), ``source.snapshot`` ``first`` / ``true`` ... / ``last``.
2. **Streaming.** Transactions of one to five changes (inserts, updates, deletes across tables,
   orders only ever referencing live customers and products) in commit order. Each change carries
   ``sequence = ["<commit LSN of the previous transaction>","<lsn>"]``. Some pairs of transactions
   interleave in the WAL: the later-committing one wrote its first change before any change of
   the earlier one, so its ``lsn`` values are *lower* than those of a transaction that committed
   before it; half of those pairs touch the same row. (PostgreSQL's row locks would stop two
   transactions writing one row concurrently; we allow it to make ordering by ``lsn`` alone
   visibly wrong, which is the point of ordering by ``(lastCommittedLsn, lsn)``.)
3. Mid-stream, ``customers`` gains ``loyalty_tier`` (a new value schema) and ``orders`` is
   truncated (``op=t``, null key), after which orders are inserted again.
4. Deletes are followed by a tombstone; unchanged large ``notes`` on some customer updates
   arrive as the unchanged-TOAST placeholder; optional malformed messages are *added* beside
   real ones, never instead of them, so the truth stays exact.
5. Optionally, some streamed inserts and updates write values the demo's expectations suites
   reject (:data:`QUALITY_VIOLATIONS`: an e-mail without ``@``, a malformed SKU, a negative
   quantity, an unknown order status). The source really holds them, so the truth has them too;
   the ingested table differs exactly where the quality gate quarantined such a change.

Delivery (partitions, duplicates, skew) is :mod:`harness.simulator.delivery`'s job.
"""

from __future__ import annotations

import bisect
import datetime as dt
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Final

import pyarrow as pa

from harness.simulator.changes import SourceChanges
from harness.simulator.delivery import TopicWriter
from harness.simulator.encode import (
    DEBEZIUM_VERSION,
    MALFORMED_KINDS,
    Envelope,
    make_encoder,
    malformed_message,
    topic_name,
)
from harness.simulator.model import (
    LOYALTY_TIER,
    Key,
    Row,
    SourceDatabase,
    default_tables,
    ledger_table,
    truth_value,
)
from harness.simulator.rows import QUALITY_VIOLATIONS, RowFactory
from harness.simulator.spec import WorkloadSpec
from harness.simulator.truth import Truth
from harness.simulator.wal import Transaction, Wal
from ingest.decode.registry import SchemaRegistry
from ingest.errors import TopicLogError
from ingest.source.topiclog import TopicLog

DEBEZIUM_DB: Final = "shop"
INTERLEAVE_PROBABILITY: Final = 0.12
_T0_US: Final = int(dt.datetime(2024, 6, 3, 8, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000
_TWO_YEARS_US: Final = 2 * 365 * 86_400 * 1_000_000
_OP_COUNT: Final = {"r": "reads", "c": "creates", "u": "updates", "d": "deletes", "t": "truncates"}
_COUNT_KEYS: Final = ("reads", "creates", "updates", "deletes", "truncates", "tombstones",
                      "toast_placeholders", "duplicates", "malformed", "quality_violations", "records")
# (table, op, weight): orders dominate, as in a shop; deletes are rare.
_MIX: Final = (("orders", "c", 30), ("orders", "u", 22), ("orders", "d", 3), ("customers", "c", 6),
               ("customers", "u", 20), ("customers", "d", 2), ("products", "c", 2),
               ("products", "u", 8), ("products", "d", 1))
#: (share of the streamed budget, new type) of ``orders.quantity`` when ``widen_column`` is set.
_WIDENINGS: Final = ((0.45, "int32"), (0.8, "int64"))
#: Weights per extra ``ledger`` table; all extra tables together weigh about as much as the shop.
_LEDGER_MIX: Final = (("c", 2), ("u", 2), ("d", 1))


def _mix(extra: list[str]) -> tuple[tuple[tuple[str, str, float], ...], list[float]]:
    """The (table, op, weight) mix and its cumulative weights; the shop's alone without extras."""
    scale = sum(w for *_, w in _MIX) / (sum(w for _, w in _LEDGER_MIX) * len(extra)) if extra else 0.0
    mix = (*_MIX, *((t, op, w * scale) for t in extra for op, w in _LEDGER_MIX))
    return mix, [sum(w for *_, w in mix[: i + 1]) for i in range(len(mix))]


class _Workload:
    """One generation run: the source database, its WAL position and the topic writers."""

    def __init__(self, spec: WorkloadSpec, log: TopicLog, registry: SchemaRegistry) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.rows = RowFactory(random.Random(f"rows:{spec.seed}"))
        self.extra = [ledger_table(n) for n in range(1, spec.extra_tables + 1)]
        self.db = SourceDatabase({**default_tables(), **{t.name: t for t in self.extra}})
        self.mix, self.mix_cum = _mix([t.name for t in self.extra])
        self.encoder = make_encoder(spec.value_format, registry, spec.prefix)
        self.kinds = MALFORMED_KINDS[spec.value_format]
        self.counts = {t: Counter[str]() for t in self.db.tables}
        #: the shop's application: its row changes, applied to ``db`` in commit order
        self.shop = SourceChanges(spec, self.db, self.rng, self.rows, self.counts)
        self.topics = {t: topic_name(spec.prefix, t) for t in self.db.tables}
        self.writers: dict[str, TopicWriter] = {}
        self.malformed_due: dict[str, float] = {}
        for table, topic in self.topics.items():
            if log.exists(topic) and any(log.end_offsets(topic).values()):
                raise TopicLogError(f"topic {topic!r} already holds records; generate into an empty log")
            log.create_topic(topic, spec.partitions)
            delivery_rng = random.Random(f"delivery:{spec.seed}:{topic}")
            self.writers[table] = TopicWriter(
                log, topic, spec.partitions, delivery_rng,
                duplicate_fraction=spec.duplicate_fraction, reorder_fraction=spec.reorder_fraction,
            )
            # A random phase spreads malformed messages differently per topic.
            self.malformed_due[table] = delivery_rng.random()
        self.malformed_seq: Counter[str] = Counter()
        # Every change as the source made it, in source order: (op, source ts_ms, the row it left
        # or removed -- TOAST placeholders resolved), the truth of a table that keeps every version.
        self.history: dict[str, list[tuple[str, int, Row | None]]] = {t: [] for t in self.db.tables}
        self.now_us = _T0_US
        self.wal = Wal(self.rng, 0, 0)
        self.truncated = False
        self.widened = 0

    # -- sending ------------------------------------------------------------------------------
    def _source(self, table: str, ts_us: int, snapshot: str, last_commit: int | None, lsn: int,
                txid: int) -> dict[str, object]:
        last = "null" if last_commit is None else f'"{last_commit}"'
        return {
            "version": DEBEZIUM_VERSION, "connector": "postgresql", "name": self.spec.prefix,
            "ts_ms": ts_us // 1000, "snapshot": snapshot, "db": DEBEZIUM_DB,
            "sequence": f'[{last},"{lsn}"]', "ts_us": ts_us, "ts_ns": ts_us * 1000,
            "schema": "public", "table": table, "txId": txid, "lsn": lsn, "xmin": None,
        }

    def _send(self, table: str, key: Key | None, envelope: Envelope, row: Row | None) -> None:
        definition = self.db.definition(table)
        writer = self.writers[table]
        key_bytes = None if key is None else self.encoder.key(definition, key)
        ts_ms = envelope.ts_us // 1000
        writer.send(key_bytes, self.encoder.value(definition, envelope), ts_ms)
        counts = self.counts[table]
        counts[_OP_COUNT[envelope.op]] += 1
        self.history[table].append((envelope.op, int(envelope.source["ts_ms"]),
                                    None if row is None else dict(row)))
        if envelope.op == "d":
            writer.send(key_bytes, None, ts_ms)  # Debezium's tombstone (tombstones.on.delete)
            counts["tombstones"] += 1
        if key is None or row is None or not self.spec.malformed_fraction:
            return
        # Error diffusion: fraction * changes extras (give or take one), spread evenly.
        self.malformed_due[table] += self.spec.malformed_fraction
        if self.malformed_due[table] >= 1.0:
            self.malformed_due[table] -= 1.0
            kind = self.kinds[self.malformed_seq[table] % len(self.kinds)]
            self.malformed_seq[table] += 1
            bad_key, bad_value = malformed_message(self.encoder, kind, definition, key, row, envelope)
            writer.send(bad_key, bad_value, ts_ms, may_duplicate=False)
            counts["malformed"] += 1
            counts[f"malformed_{kind}"] += 1

    # -- snapshot -----------------------------------------------------------------------------
    def snapshot(self) -> int:
        """Create the initial rows and emit them as snapshot reads; returns how many."""
        spec, rng, rows = self.spec, self.rng, self.rows
        for _ in range(spec.initial_customers):
            created = _T0_US - rng.randrange(1, _TWO_YEARS_US)
            updated = created + rng.randrange(_T0_US - created)
            customer = rows.customer(self.shop.new_id("customers"), created, updated, loyalty=False)
            self.db["customers"].insert(customer)
        for _ in range(spec.initial_products):
            created = _T0_US - rng.randrange(1, _TWO_YEARS_US)
            self.db["products"].insert(rows.product(self.shop.new_id("products"), created))
        if len(self.db["customers"]) and len(self.db["products"]):
            for _ in range(spec.initial_orders):
                self.shop.add_order(_T0_US - rng.randrange(1, _TWO_YEARS_US // 4), settled=True)
        for ledger in self.extra:
            for _ in range(spec.initial_extra_rows):
                booked = _T0_US - rng.randrange(1, _TWO_YEARS_US)
                self.db[ledger.name].insert(rows.ledger(self.shop.new_id(ledger.name), booked))
        snapshot_lsn = 0x3_0000_0000 + rng.randrange(1 << 20) * 8
        snapshot_txid = 700 + rng.randrange(300)
        reads = [(t, row) for t, state in self.db.tables.items() for row in state.sorted_rows()]
        for i, (table, row) in enumerate(reads):
            flag = "last" if i == len(reads) - 1 else "first" if i == 0 else "true"
            clock = _T0_US + i * 25
            source = self._source(table, clock, flag, None, snapshot_lsn, snapshot_txid)
            self._send(table, self.db[table].key_of(row), Envelope("r", None, row, source, clock + 900), row)
        # The slot's consistent point is where the stream resumes: the first streamed transaction
        # follows the snapshot LSN.
        self.wal = Wal(rng, snapshot_lsn, snapshot_txid)
        self.now_us = _T0_US + len(reads) * 25 + 5_000_000
        return len(reads)

    # -- streaming ----------------------------------------------------------------------------
    def stream(self, budget: int, progress: Callable[[int], None]) -> None:
        """Emit ``budget`` streamed change events in transactions."""
        spec, rng = self.spec, self.rng
        alter_at, truncate_at = budget * 2 // 5, budget * 3 // 5
        done = reported = 0
        while done < budget:
            if spec.add_column and not self.shop.altered and done >= alter_at:
                # ALTER TABLE emits nothing on the stream; the next customers event shows the column.
                self.db["customers"].add_column(LOYALTY_TIER)
                self.shop.altered = True
            if spec.widen_column and self.widened < len(_WIDENINGS) and done >= _WIDENINGS[self.widened][0] * budget:
                # ALTER COLUMN TYPE emits nothing either; the next orders event carries the wider type.
                self.db["orders"].alter_column_type("quantity", _WIDENINGS[self.widened][1])
                self.widened += 1
            if spec.truncate and not self.truncated and done >= truncate_at:
                txn = self._begin()
                txn.changes.append(self.shop.truncate_orders())
                self.truncated = True
                self.wal.place(txn)
                self._emit(txn)
                done += 1
                continue
            if budget - done >= 2 and rng.random() < INTERLEAVE_PROBABILITY:
                first = self._build(self._begin(), budget - done - 1)
                second = self._build(self._begin(), budget - done - len(first.changes), follow=first)
                self.wal.place_interleaved(first, second)
                self._emit(first)
                self._emit(second)
                done += len(first.changes) + len(second.changes)
            else:
                txn = self._build(self._begin(), budget - done)
                self.wal.place(txn)
                self._emit(txn)
                done += len(txn.changes)
            if done - reported >= 1000:
                progress(done)
                reported = done

    def _begin(self) -> Transaction:
        self.now_us += self.rng.randint(1_000, 400_000)
        return Transaction(commit_us=self.now_us)

    def _build(self, txn: Transaction, room: int, follow: Transaction | None = None) -> Transaction:
        size = min(self.rng.randint(1, 5), room)
        if follow is not None and self.rng.random() < 0.5:
            touched = [c for c in follow.changes
                       if c.op in "cu" and c.key is not None and c.key in self.db[c.table]]
            if touched:
                last = touched[-1]
                txn.changes.append(self.shop.update(last.table, txn.commit_us, last.key))
        while len(txn.changes) < size:
            table, op, _ = self.mix[bisect.bisect(self.mix_cum, self.rng.random() * self.mix_cum[-1])]
            change = (
                self.shop.insert(table, txn.commit_us) if op == "c"
                else self.shop.update(table, txn.commit_us) if op == "u"
                else self.shop.delete(table) or self.shop.update(table, txn.commit_us)
            )
            txn.changes.append(change)
        return txn

    def _emit(self, txn: Transaction) -> None:
        processed_us = txn.commit_us + self.rng.randint(2_000, 80_000)
        for change in txn.changes:
            source = self._source(change.table, txn.commit_us, "false", txn.last_commit, change.lsn, txn.txid)
            envelope = Envelope(change.op, change.before, change.after, source, processed_us)
            self._send(change.table, change.key, envelope, change.row)

    # -- results ------------------------------------------------------------------------------
    def _history_table(self, table: str) -> pa.Table:
        """:attr:`history` of ``table`` typed as the target table ends (``_op``, ``_source_ts_ms``, columns)."""
        events = self.history[table]
        columns = self.db[table].definition.columns
        rows = [row or {} for _, _, row in events]
        return pa.table({
            "_op": pa.array([op for op, _, _ in events], pa.string()),
            "_source_ts_ms": pa.array([ts for _, ts, _ in events], pa.int64()),
            **{c.name: pa.array([truth_value(c, r.get(c.name)) for r in rows], type=c.arrow_type()) for c in columns},
        })

    def finish(self) -> Truth:
        for table, writer in self.writers.items():
            writer.close()
            self.counts[table]["duplicates"] = writer.duplicates
            self.counts[table]["records"] = writer.records
        keys = (*_COUNT_KEYS, *(f"malformed_{k}" for k in self.kinds),
                *(f"violation_{k}" for kinds in QUALITY_VIOLATIONS.values() for k in kinds))
        return Truth(
            tables=self.db.to_arrow(),
            history={t: self._history_table(t) for t in self.db.tables},
            key_columns={t: s.definition.key for t, s in self.db.tables.items()},
            topics=dict(self.topics),
            counts={t: {k: int(c[k]) for k in keys} for t, c in self.counts.items()},
            meta={"spec": asdict(self.spec), "schema_versions": {
                t: s.definition.version for t, s in self.db.tables.items()}},
        )


def generate(
    spec: WorkloadSpec,
    log: TopicLog,
    registry: SchemaRegistry,
    truth_dir: Path,
    progress: Callable[[int, int], None] | None = None,
) -> Truth:
    """Simulate the source database, write its Debezium change stream and save the truth.

    Args:
        spec: what to generate.
        log: the embedded topic log; the topics are created and must not hold records yet.
        registry: where Avro schemas are registered (unused for JSON).
        truth_dir: where :class:`Truth` is saved.
        progress: called as ``progress(events_done, events_total)`` now and then.

    Returns:
        The true final state, as saved in ``truth_dir``.

    Raises:
        ValueError: a spec field is out of range.
        TopicLogError: a topic already holds records.
    """
    spec.validate()
    report = progress or (lambda done, total: None)
    workload = _Workload(spec, log, registry)
    reads = workload.snapshot()
    report(reads, spec.events)
    workload.stream(max(0, spec.events - reads), lambda done: report(reads + done, spec.events))
    truth = workload.finish()
    truth.save(truth_dir)
    report(spec.events, spec.events)
    return truth
