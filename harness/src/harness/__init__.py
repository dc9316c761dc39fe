"""The development harness of the ingestion runtime: what demonstrates and proves it.

* :mod:`harness.simulator`: a simulated source database and its Debezium topics, with the truth.
* :mod:`harness.demo`: ``ingest demo``, the simulated source ingested and verified.
* :mod:`harness.torture`: ``ingest torture``, kills at random and at named crash points, then the
  consistency proof.
* :mod:`harness.postgres`: the ``shop`` schema, its seeded SQL workload and a load generator.
* :mod:`harness.stack`: PostgreSQL, Kafka, Connect + Debezium, the registry and MinIO on loopback.
* :mod:`harness.stack_proofs`: ``ingest demo-stack`` and ``ingest torture --stack`` on that stack.
* :mod:`harness.cli`: those commands, added to ``ingest`` by an entry point.

The runtime (``ingest``) never imports this package.
"""
