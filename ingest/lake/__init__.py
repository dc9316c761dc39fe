"""The lake: where the Delta tables live and how the engine opens, reads, locks and packs them.

:mod:`.location` and :mod:`.layout` say where (a directory or an object-store prefix; a table's
target, side, audit and quarantine tables); :mod:`.delta` opens, reads and writes with delta-rs;
:mod:`.lookup` reads a batch's stored rows by key; :mod:`.side` keeps a side table open and packed;
:mod:`.checkpoints` writes Delta checkpoints beside the commits; :mod:`.locks` and :mod:`.lease` keep
one writer per table, on a disk and on an object store.
"""
