"""Code location entry point: everything under ``dagster_project/defs`` (the dg convention).

``dagster dev`` and ``dg dev`` find this module through ``[tool.dg]`` in ``pyproject.toml``.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
