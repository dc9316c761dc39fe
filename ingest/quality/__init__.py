"""Data quality stage: each micro-batch validated with the table's Great Expectations suite.

:mod:`.suites` loads and checks suites (start-up), :mod:`.gate` validates a batch and :mod:`.verdict`
decides warn / quarantine / fail, :mod:`.results` keeps the full GX results for ``ingest quality show``.
Importing this package does not import GX; the first suite load does, once per process.
:mod:`.gx_shim` keeps one validation from building each expectation's configuration again, and
:mod:`.spark_rows` is the rows the gate exchanges with GX's Spark execution engine.
"""

from ingest.quality.gate import QualityGate
from ingest.quality.results import ResultStore
from ingest.quality.suites import LoadedSuite, load_suite
from ingest.quality.verdict import Hold, QualityReport

__all__ = ["Hold", "LoadedSuite", "QualityGate", "QualityReport", "ResultStore", "load_suite"]
