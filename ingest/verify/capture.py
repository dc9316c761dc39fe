"""Has Debezium captured everything up to now? The source's WAL position against its replication slots.

Debezium confirms a position to PostgreSQL (``pg_replication_slots.confirmed_flush_lsn``) only
after Kafka has acknowledged every record up to it, so once every active logical slot of the
database has confirmed the LSN read at the start, every change committed before that moment is in
Kafka.

One wrinkle: a slot confirms the position of the last change it *decoded*. When the WAL ends in
records that decode to nothing (DDL, a vacuum, a checkpoint; PostgreSQL 15's ``pgoutput`` also
skips empty transactions), the slot never reaches the current LSN, however long one waits. If the
slots make no progress for a few seconds, :func:`wait_for_capture` therefore writes one
transactional logical-decoding message (``pg_logical_emit_message``, prefix ``ingest.verify``);
it changes no table, lies past the target, and Debezium forwards it to its ``<prefix>.message``
topic and confirms its position. Writing it needs superuser or the REPLICATION attribute.

Where the capture belongs to the project's own stack, a caller may also pass ``on_stall``. When a
slot that has not caught up has confirmed nothing for :data:`RESTART_AFTER` seconds although markers
were written (or no slot is active), it is called, at most :data:`MAX_RESTARTS` times per wait, and
the stack restarts Kafka Connect. The other slots do not matter: one connector blocked while the
other confirms every marker is a stall too. Connect's Avro converter (Apicurio 2.6, on the JDK's
HTTP client, to which it gives no timeout) has been seen blocked for good on a registry call: once
on a call the registry had already answered, and once, in a suite run, on a schema registration
the registry never logged, while the JSON connector went on confirming markers. A fresh Connect
resumes from its committed offsets; a record it sends again is applied idempotently. The seconds a
stall cost that ``on_stall`` was called for (waiting for it, and the restart) do not count against
the wait's timeout, so a caller's timeout need not make room for :data:`MAX_RESTARTS` of them; a
capture that a restart does not mend fails that much later.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

import psycopg

from ingest.errors import first_line
from ingest.verify.captured import CaptureResult, SlotState

Say = Callable[[str], None]
MARKER_PREFIX: Final = "ingest.verify"
#: Seconds without progress before the marker message is written (and between further markers).
STALL_SECONDS: Final = 2.0
#: Seconds without progress, markers written, before ``on_stall`` is called.
RESTART_AFTER: Final = 45.0
MAX_RESTARTS: Final = 2
_MARKER_EVERY: Final = 15.0


def current_lsn(conn: psycopg.Connection) -> str:
    """``pg_current_wal_lsn()`` as text."""
    return str(_one(conn, "SELECT pg_current_wal_lsn()::text"))


def slot_states(conn: psycopg.Connection, target: str) -> list[SlotState]:
    """The logical slots of the connection's database, and whether each has confirmed ``target``."""
    rows = conn.execute(
        "SELECT slot_name, active, confirmed_flush_lsn::text, coalesce(confirmed_flush_lsn >= %s::pg_lsn, false) "
        "FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database() "
        "ORDER BY slot_name", (target,)).fetchall()
    return [SlotState(str(r[0]), bool(r[1]), r[2], bool(r[3])) for r in rows]


