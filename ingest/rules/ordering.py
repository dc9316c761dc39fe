"""Which of two changes of a key wins: the one ordering rule, in Python and in SQL.

See docs/architecture.md#ordering and docs/architecture.md#idempotent-replay.

Positions are compared in their encoded form (:meth:`ingest.model.SourcePosition.encode`), whose
text order is the source order. Two refinements make the rule total and batching-independent:

* **Ties.** Copies of one change share a position (Debezium is at-least-once). The copy with the
  lowest Kafka ``(partition, offset)`` wins, in a batch and against the table alike, so two fresh
  runs keep the same copy whatever the batching.
* **Kafka fallback positions** (sources without a comparable position) are partition offsets, which
  say nothing across partitions. Against what a table already stores, a change from another
  partition is taken as newer: it arrived later (this is how a truncate there removes every row
  stored before it arrived). Inside one batch, where arrival order across partitions is unknown,
  the encoded order decides (partition, then offset) so that the outcome is at least deterministic.
"""

from __future__ import annotations

from typing import Final

from ingest.model import SNAPSHOT

_KAFKA: Final = "k"
_PARTITION_PREFIX: Final = 9  # "k" + 8 hex digits of the partition


def _other_partition(new: str, old: str) -> bool:
    return new[:1] == _KAFKA and old[:1] == _KAFKA and new[:_PARTITION_PREFIX] != old[:_PARTITION_PREFIX]


def later_than_stored(new: str, stored: str) -> bool:
    """True if a change at position ``new`` comes after what the table stores at ``stored``.

    Equal positions are not later (see :func:`replaces_stored` for the tie rule).
    """
    return _other_partition(new, stored) or new > stored


def replaces_stored(new: str, new_coords: tuple[int, int], stored: str, stored_coords: tuple[int, int]) -> bool:
    """True if an incoming change replaces the stored row of its key.

    Args:
        new: encoded position of the incoming change.
        new_coords: its Kafka ``(partition, offset)``.
        stored: encoded position of the stored row.
        stored_coords: the stored row's ``(_cdc_partition, _cdc_offset)``.
    """
    if new == stored:
        return new_coords < stored_coords
    return later_than_stored(new, stored)


def batch_order(position: str, partition: int, offset: int) -> tuple[str, int, int]:
    """Sort key of a batch's changes: the last of a key's changes in this order is its winner.

    Among copies of one position the lowest coordinates sort last, so they win (the tie rule).
    """
    return (position, -partition, -offset)


def later_than_stored_sql(new: str, stored: str) -> str:
    """SQL for :func:`later_than_stored` over two encoded-position expressions."""
    return (f"(CASE WHEN substr({new}, 1, 1) = '{_KAFKA}' AND substr({stored}, 1, 1) = '{_KAFKA}' "
            f"AND substr({new}, 1, {_PARTITION_PREFIX}) <> substr({stored}, 1, {_PARTITION_PREFIX}) "
            f"THEN true ELSE {new} > {stored} END)")


def replaces_sql(new: tuple[str, str, str], stored: tuple[str, str, str]) -> str:
    """SQL for :func:`replaces_stored` over ``(position, partition, offset)`` expressions of both rows."""
    (s_pos, s_part, s_off), (t_pos, t_part, t_off) = new, stored
    tie = f"({s_part} < {t_part} OR ({s_part} = {t_part} AND {s_off} < {t_off}))"
    return f"(CASE WHEN {s_pos} = {t_pos} THEN {tie} ELSE {later_than_stored_sql(s_pos, t_pos)} END)"


def replaces_stored_sql(source: str = "s", target: str = "t") -> str:
    """SQL for :func:`replaces_stored` between a MERGE's source and target rows (framework columns)."""
    return replaces_sql(*((f"{alias}._cdc_position", f"{alias}._cdc_partition", f"{alias}._cdc_offset")
                          for alias in (source, target)))


def after_sql(position: str) -> str:
    """SQL for :meth:`ingest.model.SourcePosition.after`: the same point, at phase 2 (the last character)."""
    return f"(left({position}, length({position}) - 1) || '2')"


def at_snapshot_phase_sql(position: str) -> str:
    """SQL: the encoded position is at phase :data:`~ingest.model.SNAPSHOT` (the last character), a read's."""
    return f"suffix({position}, '{SNAPSHOT}')"
