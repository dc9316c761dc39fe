"""The Dagster code location (a ``dg`` project): ``dagster_project.definitions`` is its target."""
