"""CDC lakehouse ingestion: Debezium topics -> Delta Lake tables.

The packages follow a change's journey: :mod:`.source` (the embedded topic log or Kafka),
:mod:`.decode` (Debezium envelopes in Avro or JSON), :mod:`.quality` (the Great Expectations gate),
:mod:`.apply` (one table's batch, once, wherever it runs) with the per-key :mod:`.rules`, and
:mod:`.commit` (one Delta commit per table and batch, carrying its offsets). :mod:`.stream` runs
them under Spark Structured Streaming; :mod:`.records` keeps the audit and the quarantine;
:mod:`.cuts` publishes the points where a group of tables holds whole source transactions.
Around them: :mod:`.config`, :mod:`.lake` (where tables live, their locks), :mod:`.spark` (the
session and its JVM), :mod:`.read` (what analysts read), :mod:`.ops` (status, check, maintenance),
:mod:`.verify` (tables against their source database) and :mod:`.cli` (the ``ingest`` command).

Modules every stage shares: :mod:`.model` (the domain types), :mod:`.errors` (one root exception),
:mod:`.columns` (a table's columns as Arrow types), :mod:`.secrets` and :mod:`.tls` (credentials and
why a TLS connection failed), :mod:`.yaml_file`, :mod:`.logs` and :mod:`.metrics` (what a run
reports), :mod:`.behind` and :mod:`.heap` (work and garbage collection kept off a batch's path) and
:mod:`.crashpoints` (where the consistency proof may kill the process). This package never imports
Dagster nor the development harness.
"""

__version__ = "0.1.0"
