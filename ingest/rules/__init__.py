"""The per-key rules, in plain Arrow and DuckDB: what a batch's changes of one key do to its row.

They import neither Spark nor the lake (an import contract holds them to it), so the same rule runs
once over a whole batch on the driver or on every key share on Spark's executors
(:mod:`ingest.apply.placement`). :mod:`.reduce` keeps one change per key by :mod:`.ordering`;
:mod:`.plan` decides what the MERGE does; :mod:`.history` derives scd2 versions; :mod:`.kafka_tombstones`,
:mod:`.moved`, :mod:`.rereads`, :mod:`.withdraw` and :mod:`.schema` cover tombstones, primary-key
moves, suspect snapshot reads, the gate's held rows and schema evolution; :mod:`.sql` runs DuckDB.
"""
