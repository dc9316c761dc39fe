"""Reduce a micro-batch to at most one change per key, by source position (DESIGN 3.1, 3.3, 3.6, 3.9).

The latest change per key wins (:func:`ingest.ordering.batch_order`: by position, and among copies
of one position the lowest Kafka coordinates); everything it replaces is *superseded in batch*. A
truncate supersedes every change older than it.

Two fills keep the outcome independent of how the stream was cut into batches:

* an unchanged-TOAST placeholder in the winning change is filled from the newest earlier image of
  the same key in the batch when one exists, remembering that image's position: the MERGE planner
  keeps the stored value instead when the stored row is newer than that image (a redelivered old
  duplicate must not win). Otherwise the MERGE keeps the value already stored in the table;
* a winning delete takes the values its before image lacks (PostgreSQL sends only the key by
  default) from the newest earlier image in the batch, which is what the table would hold had the
  earlier change come in an earlier batch (soft-delete mode keeps those values).

With ``keep_truncated`` (soft-delete mode), each key whose last change in the batch is older than
the batch's truncate is kept as a *truncated* row: the table then holds it flagged deleted, exactly
as if the change had been applied in one batch and the truncate in the next.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ingest.events import UNAVAILABLE, ChangeEvent, KafkaCoordinates
from ingest.ordering import batch_order

Key = tuple[Any, ...]


@dataclass(slots=True)
class PositionedChange:
    """A change event with where it came from."""

    event: ChangeEvent
    coords: KafkaCoordinates
    #: TOAST columns filled from an earlier image in the batch -> that image's encoded position.
    toast_sources: dict[str, str] = field(default_factory=dict)

    def sort_key(self) -> tuple[str, int, int]:
        return batch_order(self.event.position.encode(), self.coords.partition, self.coords.offset)


@dataclass(slots=True)
class Reduction:
    """The outcome of reducing one table's batch.

    Attributes:
        winners: the latest change per key, in position order.
        truncate: the latest truncate in the batch, if any.
        superseded: changes replaced by a later change of the same key or by a truncate.
        truncates: truncate events seen (the latest is applied, earlier ones are superseded).
        truncated: with ``keep_truncated``, the last change of each key the truncate superseded
            (counted in ``superseded``; written flagged deleted in soft-delete mode).
    """

    winners: list[PositionedChange] = field(default_factory=list)
    truncate: PositionedChange | None = None
    superseded: int = 0
    truncates: int = 0
    truncated: list[PositionedChange] = field(default_factory=list)


def event_key(event: ChangeEvent, key_columns: tuple[str, ...]) -> Key:
    return tuple(event.key[k] for k in key_columns)


def reduce_changes(changes: Iterable[PositionedChange], key_columns: tuple[str, ...], *,
                   keep_truncated: bool = False) -> Reduction:
    """Keep the latest change per key (see module docstring)."""
    ordered = sorted(changes, key=PositionedChange.sort_key)
    result = Reduction()

    truncates = [c for c in ordered if c.event.op == "t"]
    result.truncates = len(truncates)
    cutoff = None
    if truncates:
        result.truncate = truncates[-1]
        result.superseded += len(truncates) - 1
        cutoff = result.truncate.sort_key()

    history: dict[Key, list[PositionedChange]] = {}
    before_truncate: dict[Key, list[PositionedChange]] = {}
    for change in ordered:
        if change.event.op == "t":
            continue
        key = event_key(change.event, key_columns)
        if cutoff is not None and change.sort_key() < cutoff:
            result.superseded += 1
            before_truncate.setdefault(key, []).append(change)
            continue
        history.setdefault(key, []).append(change)

    for changes_of_key in history.values():
        result.superseded += len(changes_of_key) - 1
        result.winners.append(_fill_delete(_fill_toast(changes_of_key), changes_of_key))
    result.winners.sort(key=PositionedChange.sort_key)
    if keep_truncated:
        result.truncated = [_fill_delete(_fill_toast(older), older)
                            for key, older in before_truncate.items() if key not in history]
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
    for earlier in _earlier_images(changes_of_key):
        if not missing:
            break
        for column in list(missing):
            value = earlier.event.after.get(column, UNAVAILABLE)  # type: ignore[union-attr]
            if value is not UNAVAILABLE and column not in earlier.event.unavailable:
                after[column] = value
                sources[column] = earlier.event.position.encode()
                missing.discard(column)
    if len(missing) == len(event.unavailable):
        return winner
    # The fill is provisional: a redelivered old image may be older than the stored row, which the
    # MERGE planner checks (see ingest.merge.revert_stale_toast_fills).
    return PositionedChange(replace(event, after=after, unavailable=frozenset(missing)), winner.coords, sources)


def _fill_delete(winner: PositionedChange, changes_of_key: list[PositionedChange]) -> PositionedChange:
    """A winning delete with what its before image lacks taken from the newest earlier image."""
    event = winner.event
    if not event.is_delete:
        return winner
    for earlier in _earlier_images(changes_of_key):
        known = {k: v for k, v in earlier.event.after.items() if v is not UNAVAILABLE}  # type: ignore[union-attr]
        given = {k: v for k, v in (event.before or {}).items() if v is not None and v is not UNAVAILABLE}
        own = {c.name for c in event.columns}
        columns = (*event.columns, *(c for c in earlier.event.columns if c.name not in own))
        return PositionedChange(replace(event, before={**known, **given}, columns=columns), winner.coords,
                                winner.toast_sources)
    return winner


def _earlier_images(changes_of_key: list[PositionedChange]) -> Iterable[PositionedChange]:
    """Earlier changes of a key with an after image, newest first, back to the last delete."""
    for earlier in reversed(changes_of_key[:-1]):
        if earlier.event.op == "d" or earlier.event.after is None:
            # A delete in between means an image before it describes another life of the row.
            return
        yield earlier
