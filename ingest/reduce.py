"""Reduce a micro-batch to at most one change per key, by source position (DESIGN 3.1, 3.3, 3.9).

The latest change per key wins; everything it replaces is *superseded in batch*. A truncate
supersedes every change older than it. An unchanged-TOAST placeholder in the winning change is
filled from the newest earlier image of the same key in the batch when one exists, remembering
that image's position: the MERGE planner keeps the stored value instead when the stored row is
newer than that image (a redelivered old duplicate must not win). Otherwise the MERGE keeps the
value already stored in the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ingest.events import UNAVAILABLE, ChangeEvent, KafkaCoordinates

Key = tuple[Any, ...]


@dataclass(slots=True)
class PositionedChange:
    """A change event with where it came from."""

    event: ChangeEvent
    coords: KafkaCoordinates
    #: TOAST columns filled from an earlier image in the batch -> that image's encoded position.
    toast_sources: dict[str, str] = field(default_factory=dict)

    def sort_key(self) -> tuple[str, int, int]:
        # Kafka coordinates only break ties between identical source positions (duplicates).
        return (self.event.position.encode(), self.coords.partition, self.coords.offset)


@dataclass(slots=True)
class Reduction:
    """The outcome of reducing one table's batch.

    Attributes:
        winners: the latest change per key, in position order.
        truncate: the latest truncate in the batch, if any.
        superseded: changes replaced by a later change of the same key or by a truncate.
        truncates: truncate events seen (the latest is applied, earlier ones are superseded).
    """

    winners: list[PositionedChange] = field(default_factory=list)
    truncate: PositionedChange | None = None
    superseded: int = 0
    truncates: int = 0


def event_key(event: ChangeEvent, key_columns: tuple[str, ...]) -> Key:
    return tuple(event.key[k] for k in key_columns)


def reduce_changes(changes: Iterable[PositionedChange], key_columns: tuple[str, ...]) -> Reduction:
    """Keep the latest change per key (see module docstring)."""
    ordered = sorted(changes, key=PositionedChange.sort_key)
    result = Reduction()

    truncates = [c for c in ordered if c.event.op == "t"]
    result.truncates = len(truncates)
    cutoff = None
    if truncates:
        result.truncate = truncates[-1]
        result.superseded += len(truncates) - 1
        cutoff = result.truncate.event.position.encode()

    history: dict[Key, list[PositionedChange]] = {}
    for change in ordered:
        if change.event.op == "t":
            continue
        if cutoff is not None and change.event.position.encode() < cutoff:
            result.superseded += 1
            continue
        history.setdefault(event_key(change.event, key_columns), []).append(change)

    for changes_of_key in history.values():
        result.superseded += len(changes_of_key) - 1
        result.winners.append(_fill_toast(changes_of_key))
    result.winners.sort(key=PositionedChange.sort_key)
    return result


def _fill_toast(changes_of_key: list[PositionedChange]) -> PositionedChange:
    """Winner of one key's changes, with TOAST placeholders filled from earlier images in the batch."""
    winner = changes_of_key[-1]
    event = winner.event
    if not event.unavailable or event.after is None:
        return winner
    after = dict(event.after)
    missing = set(event.unavailable)
    sources: dict[str, str] = {}
    for earlier in reversed(changes_of_key[:-1]):
        if not missing:
            break
        if earlier.event.op == "d" or earlier.event.after is None:
            # A delete in between means an image before it describes another life of the row.
            break
        for column in list(missing):
            value = earlier.event.after.get(column, UNAVAILABLE)
            if value is not UNAVAILABLE and column not in earlier.event.unavailable:
                after[column] = value
                sources[column] = earlier.event.position.encode()
                missing.discard(column)
    if len(missing) == len(event.unavailable):
        return winner
    # The fill is provisional: a redelivered old image may be older than the stored row, which the
    # MERGE planner checks (see ingest.merge.revert_stale_toast_fills).
    return PositionedChange(replace(event, after=after, unavailable=frozenset(missing)), winner.coords, sources)
