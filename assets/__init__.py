"""Dagster assets over the CDC engine: one asset per configured table, checks, sensors, maintenance.

Thin by design: every module calls the engine (:mod:`ingest`) and turns its results into Dagster
metadata and check results. :func:`assets.definitions.build_definitions` assembles them.

Modules that declare ops, assets, checks or sensors do not use ``from __future__ import
annotations``: Dagster reads resource and config parameters from the runtime annotations.
"""
