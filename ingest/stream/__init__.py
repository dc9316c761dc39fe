"""The run: Spark Structured Streaming queries over the tables, and what happens around them.

:mod:`.runner` starts a run, or answers without Spark when :mod:`.caught_up` finds nothing to do,
and :mod:`.driver_run` drains a backlog on the driver; :mod:`.queries` runs the streaming loop;
:mod:`.callback` takes each micro-batch (its parts from :mod:`.decoding`) through the tables'
journeys; :mod:`.tails`, :mod:`.stops`, :mod:`.rereads`, :mod:`.checkpoint` and :mod:`.audit_rows`
handle transaction groups, stopped tables, re-reads, checkpoints and audit rows; :mod:`.report` is
what the run did.
"""
