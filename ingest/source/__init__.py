"""Where records come from: the embedded topic log or Kafka.

:mod:`ingest.source.catalog` answers which topics and partitions exist and where each ends, without
Spark; :mod:`ingest.source.sources` adds the records as Spark reads them. This package imports neither,
so that what only asks the catalogue (a caught-up run, ``ingest status``) never loads Spark.
"""
