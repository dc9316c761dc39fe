"""Proof against the real stack: a PostgreSQL schema and workload, a load generator, and verification
of the Delta tables against ``SELECT``s of the source database (``ingest verify --source-db``).

Modules:

* :mod:`ingest.proof.pg_schema`: the ``shop`` schema (customers, products, orders, order_items),
  dropped and recreated on demand.
* :mod:`ingest.proof.pg_workload`: a seeded, deterministic SQL workload over it (inserts, updates,
  deletes, a primary-key update, a TRUNCATE, ``ADD COLUMN`` and widening ``ALTER COLUMN TYPE``).
* :mod:`ingest.proof.load`: a steady-rate load generator for benchmarks and fault injection.
* :mod:`ingest.proof.capture`: the source's WAL position, Debezium's replication slots, Kafka topics.
* :mod:`ingest.proof.source_db`: source rows in the engine's representation, compared with Delta.
* :mod:`ingest.proof.demo_stack`: ``ingest demo-stack`` from schema reset to verification.
"""
