"""What analysts read: SQL over the live rows, time travel, the change feed, and consistent cuts.

:mod:`.query` answers SQL with DuckDB; :mod:`.changes` reads a table's change data feed;
:mod:`.consistent` reads every table of a transaction group at one cut (:mod:`ingest.cuts`).
"""