def wait_for_capture(dsn: str, *, timeout: float = 120.0, say: Say | None = None,
                     poll: float = 0.5, on_stall: Callable[[], object] | None = None,
                     restart_after: float = RESTART_AFTER, slots: Collection[str] | None = None) -> CaptureResult:
    """Wait until every active logical slot has confirmed the WAL position read at the start.

    Args:
        dsn: libpq connection string of the source database.
        timeout: seconds to wait at most, not counting the stalls ``on_stall`` was called for
            (the seconds without progress before each restart, and the restart itself): a caller's
            timeout is the capture's time, whether or not Connect had to be restarted on the way.
        say: receives progress lines (about every 5 s while waiting).
        poll: seconds between checks.
        on_stall: restarts the capture (Kafka Connect) when no slot has moved for ``restart_after``
            seconds, markers written; ``None`` waits it out. What it raises is raised here.
        restart_after: see ``on_stall``.
        slots: wait for these slots only (by name), each of which must then be active; ``None``: every
            active logical slot of the database.

    Returns:
        The target LSN, whether every active slot reached it, the slots' last state and how many
        marker messages were written; ``problem`` says why not when ``ok`` is false.
    """
    say = say or (lambda _line: None)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        target = current_lsn(conn)
        result = CaptureResult(target, False, 0.0)
        last_marker = 0.0
        last_said = started
        seen: dict[str, str | None] = {}
        moved: dict[str, float] = {}  # when each active slot last confirmed something new
        changed = started  # when the set of active slots last changed
        remedied = 0.0  # seconds of the stalls on_stall was called for, and of its restarts: not counted
        while True:
            states = [s for s in slot_states(conn, target) if slots is None or s.name in slots]
            result.slots = states
            active = [s for s in states if s.active]
            idle = sorted(set(slots or ()) - {s.name for s in active})  # named, but not streaming
            now = time.monotonic()
            if active and all(s.caught_up for s in active) and not idle:
                result.ok = True
                break
            if not active:
                result.problem = (f"no active logical replication slot in this database "
                                  f"({len(states)} inactive): is Debezium running?")
            elif idle:
                result.problem = f"slot(s) {', '.join(idle)} not active: is their connector running?"
            else:
                result.problem = None
            positions = {s.name: s.confirmed for s in active}
            moved = {name: now if name not in seen or seen[name] != confirmed else moved[name]
                     for name, confirmed in positions.items()}  # slots that went away are forgotten
            if positions.keys() != seen.keys():
                changed = now
            seen = positions
            # Progress is the laggards': a slot that keeps confirming markers does not hide one that is stuck.
            last_progress = min((moved[s.name] for s in active if not s.caught_up), default=changed)
            if now - started - remedied >= timeout:
                restarted = f" (and {remedied:.0f} s of {result.restarts} restart(s))" if result.restarts else ""
                result.problem = result.problem or (
                    f"after {timeout:.0f} s{restarted} the slots have not confirmed {target}: " + _describe(active)
                    + (f" (the marker message could not be written: {result.marker_error})"
                       if result.marker_error else ""))
                break
            stalled = now - last_progress >= STALL_SECONDS
            if (on_stall is not None and (result.markers or not active) and now - last_progress >= restart_after
                    and result.restarts < MAX_RESTARTS):
                say(f"  Debezium has confirmed nothing for {now - last_progress:.0f} s "
                    f"({_describe(active) or 'no active slot'}): restarting Kafka Connect")
                on_stall()
                result.restarts += 1
                changed = last_marker = time.monotonic()
                remedied += changed - last_progress
                moved = dict.fromkeys(moved, changed)
                continue
            if active and stalled and now - last_marker >= (_MARKER_EVERY if result.markers else 0):
                result.marker_error = _emit_marker(conn, target)
                result.markers += 1
                last_marker = now
            if now - last_said >= 5.0:
                say(f"  waiting for Debezium to confirm {target}: {_describe(active) or result.problem}")
                last_said = now
            time.sleep(poll)
    result.seconds = time.monotonic() - started
    return result


def _emit_marker(conn: psycopg.Connection, target: str) -> str | None:
    """Write a transactional logical-decoding message past ``target``; returns an error text or None."""
    try:
        conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (MARKER_PREFIX, f"capture check {target}"))
    except psycopg.Error as exc:
        return first_line(exc)
    return None


def _describe(slots: Iterable[SlotState]) -> str:
    return ", ".join(f"{s.name} at {s.confirmed}" for s in slots)


def _one(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    row = conn.execute(query.encode(), params).fetchone()
    return row[0] if row else None


def delete_topics(bootstrap_servers: str, topics: Iterable[str], *, timeout: float = 30.0,
                  admin_config: dict[str, Any] | None = None) -> list[str]:
    """Delete those of ``topics`` that exist and wait until the cluster no longer lists them.

    Debezium recreates a topic (broker auto-creation) with the next change of its table.

    Args:
        bootstrap_servers: Kafka ``host:port`` list.
        topics: topic names.
        timeout: seconds to wait for the deletion.
        admin_config: extra librdkafka settings (e.g. SASL).

    Returns:
        The topics that were deleted.
    """
    # librdkafka: only when the source's topics are on Kafka
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **(admin_config or {})})
    wanted = set(topics)
    existing = sorted(wanted & set(admin.list_topics(timeout=timeout).topics))
    if not existing:
        return []
    for future in admin.delete_topics(existing, operation_timeout=timeout).values():
        future.result()
    deadline = time.monotonic() + timeout
    while set(existing) & set(admin.list_topics(timeout=timeout).topics):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {existing} still listed {timeout:.0f} s after their deletion")
        time.sleep(0.2)
    return existing
