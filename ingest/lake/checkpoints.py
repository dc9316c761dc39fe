"""A table's Delta checkpoints written beside its commits, not inside them.

delta-rs writes a checkpoint inside the commit that reaches it -- every ``delta.checkpointInterval``
commits, the commit of version ``interval - 1``, ``2 * interval - 1`` and so on (100 unless the table
says otherwise) -- and then removes the log files that expired behind it. On the path between one
micro-batch and the next that is a tenth of a second on every hundredth batch (``bench_latency``'s
checkpoint figure). :class:`Checkpoints` lets the commit return first and writes the same
checkpoint, at the same version, in a background thread. Until it is there a reader replays the JSON
commits since the one before, as it does between any two checkpoints; a checkpoint that fails is
logged and counted (:func:`~ingest.behind.maintenance_failed`), and the next is written as usual
(delta-rs does not repair a missed one either).
"""

from __future__ import annotations

import logging
from typing import Final

from deltalake import DeltaTable
from deltalake.transaction import PostCommitHookProperties

from ingest import secrets
from ingest.behind import Behind, maintenance_failed
from ingest.lake.location import LakePath

log = logging.getLogger(__name__)

#: What a commit that leaves its checkpoint to :class:`Checkpoints` passes to delta-rs.
AFTER_COMMIT: Final = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
#: delta-rs's ``delta.checkpointInterval`` when the table sets none.
DEFAULT_INTERVAL: Final = 100


def due(table: DeltaTable) -> bool:
    """Whether delta-rs's own hook would have written a checkpoint with the commit ``table`` is at."""
    interval = int(table.metadata().configuration.get("delta.checkpointInterval") or DEFAULT_INTERVAL)
    return (table.version() + 1) % interval == 0


def write_checkpoint(where: LakePath, version: int) -> None:
    """The checkpoint of ``version`` of the table at ``where``, and the expired log files behind it
    removed unless the table keeps them (``delta.enableExpiredLogCleanup``), as delta-rs's hook does."""
    table = DeltaTable(where.uri, version=version, storage_options=where.storage_options)
    table.create_checkpoint()
    if (table.metadata().configuration.get("delta.enableExpiredLogCleanup") or "true").lower() != "false":
        table.cleanup_metadata()


class Checkpoints:
    """Writes the checkpoints of the commits it is told about, one at a time, in a background thread."""

    def __init__(self) -> None:
        self._behind = Behind("delta-checkpoint")

    def after_commit(self, table: DeltaTable, where: LakePath) -> None:
        """Write the checkpoint of the commit ``table`` is at, if one is due, after returning."""
        if due(table):
            self._behind.submit(self._write, where, table.version())

    @staticmethod
    def _write(where: LakePath, version: int) -> None:
        try:
            write_checkpoint(where, version)
        except Exception as exc:
            maintenance_failed(log, "checkpoint", "lake %s: the Delta checkpoint of version %d was not written (%s); "
                               "readers replay the log from the checkpoint before, and the next one is written "
                               "as usual", where.uri, version, secrets.describe(exc))

    def wait(self) -> None:
        """Return once every checkpoint asked for so far is written (or has failed, and said so)."""
        self._behind.wait()
