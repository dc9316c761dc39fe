"""The ``ingest`` command line (:mod:`ingest.cli.commands`).

Its commands by module: :mod:`.commands` (run, status, verify, resnapshot, retype, produce),
:mod:`.setup` (init, check), :mod:`.read` (the analysts' query, history, changes), :mod:`.quality`
(quality and quarantine) and :mod:`.maintain`; :mod:`.verify` prints the report of ``verify
--source-db``, and :mod:`.plugins` adds the installed extensions' commands.
:mod:`.common` is what they share and :mod:`.outcome` how a command ends (exit code, one line).

``app`` and ``main`` are loaded on first use, so that an extension's command module may import the
shared pieces (:mod:`ingest.cli.common`) without loading the app, which loads the extensions.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# delta-rs's object store logs its retries and credential look-ups as WARN lines of its own on stderr
# (read when its library loads); the CLI reports what failed itself, in one line.
os.environ.setdefault("RUST_LOG", "error")


def __getattr__(name: str) -> Any:
    if name in ("app", "main"):
        return getattr(importlib.import_module("ingest.cli.commands"), name)
    raise AttributeError(name)
