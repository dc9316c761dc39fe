"""Publishing cuts: after its tables commit, a run asks whether a newer cut exists and appends it.

:class:`Publisher` reads the transaction topic from where the latest cut's END record is, each
table's commits since the latest cut's version (their marks, in the commit info), and lets
:func:`~ingest.cuts.calculus.choose` pick the newest cut. Everything it reads is durable -- the
Delta logs and the topic -- so a crash, a replay, a lost Spark checkpoint or a restart publishes
the same cuts; the store appends a cut only after the latest one (:mod:`ingest.cuts.store`).
A stopped table of the group stops new cuts, and says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from deltalake import DeltaTable

from ingest import secrets
from ingest.commit.state import BATCH_KEY, STATE_KEY, decoded_commit
from ingest.config import IngestConfig, TableSpec
from ingest.cuts import store
from ingest.cuts.calculus import Choice, TableHistory, Transaction, Unprovable, Version, choose, transaction_keys
from ingest.cuts.store import Cut
from ingest.cuts.transactions import TransactionTopic
from ingest.lake.delta import latest_table
from ingest.lake.location import LakePath
from ingest.model import SourceMark

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What publishing has come to so far in a run: the latest cut, and what holds newer ones back."""

    latest: Cut | None = None
    published: int = 0
    waiting: dict[str, str] = field(default_factory=dict)
    #: why no cut can be proven, or why the last try failed (one line)
    error: str | None = None
    #: the commit time of the newest transaction some table of the group has applied
    newest_ts: datetime | None = None

    @property
    def lag_seconds(self) -> float | None:
        """How far the latest cut is behind the newest applied transaction (source commit times)."""
        if self.latest is None or self.latest.commit_ts is None:
            return None
        if self.newest_ts is None:
            return 0.0
        return max(0.0, (self.newest_ts - self.latest.commit_ts).total_seconds())

    def describe(self) -> str:
        """One line: the latest cut, and what holds a newer one back."""
        cut = self.latest
        text = "no cut yet"
        if cut is not None:
            about = [f"committed {cut.commit_ts:%Y-%m-%d %H:%M:%S} UTC"] if cut.commit_ts else []
            if self.lag_seconds:
                about.append(f"{self.lag_seconds:.1f} s behind the newest applied")
            text = f"cut #{cut.cut} at transaction {cut.txn}" + (f" ({', '.join(about)})" if about else "")
        if self.published:
            text += f"; {self.published} published by this run"
        if self.error:
            return f"{text}; {self.error}"
        if self.waiting:
            text += "; waiting for " + "; ".join(f"{t}: {why}" for t, why in sorted(self.waiting.items()))
        return text


