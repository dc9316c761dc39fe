"""Operating the tables: their status (lag, last batch, quality) and the replay of quarantined messages.

* :mod:`ingest.ops.status`: what ``ingest status``, the Dagster checks and the sensor report per table.
* :mod:`ingest.ops.replay`: quarantined messages back through the same apply as the stream.
"""
