"""Applied offsets committed to a Kafka consumer group, for the lag dashboards a platform team has.

With ``source.kafka.commit_group`` set, each table's offsets are committed to that group after its
Delta commit (the next offset to read, per partition, as Kafka consumers do). The group is written
only: where a run resumes is always what the table's Delta log records
(docs/architecture.md#progress-lives-in-the-table), so a lost or reset group changes nothing but
the dashboards. Commits do not wait for Kafka's answer; one Kafka refuses is logged, and the next
batch's commit carries the offsets again; the table goes on.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from concurrent.futures import Future
from typing import Any

from ingest import logs, secrets
from ingest.config import KafkaSpec
from ingest.errors import SourceUnavailableError
from ingest.source.kafka_admin import KafkaAdmin

log = logging.getLogger(__name__)


class GroupCommitter:
    """Commits applied offsets to one consumer group through the admin API (the group never has a
    member: Kafka takes offsets for such a group from any client)."""

    def __init__(self, spec: KafkaSpec, group: str, *, secrets_file: str | os.PathLike[str] | None = None) -> None:
        self.spec, self.group = spec, group
        self.admin = KafkaAdmin(spec, secrets_file=None if secrets_file is None else str(secrets_file))
        self._lock = threading.Lock()  # tables commit from the applier's threads
        self._in_flight: list[Future[Any]] = []

    def commit(self, table: str, topic: str, applied: dict[int, int]) -> None:
        """Commit ``applied`` (partition -> last applied offset) as the group's next offsets.

        Without waiting: a broker that does not answer must not hold the table's next batch. Kafka's
        answer is looked at with the next commit (and at :meth:`close`), and a refusal logged then.
        """
        if not applied:
            return
        # librdkafka: only a Kafka source with a commit group gets here
        from confluent_kafka import KafkaException

        with self._lock:
            self._answered()
            try:
                self._in_flight += self.admin.set_group_offsets(self.group, topic,
                                                                {p: o + 1 for p, o in applied.items()})
            except (KafkaException, SourceUnavailableError) as exc:
                self._refused(exc, table)

    def _answered(self) -> None:
        """Log the refusals among the commits Kafka has answered; keep the others."""
        waiting = []
        for future in self._in_flight:
            if not future.done():
                waiting.append(future)
            elif future.exception() is not None:
                self._refused(future.exception())
        self._in_flight = waiting

    def _refused(self, error: Any, table: str | None = None) -> None:
        of = f"table {table}: " if table else ""
        logs.event(log, "group-commit-failed", f"{of}offsets not committed to consumer group {self.group!r} "
                   f"({secrets.redact(str(error))}); the next batch commits again", table=table,
                   level=logging.WARNING)

    def close(self, wait: float = 5.0) -> None:
        """Wait up to ``wait`` seconds for Kafka to answer the commits in flight, logging refusals."""
        futures.wait(self._in_flight, timeout=wait)
        with self._lock:
            self._answered()
            if self._in_flight:
                logs.event(log, "group-commit-failed", f"{len(self._in_flight)} commit(s) to consumer group "
                           f"{self.group!r} unanswered after {wait:.0f} s; the next batch or run commits again",
                           level=logging.WARNING)
