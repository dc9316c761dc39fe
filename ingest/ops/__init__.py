"""Operating the tables: their status, the replay of quarantined messages, maintenance, and a deployment's set-up.

* :mod:`ingest.ops.status`: what ``ingest status``, the Dagster checks and the sensor report per table.
* :mod:`ingest.ops.replay`: quarantined messages back through the same apply as the stream.
* :mod:`ingest.ops.maintain`: compaction, vacuum, log checkpoint and clean-up, the tombstone purge.
  :mod:`ingest.ops.maintain_plan` is its dry run; :mod:`ingest.ops.maintain_tables` runs it over a
  configuration's tables, as ``ingest maintain`` does.
* :mod:`ingest.ops.check`: a deployment's pre-flight (``ingest check``);
  :mod:`ingest.ops.source_columns` gives it the columns each table's source delivers now.
* :mod:`ingest.ops.verify_source`: ``ingest verify --source-db``, which waits for Debezium and the
  tables, then compares each table with its source database (:mod:`ingest.verify`).
* :mod:`ingest.ops.init`: a new pipeline's files (``ingest init``).
* :mod:`ingest.ops.resnapshot`: Debezium's incremental snapshot of a table, while its stream flows.
* :mod:`ingest.ops.retype`: a table rewritten once to follow a source's incompatible column change.
"""
