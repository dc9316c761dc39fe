"""Is a table's Spark checkpoint still safe to resume from? (docs/architecture.md#progress-lives-in-the-table)

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

A checkpoint may be a local directory or an ``s3://`` prefix (``target.checkpoint_dir``); it is read
the same way from either, its files listed once.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ingest import secrets
from ingest.lake.location import LakePath, Location, s3_client, s3_errors
from ingest.records import audit

log = logging.getLogger(__name__)

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


def inspect(directory: Location, *, topic: str | None = None, applied: AppliedFn | None = None,
            audit_path: Location | None = None, table: str | None = None,
            topics: Mapping[str, tuple[AppliedFn, str]] | None = None, others: Collection[str] = ()) -> Verdict:
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
        others: topics the query reads for no table (a transaction topic): allowed, not checked.

    Returns:
        The verdict; its ``problem`` says what is wrong, for the warning.
    """
    if topics is None:
        assert topic is not None and applied is not None
        topics = {topic: (applied, table or "")}
    files = _Files(LakePath.of(directory))
    try:
        offsets = files.batches("offsets")
        commits = files.batches("commits")
        if not offsets and not commits:
            return Verdict()  # missing, or created but never used; Spark starts it afresh
        _read_metadata(files)
        if commits and not offsets:
            raise _Damaged("commit log without an offsets log")
        ids = sorted(offsets)
        if ids != list(range(ids[0], ids[-1] + 1)):
            raise _Damaged(f"offsets log has gaps (batches {ids[0]}..{ids[-1]}, {len(ids)} files)")
        last_commit = max(commits, default=None)
        if last_commit is not None and not (ids[-1] - 1 <= last_commit <= ids[-1]):
            raise _Damaged(f"commit log ends at batch {last_commit} but the offsets log at {ids[-1]}")
        parsed = {batch: _read_offsets(files, name, set(topics) | set(others)) for batch, name in offsets.items()}
        for batch, name in commits.items():
            _read_commit(files, name, batch)
        if last_commit is not None:
            for name, ends in parsed[last_commit].items():
                if name not in topics:
                    continue  # read for no table
                fn, owner = topics[name]
                _not_ahead(ends, last_commit, fn, audit_path, owner or None, name)
    except _Damaged as exc:
        return Verdict(str(exc))
    return Verdict()


def batch_offsets(directory: Location, batch: int, topics: Collection[str]) -> dict[str, dict[int, int]] | None:
    """Where micro-batch ``batch`` ends, as Spark wrote it in the offsets log before running it; ``None``
    when that file is missing or unreadable. The file is read alone (the checkpoint is not listed):
    the stream's own writer has just written it, so it is not checked against its ``.crc``."""
    files = _Files(LakePath.of(directory), listed=False)
    try:
        return _read_offsets(files, f"offsets/{batch}", set(topics))
    except _Damaged:  # missing or unreadable too (_verified_text)
        return None


def exists(directory: Location) -> bool:
    """Whether the checkpoint has any file (on an object store: any object under its prefix)."""
    return bool(_Files(LakePath.of(directory)).names)


def discard(directory: Location) -> None:
    """Delete a checkpoint (progress then comes from the table's Delta log)."""
    where = LakePath.of(directory)
    if where.is_local:
        shutil.rmtree(where.local, ignore_errors=True)
        return

    keys = [f"{where.key}/{name}" for name in _Files(where).names]
    for start in range(0, len(keys), 1000):  # the most one DeleteObjects request takes
        s3_client(where).delete_objects(Bucket=where.bucket, Delete={
            "Objects": [{"Key": k} for k in keys[start:start + 1000]], "Quiet": True})


def discard_or_warn(directory: Location, who: str, if_kept: str) -> None:
    """:func:`discard`, where a store that refuses is worth a warning and not a failure: ``who``
    (a run, a query) and ``if_kept`` (what keeping it costs) say so in the warning."""
    try:
        discard(directory)
    except Exception as exc:
        log.warning("%s: could not discard the Spark checkpoint %s (%s); %s", who, directory,
                    secrets.describe(exc), if_kept)


# -- files ------------------------------------------------------------------------------------------
class _Files:
    """The files of one checkpoint, by path relative to it (``offsets/3``), listed once."""

    def __init__(self, directory: LakePath, *, listed: bool = True) -> None:
        self.directory = directory
        if not listed:  # to read a file whose name is known, without a listing (nor its checksum)
            self.names: set[str] = set()
        elif directory.is_local:
            root = directory.local
            self.names = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} \
                if root.is_dir() else set()
        else:

            prefix = f"{directory.key}/"
            pages = s3_client(directory).get_paginator("list_objects_v2").paginate(
                Bucket=directory.bucket, Prefix=prefix)
            self.names = {o["Key"][len(prefix):] for page in pages for o in page.get("Contents", [])}

    def batches(self, folder: str) -> dict[int, str]:
        # Like Spark, look only at batch files; hidden checksums and temporary files are not batches.
        found = (n.split("/", 1)[1] for n in self.names if n.startswith(f"{folder}/") and n.count("/") == 1)
        return {int(base): f"{folder}/{base}" for base in found if base.isdigit()}

    def read(self, name: str) -> bytes:
        if self.directory.is_local:
            return (self.directory.local / name).read_bytes()

        answer = s3_client(self.directory).get_object(Bucket=self.directory.bucket, Key=f"{self.directory.key}/{name}")
        return bytes(answer["Body"].read())


def _verified_text(files: _Files, name: str) -> str:
    """File content, checked against its Hadoop ``.crc`` (CRC32 per 512-byte chunk) when present."""
    try:
        data = files.read(name)
    except OSError as exc:
        raise _Damaged(f"{name}: unreadable ({exc.strerror})") from None
    except s3_errors() as exc:  # checkpoints on S3
        raise _Damaged(f"{name}: unreadable ({exc})") from None
    folder, _, base = name.rpartition("/")
    crc = f"{folder}/.{base}.crc" if folder else f".{base}.crc"
    if crc in files.names:
        raw = files.read(crc)
        if raw[:4] != _CRC_MAGIC or len(raw) < 8:
            raise _Damaged(f"{crc}: not a checksum file")
        (chunk,) = struct.unpack(">I", raw[4:8])
        expected = raw[8:]
        actual = b"".join(struct.pack(">I", zlib.crc32(data[i:i + chunk])) for i in range(0, len(data), chunk or 1))
        if chunk <= 0 or actual != expected:
            raise _Damaged(f"{name}: checksum mismatch (file truncated or overwritten)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Damaged(f"{name}: not text") from None


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise _Damaged(f"{where}: not valid JSON") from None


def _read_metadata(files: _Files) -> None:
    if "metadata" not in files.names:
        raise _Damaged("metadata file is missing")
    meta = _json(_verified_text(files, "metadata"), "metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        raise _Damaged("metadata file has no query id")


def _version_and_lines(files: _Files, name: str, least: int) -> list[str]:
    lines = _verified_text(files, name).split("\n")
    where = name
    if len(lines) < least or not lines[0].startswith("v") or not lines[0][1:].isdigit():
        raise _Damaged(f"{where}: truncated or not a Spark log file")
    return lines


def _read_offsets(files: _Files, name: str, topics: set[str]) -> dict[str, dict[int, int]]:
    where = name
    lines = _version_and_lines(files, name, 3)
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


def _read_commit(files: _Files, name: str, batch: int) -> None:
    lines = _version_and_lines(files, name, 2)
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
