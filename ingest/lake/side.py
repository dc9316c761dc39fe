"""A side table: one the engine writes beside a target table with the batches that need it, and reads by key.

Two kinds exist: the remembered deletes (``_cdc_tombstones/<table>``, :mod:`ingest.commit.remembered`)
and the primary-key moves (``_cdc_moves/<table>``, :mod:`ingest.apply.moves`). Each write adds a
small file, and each read by key stretches over every file the keys fall in. A :class:`SideTable`
therefore does two things for as long as a stream runs:

* it keeps the table open and brings it up to date before each use: opening replays the table's log,
  which grows by a commit with every write; bringing it up to date reads only the commits since.
  The stream holds the target table's lease, so nothing else replaces its side tables meanwhile.
* it packs the small files (:func:`~ingest.lake.delta.pack_small_files`) behind the batch that wrote
  them, on a background thread with a handle of its own, while the batch commits its table and the
  next one is read and planned: on every sixteenth or so batch that writes, the packing took about a
  quarter of the batch's time on two cores. Reading meanwhile is safe (packing changes no row); the
  next write waits for it (:meth:`SideTable.settle`), and so does whoever ends the run. A pack that
  fails is counted and logged (:func:`~ingest.behind.maintenance_failed`): the rows are there, and
  the next write tries again.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Final

from deltalake import DeltaTable

from ingest import secrets
from ingest.behind import Behind, maintenance_failed
from ingest.lake.delta import latest_table, pack_small_files
from ingest.lake.location import Location

log = logging.getLogger(__name__)

#: Packs the side tables' small files behind their batches, one at a time.
_PACKER: Final = Behind("pack-side-tables")


class SideTable:
    """One side table of one target table, kept open and packed behind its writes (see the module)."""

    def __init__(self, path: Location, table: str, kind: str) -> None:
        """``table``: the target table's name; ``kind``: what the side table holds, as a warning names it
        ("remembered deletes", "moves")."""
        self.path = path
        self.table = table
        self.kind = kind
        self._delta: DeltaTable | None = None
        self._packed: DeltaTable | None = None  # the background packing's own handle
        self._packing: Future[None] | None = None

    def latest(self) -> DeltaTable | None:
        """The table at its latest version (``None``: none yet), read from the commits since the last call."""
        self._delta = latest_table(self.path, self._delta)
        return self._delta

    def wrote(self) -> None:
        """A write added a file: have the small files packed behind it."""
        self.settle()
        self._packing = _PACKER.submit(self._pack)

    def settle(self) -> None:
        """Return once the packing behind the last write is done (one that failed has said so)."""
        packing, self._packing = self._packing, None
        if packing is not None:
            packing.result()

    def _pack(self) -> None:
        try:
            self._packed = latest_table(self.path, self._packed)
            if self._packed is not None:
                pack_small_files(self._packed)
        except Exception as exc:  # maintenance: the rows are there either way, and the next write tries again
            maintenance_failed(log, "pack", "table %s: its %s' small files were not packed (%s); the next batch "
                               "that writes them tries again", self.table, self.kind, secrets.describe(exc))
