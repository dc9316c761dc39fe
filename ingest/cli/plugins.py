"""Commands and verifiers that installed extensions add to ``ingest``, found by their entry points.

The runtime knows no extension by name. A distribution that wants to add to the command line
declares, in its own metadata:

* ``[project.entry-points."ingest.commands"]``: a function taking the Typer app, which adds its
  commands (the development harness adds ``demo``, ``torture``, ``demo-stack`` and ``pg-load``,
  under a help panel of their own);
* ``[project.entry-points."ingest.truth"]``: a function taking the configuration that verifies
  every table against a source the runtime cannot read, prints its report and returns whether all
  were equal (``ingest verify`` without ``--source-db``: the harness's simulated source).

Only the entry points' names are read when the CLI starts; their modules are imported then too, so
they import nothing heavy at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import typer

from ingest.config import IngestConfig

COMMANDS = "ingest.commands"
TRUTH = "ingest.truth"


def register_commands(app: typer.Typer) -> None:
    """Let every installed extension add its commands to ``app``."""
    for entry in sorted(entry_points(group=COMMANDS), key=lambda e: e.name):
        register: Callable[[typer.Typer], Any] = entry.load()
        register(app)


def truth_verifier() -> Callable[[IngestConfig], bool] | None:
    """The installed verifier against a source the runtime cannot read, if any."""
    found = sorted(entry_points(group=TRUTH), key=lambda e: e.name)
    return found[0].load() if found else None
