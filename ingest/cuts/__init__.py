"""Cuts across tables: points of the source at which every table of a group holds the same transactions.

Each table commits its own MERGE, so at any moment the tables reflect different points of the
source. A *cut* names a source transaction T and, for every table of the group, the Delta version
that holds exactly the transactions up to T (docs/architecture.md#cuts-across-tables). The engine
publishes cuts after its tables commit (:mod:`.publish`), from what the tables' Delta logs and the
connector's transaction topic say (:mod:`.calculus`, :mod:`.transactions`); readers that ask for
consistency read the versions of a cut (:mod:`ingest.read.consistent`). :mod:`.align` ends every
table of a group at one transaction boundary in each micro-batch; :mod:`.store` is the published cuts.
"""
