"""The records the engine keeps of itself: the audit trail and the quarantine.

:mod:`.audit` holds one row per table per micro-batch; :mod:`.quarantine` holds the messages that
could not be applied, with their raw bytes and the reason, for ``ingest quarantine replay``.
"""
