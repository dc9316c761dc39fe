"""Where records come from: the embedded topic log or Kafka.

:mod:`ingest.source.catalog` answers which topics and partitions exist and where each ends, without
Spark; :mod:`ingest.source.sources` adds the records as Spark reads them. This package imports neither,
so that what only asks the catalogue (a caught-up run, ``ingest status``) never loads Spark.

Behind them: :mod:`.embedded` over :mod:`.topiclog` (the embedded log on local disk), and
:mod:`.kafka` over :mod:`.kafka_admin` (the admin API) and :mod:`.kafkalog` (records by range);
:mod:`.reader` is the engine's own Spark stream over either. :mod:`.discovery` finds tables by topic
name, :mod:`.producer` writes records (``ingest produce``) and :mod:`.consumer_group` commits the
applied offsets to a consumer group for lag dashboards.
"""
