"""Is a table's Spark checkpoint still safe to resume from? (DESIGN 3.5)

Progress lives in the Delta log; the Spark checkpoint is a disposable cache of it. A checkpoint
that is lost is harmless (the query starts from the offsets its table's Delta log records). One
that is damaged is not: Spark fails to start from a truncated or garbled offsets file, and -- worse
-- a readable checkpoint that claims more progress than the table has (restored from elsewhere,
hand-edited, left behind after the table was rebuilt) would make Spark skip records silently.

:func:`inspect` checks a checkpoint before its query starts: Hadoop ``.crc`` checksums, the format
of the metadata, offsets and commit logs, contiguous batch ids, the topic, and that the last
committed batch ends no further than the table's applied offsets. A checkpoint that fails is
discarded (:func:`discard`) with a logged warning and the query resumes from the Delta log, which
is always safe because replayed records are recognised by the table's app transactions.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ingest import audit
from ingest.lake import Location

_CRC_MAGIC: Final = b"crc\x00"
#: Offsets per partition applied to the table (``None``: nothing applied yet).
AppliedFn = Callable[[int], int | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of :func:`inspect`: ``problem`` is ``None`` when the checkpoint may be used."""

    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


class _Damaged(Exception):
    """Internal: what is wrong with the checkpoint."""


def inspect(directory: Path, *, topic: str | None = None, applied: AppliedFn | None = None,
            audit_path: Location | None = None, table: str | None = None,
            topics: Mapping[str, tuple[AppliedFn, str]] | None = None) -> Verdict:
    """Check a query's checkpoint (see module docstring).

    Args:
        directory: the query's checkpoint directory (may be missing: then there is nothing to check).
        topic: the topic of a one-table query (with ``applied`` and ``table``).
        applied: last offset applied to the table per partition, from its Delta log.
        audit_path: the audit table, consulted for batches of a table that did not exist yet
            (such batches hold only undecodable or control records and commit no progress).
        table: table name, for the audit lookup.
        topics: for a query of several tables: ``topic -> (applied, table)``. The checkpoint must
            be for these topics, and no table may be behind what it claims.

    Returns:
        The verdict; its ``problem`` says what is wrong, for the warning.
    """
    if topics is None:
        assert topic is not None and applied is not None
        topics = {topic: (applied, table or "")}
    if not directory.exists():
        return Verdict()
    try:
        offsets = _batch_files(directory / "offsets")
        commits = _batch_files(directory / "commits")
        if not offsets and not commits:
            return Verdict()  # created but never used; Spark starts it afresh
        _read_metadata(directory / "metadata")
        if commits and not offsets:
            raise _Damaged("commit log without an offsets log")
        ids = sorted(offsets)
        if ids != list(range(ids[0], ids[-1] + 1)):
            raise _Damaged(f"offsets log has gaps (batches {ids[0]}..{ids[-1]}, {len(ids)} files)")
        last_commit = max(commits, default=None)
        if last_commit is not None and not (ids[-1] - 1 <= last_commit <= ids[-1]):
            raise _Damaged(f"commit log ends at batch {last_commit} but the offsets log at {ids[-1]}")
        parsed = {batch: _read_offsets(path, set(topics)) for batch, path in offsets.items()}
        for batch, path in commits.items():
            _read_commit(path, batch)
        if last_commit is not None:
            for name, ends in parsed[last_commit].items():
                fn, owner = topics[name]
                _not_ahead(ends, last_commit, fn, audit_path, owner or None, name)
    except _Damaged as exc:
        return Verdict(str(exc))
    return Verdict()


def discard(directory: Path) -> None:
    """Delete a checkpoint (progress then comes from the table's Delta log)."""
    shutil.rmtree(directory, ignore_errors=True)


# -- files ------------------------------------------------------------------------------------------
def _batch_files(folder: Path) -> dict[int, Path]:
    if not folder.exists():
        return {}
    # Like Spark, look only at batch files; hidden checksums and temporary files are not batches.
    return {int(path.name): path for path in folder.iterdir() if path.name.isdigit()}


