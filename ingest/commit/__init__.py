"""Commit: one planned batch into one atomic Delta commit, with its progress and audit record.

:mod:`.writer` is the contract every writer keeps (a :class:`~ingest.commit.writer.CommitRequest` in,
one commit out); :mod:`.delta_rs` and :mod:`.delta_spark` are the two writers, and
:mod:`.spark_merge` runs delta-spark's MERGE. :mod:`.merge_sql` writes the MERGE statement once
for both, so they cannot drift apart. :mod:`.state` reads and writes what a table's log says of its
progress; :mod:`.remembered` keeps the deletes of hard-delete tables; :mod:`.writers` picks each
table's writer.
"""
