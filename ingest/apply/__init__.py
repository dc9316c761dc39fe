"""Apply: one table's micro-batch, from the decode step's parts to an audited Delta commit.

:mod:`.journey` is the one sequence every table's batch goes through (hold back, gate, reduce, plan,
commit, audit); :mod:`.batch` unifies the decode step's parts and holds what the journey keeps back;
:mod:`.placement` decides where the steps that touch change rows run (the driver with Arrow, or
Spark's executors); :mod:`.stored`, :mod:`.moves` and :mod:`.rereads` are the steps that read what a
table already holds. The per-key rules themselves are :mod:`ingest.rules`'s, and the commit is
:mod:`ingest.commit`'s.
"""