def _verified_text(path: Path) -> str:
    """File content, checked against its Hadoop ``.crc`` (CRC32 per 512-byte chunk) when present."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Damaged(f"{path.name}: unreadable ({exc.strerror})") from None
    crc = path.with_name(f".{path.name}.crc")
    if crc.exists():
        raw = crc.read_bytes()
        if raw[:4] != _CRC_MAGIC or len(raw) < 8:
            raise _Damaged(f"{crc.parent.name}/{crc.name}: not a checksum file")
        (chunk,) = struct.unpack(">I", raw[4:8])
        expected = raw[8:]
        actual = b"".join(struct.pack(">I", zlib.crc32(data[i:i + chunk])) for i in range(0, len(data), chunk or 1))
        if chunk <= 0 or actual != expected:
            raise _Damaged(f"{path.parent.name}/{path.name}: checksum mismatch (file truncated or overwritten)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Damaged(f"{path.parent.name}/{path.name}: not text") from None


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise _Damaged(f"{where}: not valid JSON") from None


def _read_metadata(path: Path) -> None:
    if not path.exists():
        raise _Damaged("metadata file is missing")
    meta = _json(_verified_text(path), "metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        raise _Damaged("metadata file has no query id")


def _version_and_lines(path: Path, least: int) -> list[str]:
    lines = _verified_text(path).split("\n")
    where = f"{path.parent.name}/{path.name}"
    if len(lines) < least or not lines[0].startswith("v") or not lines[0][1:].isdigit():
        raise _Damaged(f"{where}: truncated or not a Spark log file")
    return lines


def _read_offsets(path: Path, topics: set[str]) -> dict[str, dict[int, int]]:
    where = f"offsets/{path.name}"
    lines = _version_and_lines(path, 3)
    if not isinstance(_json(lines[1], where), dict):
        raise _Damaged(f"{where}: batch metadata is not an object")
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1:
        raise _Damaged(f"{where}: expected offsets of one source, found {len(sources)}")
    offsets = _json(sources[0], where)
    if not isinstance(offsets, dict) or set(offsets) - topics:
        wanted = ", ".join(repr(t) for t in sorted(topics))
        raise _Damaged(f"{where}: offsets are not for topic{'s' if len(topics) > 1 else ''} {wanted}")
    out = {}
    for name, parts in offsets.items():
        if not isinstance(parts, dict) or not all(
            isinstance(p, str) and p.isdigit() and type(o) is int and o >= 0 for p, o in parts.items()
        ):
            raise _Damaged(f"{where}: malformed partition offsets")
        out[name] = {int(p): o for p, o in parts.items()}
    return out


def _read_commit(path: Path, batch: int) -> None:
    lines = _version_and_lines(path, 2)
    if not isinstance(_json(lines[1], f"commits/{batch}"), dict):
        raise _Damaged(f"commits/{batch}: not a commit record")


# -- progress -----------------------------------------------------------------------------------------
def _not_ahead(ends: dict[int, int], batch: int, applied: AppliedFn, audit_path: Location | None,
               table: str | None, topic: str) -> None:
    """Refuse a checkpoint whose last committed batch ends beyond what the table applied."""
    ahead = {p: end for p, end in ends.items() if end > _done(applied(p)) + 1}
    if ahead and audit_path is not None and table is not None:
        # Batches before the table existed commit no Delta progress; their audit rows record it.
        covered = _audited_without_commit(audit_path, table, topic)
        ahead = {p: end for p, end in ahead.items() if end > covered.get(p, -1) + 1}
    if ahead:
        p, end = sorted(ahead.items())[0]
        raise _Damaged(
            f"its batch {batch} claims partition {p} is read up to offset {end - 1}, but the table has "
            f"applied only up to {_done(applied(p)) if applied(p) is not None else 'nothing'}; "
            "resuming from it would skip records"
        )


def _done(offset: int | None) -> int:
    return -1 if offset is None else offset


def _audited_without_commit(audit_path: Location, table: str, topic: str) -> dict[int, int]:
    rows = audit.read(audit_path, table=table)
    covered: dict[int, int] = {}
    for row in rows.to_pylist():
        if row.get("delta_version") is not None:
            continue
        for key, span in json.loads(row.get("offsets") or "{}").items():
            name, _, part = key.rpartition(":")
            if name == topic and part.isdigit():
                covered[int(part)] = max(covered.get(int(part), -1), int(span[1]))
    return covered
