"""Where the code location finds the ingestion configuration (read when definitions load).

Neither value is a secret: credentials for Kafka or the schema registry are named in the
configuration file and read from the environment by the engine when it connects.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The repository root (this package's parent).
PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: Environment variable with the configuration file (default: configs/demo.yaml in the project).
CONFIG_ENV = "CDC_INGEST_CONFIG"
#: Environment variable overriding the configuration's workdir (optional).
WORKDIR_ENV = "CDC_INGEST_WORKDIR"
#: Environment variable: ``1`` starts the sensors and the maintenance schedule when first loaded.
AUTOMATION_ENV = "CDC_AUTOMATION_RUNNING"


@dataclass(frozen=True, slots=True)
class LocationSettings:
    """What the code location is built from.

    Args:
        config_path: absolute path of the ingestion configuration file.
        workdir: overrides the configuration's workdir, if set.
        automation_running: sensors and schedule start running (otherwise they start stopped).
    """

    config_path: Path
    workdir: Path | None
    automation_running: bool

    @classmethod
    def from_env(cls) -> LocationSettings:
        raw = os.environ.get(CONFIG_ENV)
        config = Path(raw) if raw else PROJECT_ROOT / "configs" / "demo.yaml"
        workdir = os.environ.get(WORKDIR_ENV)
        return cls(config.resolve(), Path(workdir).resolve() if workdir else None,
                   os.environ.get(AUTOMATION_ENV, "") == "1")
