"""Apply: one table's columnar micro-batch to its Delta table, on the driver.

:mod:`.microbatch` unifies the decode step's parts; :mod:`.kafka_tombstones` turns tombstones of
flattened streams into deletes; :mod:`.reduce` keeps the latest change per key; :mod:`.plan`
classifies the winners against the stored rows; :mod:`.delta_rs` commits; :mod:`.pipeline` is the
journey from parts to an audited commit. Reduce, tombstones and plan are SQL over Arrow (DuckDB).
"""
