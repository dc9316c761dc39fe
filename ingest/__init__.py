"""CDC lakehouse ingestion: Debezium topics -> Delta Lake tables.

The engine is organised along the data's journey: ``topiclog``/``source`` (read), ``decode``
(Debezium envelopes), ``reduce`` (latest change per key), ``merge`` (one Delta commit per table and
batch), ``audit`` and ``quarantine`` (nothing lost silently). ``engine`` ties them to Spark
Structured Streaming; ``cli`` is the user's entry point. This package never imports Dagster.
"""

__version__ = "0.1.0"
