"""The tables against the truth: their source database, read with ``SELECT`` (``ingest verify --source-db``).

:mod:`.source_db` compares every configured table with its source table through a source database
-- :mod:`.pg_source` (PostgreSQL) or :mod:`.mysql_source` (MariaDB, MySQL) -- whose values
:mod:`.source_values` writes as the engine does, and :mod:`.compare` says key by key and column by
column where they differ. :mod:`.capture` and :mod:`.captured` wait until Debezium has captured
everything up to now, so that a comparison does not race the stream.
"""
