"""Where one table's Delta tables live: the target, its remembered deletes, the shared audit and quarantine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.lake.location import LakePath

if TYPE_CHECKING:  # the configuration knows where the lake is; the lake does not read configurations
    from ingest.config import IngestConfig


@dataclass(slots=True)
class TablePaths:
    """The Delta tables one configured table writes."""

    table: LakePath
    tombstones: LakePath
    audit: LakePath
    quarantine: LakePath
    quality_results: Path | None = None

    def __post_init__(self) -> None:
        # Directories given as paths (tests, tools) become lake locations like the configuration's.
        for name in ("table", "tombstones", "audit", "quarantine"):
            setattr(self, name, LakePath.of(getattr(self, name)))

    @property
    def moves(self) -> LakePath:
        """The rows that hard deletes of primary-key moves removed (:mod:`ingest.apply.moves`):
        beside the remembered deletes, in ``_cdc_moves``."""
        return self.tombstones.parent.parent / "_cdc_moves" / self.tombstones.name

    @classmethod
    def of(cls, config: IngestConfig, name: str) -> TablePaths:
        root = config.tables_root
        return cls(root / name, root / "_cdc_tombstones" / name, root / config.target.audit_table,
                   root / config.target.quarantine_table, config.quality_results_dir / name)