class Publisher:
    """The cuts of a configuration's transaction group (``source.transactions``); one per run."""

    def __init__(self, config: IngestConfig, run_id: str = "") -> None:
        assert config.source.transactions is not None
        self.config, self.run_id = config, run_id
        self.group = config.consistent_tables()
        self.prefix = config.source.transactions.prefix
        self.path: LakePath = config.tables_root / config.target.cuts_table
        self.published = 0
        self.latest: Cut | None = None
        self._topic: TransactionTopic | None = None
        self._pending: list[Transaction] = []
        self._next: int | None = None
        self._tables: dict[str, DeltaTable | None] = {}
        self._lock = threading.Lock()
        self._last_error: str | None = None
        self._newest_ts: datetime | None = None

    def collection(self, spec: TableSpec) -> str:
        """The table's data collection as the transaction topic names it: its topic without the prefix."""
        return spec.topic.removeprefix(self.prefix + ".")

    def attempt(self, stopped: Mapping[str, str] | None = None, *, write: bool = True) -> Outcome:
        """:meth:`publish`, its failure told in :attr:`Outcome.error` (the run's tables go on regardless)."""
        try:
            choice = self.publish(stopped, write=write)
            error = None
        except Unprovable as exc:
            choice, error = Choice(None), f"no cut can be proven: {exc}"
        except Exception as exc:  # the lake or the source did not answer: the next batch tries again
            choice, error = Choice(None), f"cuts not published: {secrets.describe(exc)}"
        if error is not None and error != self._last_error:
            log.warning("%s", error)
        self._last_error = error
        return Outcome(self.latest, self.published, choice.waiting, error, self._newest_ts)

    def publish(self, stopped: Mapping[str, str] | None = None, *, write: bool = True) -> Choice:
        """Append the newest cut the tables allow (if ``write``); the choice, with what holds tables back.

        Raises:
            Unprovable: the group's cuts cannot be proven (see :class:`~ingest.cuts.calculus.Unprovable`).
        """
        with self._lock:
            self._read()
            stopped = stopped or {}
            held = {s.name: f"stopped: {stopped[s.name]}" for s in self.group if s.name in stopped}
            if held:
                return Choice(None, waiting=held)
            histories = {s.name: self._history(s) for s in self.group}
            applied = {h.versions[-1].mark.txn for h in histories.values() if h.versions}
            keys = transaction_keys(self._pending)
            places = [keys[txn] for txn in applied if txn in keys]
            newest = self._pending[max(places) - 1] if places else None
            self._newest_ts = newest.commit_ts if newest is not None else None
            choice = choose(self._pending, histories)
            if choice.transaction is not None and write:
                self._append(choice)
            return choice

    def transactions(self) -> list[Transaction]:
        """The END records after the latest cut's, read up to the topic's end now.

        Raises:
            Unprovable: the transaction topic cannot order them.
        """
        with self._lock:
            self._read()
            return list(self._pending)

    def _read(self) -> None:
        if self._next is None:
            self.latest = store.latest(self.path)
            self._next = self.latest.txn_offset + 1 if self.latest is not None else 0
        if self._topic is None:
            topic = TransactionTopic(self.config)
            for spec in self.group:
                partitions = len(topic.log.end_offsets(spec.topic)) if topic.log.exists(spec.topic) else 1
                if partitions > 1:
                    raise Unprovable(f"table {spec.name}'s topic {spec.topic} has {partitions} partitions: a "
                                     "table's changes keep the source's order in one partition only")
            self._topic = topic
        found, self._next = self._topic.read(self._next)
        self._pending.extend(found)

    def _append(self, choice: Choice) -> None:
        txn = choice.transaction
        assert txn is not None
        positions = [m.txn_position for m in choice.marks.values() if m.txn_position is not None]
        cut = Cut((self.latest.cut if self.latest else 0) + 1, txn.id, txn.partition, txn.offset, txn.commit_ts,
                  max(positions) if positions else None, choice.versions, choice.marks, choice.quarantined,
                  datetime.now(UTC), self.run_id)
        if store.append(self.path, cut):
            self.published += 1
            self.latest = cut
        else:  # another run published at or after it: start again from there
            self.latest = store.latest(self.path)
        after = self.latest.txn_offset if self.latest is not None else -1
        self._pending = [t for t in self._pending if t.offset > after]

    def _history(self, spec: TableSpec) -> TableHistory:
        """The table's versions the next cut may use: the latest cut's, and every commit since."""
        path = self.config.tables_root / spec.name
        table = self._tables[spec.name] = latest_table(path, self._tables.get(spec.name))
        at_cut = None
        known = self.latest.versions.get(spec.name) if self.latest is not None else None
        if known is not None and self.latest is not None:
            at_cut = Version(known, self.latest.marks.get(spec.name, SourceMark()))
        since = commits_since(table, known) if table is not None else []
        return TableHistory(self.collection(spec), at_cut, since)


def commits_since(table: DeltaTable, version: int | None) -> list[Version]:
    """The engine's commits after ``version`` (all of them for ``None``), oldest first, with their marks."""
    after = -1 if version is None else version
    limit = max(1, table.version() - after)
    out = []
    for commit in table.history(limit):
        decoded: dict[str, Any] = decoded_commit(commit)
        if BATCH_KEY in decoded and STATE_KEY in decoded and int(decoded.get("version", -1)) > after:
            batch = decoded[BATCH_KEY]
            out.append(Version(int(decoded["version"]), SourceMark.from_json(decoded[STATE_KEY].get("source")),
                               int(batch.get("quarantined") or 0) if isinstance(batch, dict) else 0))
    return sorted(out, key=lambda v: v.version)
