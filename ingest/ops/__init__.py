"""Operating the tables: their status (lag, last batch, quality), the replay of quarantined messages, maintenance.

* :mod:`ingest.ops.status`: what ``ingest status``, the Dagster checks and the sensor report per table.
* :mod:`ingest.ops.replay`: quarantined messages back through the same apply as the stream.
* :mod:`ingest.ops.maintain`: compaction, vacuum, log checkpoint and clean-up, the tombstone purge.
  :mod:`ingest.ops.maintain_plan` is its dry run; :mod:`ingest.ops.maintain_tables` runs it over a
  configuration's tables, as ``ingest maintain`` does.
"""
