"""Where one table's Delta tables live: the target, its tombstones, the shared audit and quarantine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ingest.config import IngestConfig


@dataclass(slots=True)
class TablePaths:
    """The Delta tables one configured table writes."""

    table: Path
    tombstones: Path
    audit: Path
    quarantine: Path
    quality_results: Path | None = None

    @classmethod
    def of(cls, config: IngestConfig, name: str) -> TablePaths:
        root = config.tables_root
        return cls(root / name, root / "_cdc_tombstones" / name, root / config.target.audit_table,
                   root / config.target.quarantine_table, config.quality_results_dir / name)
