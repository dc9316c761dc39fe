"""How ``ingest torture`` hurts the engine: which kill to deliver, and how to damage a checkpoint."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ingest.commit.state import load_state
from ingest.config import IngestConfig
from ingest.decode import MessageDecoder
from ingest.decode.registry import EmbeddedSchemaRegistry
from ingest.errors import DecodeError
from ingest.model import ChangeEvent, KafkaCoordinates
from ingest.source.topiclog import TopicLog

#: Kill labels in the report. Named points are :data:`ingest.crashpoints.POINTS`; ``during-merge`` and
#: ``during-widen`` arm a SIGKILL a few milliseconds after ``before-commit`` / ``before-widen`` so it
#: lands inside the MERGE or the schema rewrite; ``random-delay`` is SIGKILL from outside at a random time.
KILLS: Final = ("after-quarantine", "after-tombstones", "before-commit", "during-merge", "during-widen",
                "after-widen", "after-delta-commit", "after-batch", "random-delay")
_WIDEN_KILLS: Final = ("during-widen", "after-widen")
_BATCH_KILLS: Final = tuple(k for k in KILLS if k not in _WIDEN_KILLS and k != "random-delay")
#: Checkpoint damage between runs; all but ``delete`` and ``rewind`` must be detected and discarded.
DAMAGES: Final = ("delete", "truncate-offsets", "garbage-commit", "corrupt-metadata", "rewind", "claim-ahead")
_WIDTH: Final = {"byte": 0, "short": 1, "integer": 2, "long": 3}


@dataclass(frozen=True, slots=True)
class Kill:
    """One planned death: ``fault`` for ``INGEST_KILL_AT``, or ``after`` seconds from outside."""

    label: str
    fault: str | None = None
    after: float | None = None


def choose_kill(rng: random.Random, forced: str | None, *, lag: int, widen_pending: bool,
                timer_fraction: float) -> Kill:
    """Pick the next kill: a forced label, a widening while one is pending, or a random one.

    With nothing to ingest (``lag`` 0) no named point can fire, so the kill comes during start-up.
    """
    if forced is not None:
        label, _, hit = forced.partition("@")  # "after-batch@2": at the second hit
        return _kill(rng, label, int(hit) if hit else None)
    if lag == 0:
        return Kill("random-delay", after=round(rng.uniform(1.0, 8.0), 2))
    if widen_pending and rng.random() < 0.6:
        return _kill(rng, rng.choice(_WIDEN_KILLS))
    if rng.random() < timer_fraction:
        return _kill(rng, "random-delay")
    return _kill(rng, rng.choice(_BATCH_KILLS))


def _kill(rng: random.Random, label: str, hit: int | None = None) -> Kill:
    hit = hit or rng.randint(1, 2)
    if label == "random-delay":
        return Kill(label, after=round(rng.uniform(2.0, 20.0), 2))
    if label == "during-merge":
        return Kill(label, fault=f"before-commit:{hit}:{rng.randint(5, 250)}")
    if label == "during-widen":
        return Kill(label, fault=f"before-widen:1:{rng.randint(1, 150)}")
    if label == "after-widen":
        return Kill(label, fault="after-widen:1")
    if label not in KILLS:
        raise ValueError(f"unknown kill {label!r}; choose from {', '.join(KILLS)}")
    return Kill(label, fault=f"{label}:{hit}")


class WidenWatch:
    """Knows where ``orders.quantity`` gets wider in the staging log, to aim kills at the rewrite."""

    def __init__(self, staging: TopicLog, config: IngestConfig) -> None:
        spec = next(t for t in config.tables if t.name == "orders")
        self.topic = spec.topic
        decoder = MessageDecoder(value_format=config.source.value_format,
                                 registry=EmbeddedSchemaRegistry(config.registry_dir), key_columns=spec.primary_key)
        #: partition -> quantity width -> first offset carrying it
        self.first: dict[int, dict[int, int]] = {}
        for p, end in staging.end_offsets(self.topic).items():
            rows = staging.read(self.topic, p, 0, end)
            for off, key, value in zip(rows["offset"].to_pylist(), rows["key"].to_pylist(),
                                       rows["value"].to_pylist(), strict=True):
                width = _quantity_width(decoder, key, value, KafkaCoordinates(self.topic, p, off))
                if width is not None:
                    self.first.setdefault(p, {}).setdefault(width, off)

    def pending(self, released: Mapping[tuple[str, int], int], config: IngestConfig) -> bool:
        """True if released records carry a wider ``quantity`` than the orders table has."""
        state = load_state(config.table_path("orders"))
        current = next((c.type for c in state.columns or () if c.name == "quantity"), None)
        if current is None:
            return False
        return any(width > _WIDTH.get(current, 3) and released.get((self.topic, p), 0) > offset
                   for p, widths in self.first.items() for width, offset in widths.items())


def _quantity_width(decoder: MessageDecoder, key: bytes | None, value: bytes | None,
                    coords: KafkaCoordinates) -> int | None:
    try:
        event = decoder.decode(key, value, coords)
    except DecodeError:
        return None
    if not isinstance(event, ChangeEvent):
        return None
    col = next((c for c in event.columns if c.name == "quantity"), None)
    return _WIDTH.get(col.type) if col is not None else None


def damage_checkpoint(directory: Path, kind: str, rng: random.Random) -> str:
    """Damage a Spark checkpoint as a crash, a disk or an operator might; returns what was done ("" if nothing)."""
    offsets, commits = _batches(directory / "offsets"), _batches(directory / "commits")
    if kind == "delete":
        shutil.rmtree(directory)
        return "deleted"
    if kind == "corrupt-metadata":
        _write(directory / "metadata", b'{"id": "', drop_crc=True)
        return "metadata cut short"
    if not offsets:
        return ""
    last = max(offsets)
    if kind == "truncate-offsets":
        path = offsets[last]
        size = rng.randint(0, max(0, path.stat().st_size - 1))
        checksum = _write(path, path.read_bytes()[:size], drop_crc=rng.random() >= 0.5)
        return f"offsets/{last} truncated to {size} bytes ({checksum})"
    if kind == "garbage-commit" and commits:
        batch = max(commits)
        garbage = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
        _write(commits[batch], garbage, drop_crc=rng.random() < 0.5)
        return f"commits/{batch} overwritten with garbage"
    if kind == "rewind" and len(offsets) > 1:
        back = rng.randint(1, min(3, len(offsets) - 1))
        for batch in sorted(offsets)[-back:]:
            for file in (offsets[batch], commits.get(batch)):
                if file is not None:
                    file.unlink()
                    file.with_name(f".{file.name}.crc").unlink(missing_ok=True)
        return f"rewound by {back} batches (an older copy)"
    if kind == "claim-ahead" and commits:
        batch = max(commits)
        lines = offsets[batch].read_text().split("\n")
        claimed = json.loads(lines[2])
        bump = rng.randint(50, 5000)
        claimed = {t: {p: o + bump for p, o in parts.items()} for t, parts in claimed.items()}
        lines[2] = json.dumps(claimed)
        _write(offsets[batch], "\n".join(lines).encode(), drop_crc=True)
        return f"offsets/{batch} claims {bump} more records per partition than were read (well-formed)"
    return ""


def _batches(folder: Path) -> dict[int, Path]:
    return {int(p.name): p for p in folder.iterdir() if p.name.isdigit()} if folder.exists() else {}


def _write(path: Path, data: bytes, *, drop_crc: bool) -> str:
    """Write ``data`` over ``path``; returns what became of its Hadoop checksum file: "checksum kept",
    "checksum removed", or "no checksum" (a checkpoint written through the engine's FileContexts has
    none; its local checkpoints, written through FileSystems, have one beside each file)."""
    path.write_bytes(data)
    crc = path.with_name(f".{path.name}.crc")
    if not crc.exists():
        return "no checksum"
    if drop_crc:
        crc.unlink()
        return "checksum removed"
    return "checksum kept"
