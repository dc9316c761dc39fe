"""One writer per table on an object store: a lease object written with S3 conditional puts.

An object store has no ``flock`` and no rename, and the runs that share a lake may be on different
machines. So a run takes ``<lake>/_cdc_locks/<table>.lease`` by creating it with ``If-None-Match: *``:
the store accepts exactly one such create. The holder renews it every third of its time-to-live
with ``If-Match: <its ETag>``, so it stays the holder only as long as nobody replaced the object.
A lease whose object was not renewed for its time-to-live is expired; another run may then replace
it, again with ``If-Match``, so that of two runs taking over at once exactly one wins.

Expiry is judged on the store's clock alone (the ``Date`` of the answer against the object's
``Last-Modified``), so the writers' clocks need not agree. A holder that cannot renew (the store
does not answer, or the lease was taken over after a long pause) knows it no longer holds the
table: :meth:`Lease.check` raises before the next commit. Delta's own conditional commit is the
second line of defence: a writer that was paused past its lease cannot overwrite a commit, it
conflicts (delta-rs writes each log entry with a create-only put).

A run restarted on the machine where the holder died need not wait for the expiry: the lease names
its holder's host, boot and process start time, and a holder on this host and boot whose process is
gone (or is another process with the same pid) is dead for sure, so its lease is taken over at once
(again with ``If-Match``). A holder on another machine is only ever judged by its expiry.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Final

from ingest.errors import IngestError, LakeUnavailableError, TableLockedError
from ingest.lake.location import LakePath, s3_client, unavailable

log = logging.getLogger(__name__)

#: S3 answers to a failed condition: 412 (the object changed or exists), 409 (a concurrent conditional write).
_LOST_RACE: Final = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})


class LeaseLostError(IngestError):
    """This run no longer holds a table's lease (another run took it over, or it could not renew in time).

    Transient: the table stops now, before it commits anything more, and a later attempt tries to
    take the lease again (and fails cleanly while the other run holds it).
    """

    transient = True

    def __init__(self, table: str, reason: str) -> None:
        super().__init__(f"table {table}: lost its writer lease ({reason}); stopped before committing")
        self.table = table


def _code(exc: Exception) -> str:
    response: Mapping[str, Any] = getattr(exc, "response", {}) or {}
    return str(response.get("Error", {}).get("Code", ""))


class Lease:
    """The writer lease of one table, held from :meth:`acquire` until :meth:`release`.

    Args:
        root: the lake (an object-store location).
        table: the table's name.
        ttl: seconds the lease lives without renewal.
        client: a boto3 S3 client (default: one for ``root``'s endpoint).
    """

    def __init__(self, root: LakePath, table: str, *, ttl: float, client: Any = None) -> None:
        self.table = table
        self.table_path = root / table
        self.location = root / "_cdc_locks" / f"{table}.lease"
        self.ttl = ttl
        self._s3 = client or s3_client(root)
        self._owner = uuid.uuid4().hex
        self._etag: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renewed_at = 0.0

    # -- taking it ----------------------------------------------------------------------------
    def acquire(self) -> Lease:
        """Take the lease or fail at once.

        Raises:
            TableLockedError: another run holds a lease that has not expired; names the holder.
            LakeUnavailableError: the store refused the lease or did not answer.
        """
        # botocore: only for a lake on S3
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._etag = self._put(IfNoneMatch="*")
        except ClientError as exc:
            if _code(exc) not in _LOST_RACE:
                raise self._refused(exc, "s3:PutObject") from None
            self._take_over_expired()
        except BotoCoreError as exc:  # the store did not answer for target.storage.retry_seconds
            raise LakeUnavailableError(unavailable(self.location, exc)) from None
        self._renewed_at = time.monotonic()
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.table}", daemon=True)
        self._renewer.start()
        return self

    def _refused(self, exc: Exception, permission: str) -> LakeUnavailableError:
        """The store's refusal of the lease, in one line naming the permission it takes."""
        code = _code(exc) or type(exc).__name__
        hint = (f"the credentials lack {permission} there (docs/operations.md#s3-permissions)"
                if code in {"AccessDenied", "403"} else "the store refused it")
        return LakeUnavailableError(f"lake {self.location}: could not take table {self.table}'s writer lease: "
                                    f"{hint} ({code})")

    def _take_over_expired(self) -> None:
        # botocore: only for a lake on S3
        from botocore.exceptions import ClientError

        try:
            current = self._s3.get_object(Bucket=self.location.bucket, Key=self.location.key)
        except ClientError as exc:
            if _code(exc) in {"NoSuchKey", "404"}:  # released in between: try once more from scratch
                self._etag = self._put(IfNoneMatch="*")
                return
            raise self._refused(exc, "s3:GetObject") from None
        body = current["Body"].read().decode("utf-8", "replace")
        if _owner(body) == self._owner:  # our own create, answered after a retry as if someone else's
            self._etag = str(current["ETag"])
            return
        holder, ttl = _describe(body)
        server_now = parsedate_to_datetime(current["ResponseMetadata"]["HTTPHeaders"]["date"])
        age = (server_now - current["LastModified"]).total_seconds()
        dead = _died_here(body)
        if age <= ttl and not dead:
            raise TableLockedError(
                self.table, f"another writer holds its lease ({holder}, renewed {age:.0f} s ago, expires after "
                f"{ttl:.0f} s without renewal); only one `ingest run` may write a table at a time. Wait for it "
                f"to finish or stop it; the lease is {self.location}", holder)
        try:
            self._etag = self._put(IfMatch=current["ETag"])
        except ClientError as exc:
            if _code(exc) not in _LOST_RACE:
                raise self._refused(exc, "s3:PutObject") from None
            if not self._still_ours():  # else a retried take-over whose first attempt had landed
                raise TableLockedError(self.table, f"another writer took over its expired lease first; the lease "
                                       f"is {self.location}", "another run") from None
        if dead:
            log.warning("table %s: took over the lease of a run that died on this machine (%s)", self.table, holder)
        else:
            log.warning("table %s: took over a lease that expired %.0f s ago (%s)", self.table, age - ttl, holder)

    def _put(self, **condition: str) -> str:
        body = json.dumps({"owner": self._owner, "pid": os.getpid(), "host": socket.gethostname(),
                           "process": _process_identity(os.getpid()),
                           "since": datetime.now(UTC).isoformat(timespec="seconds"), "ttl_seconds": self.ttl})
        answer = self._s3.put_object(Bucket=self.location.bucket, Key=self.location.key, Body=body.encode(),
                                     ContentType="application/json", **condition)
        return str(answer["ETag"])

    # -- keeping it ---------------------------------------------------------------------------
    def _renew_loop(self) -> None:
        # botocore: only for a lake on S3
        from botocore.exceptions import BotoCoreError, ClientError

        while not self._stop.wait(self.ttl / 3):
            try:
                self._etag = self._put(IfMatch=self._etag or "")
                self._renewed_at = time.monotonic()
            except ClientError as exc:
                if _code(exc) in _LOST_RACE and self._still_ours():
                    continue  # a retried renewal whose first attempt had landed
                if _code(exc) in _LOST_RACE | {"NoSuchKey", "404"}:
                    self._lost = "another run replaced it"
                    log.error("table %s: its writer lease was taken over; the table stops", self.table)
                    return
                log.warning("table %s: could not renew its lease: %s", self.table, _code(exc) or exc)
            except BotoCoreError as exc:  # the store does not answer: keep trying while the lease lasts
                log.warning("table %s: could not renew its lease: %s", self.table, type(exc).__name__)

    def _still_ours(self) -> bool:
        """Whether the lease object is (still) this run's own, taking its current ETag if so."""
        # botocore: only for a lake on S3
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            current = self._s3.get_object(Bucket=self.location.bucket, Key=self.location.key)
        except (ClientError, BotoCoreError):
            return False
        if _owner(current["Body"].read().decode("utf-8", "replace")) != self._owner:
            return False
        self._etag = str(current["ETag"])
        self._renewed_at = time.monotonic()
        return True

    def check(self) -> None:
        """Raise unless this run still holds the lease with time to spare for a commit.

        Raises:
            LeaseLostError: it was taken over, or not renewed for two thirds of its time-to-live.
        """
        if self._lost:
            raise LeaseLostError(self.table, self._lost)
        if time.monotonic() - self._renewed_at > self.ttl * 2 / 3:
            raise LeaseLostError(self.table, f"not renewed for {time.monotonic() - self._renewed_at:.0f} s")

    # -- giving it back -------------------------------------------------------------------------
    def release(self) -> None:
        # botocore: only for a lake on S3
        from botocore.exceptions import BotoCoreError, ClientError

        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=15)
            self._renewer = None
        if self._etag is None or self._lost:
            return
        try:
            self._s3.delete_object(Bucket=self.location.bucket, Key=self.location.key, IfMatch=self._etag)
        except ClientError as exc:
            if _code(exc) not in _LOST_RACE | {"NoSuchKey", "404"}:
                log.warning("table %s: could not release its lease (it expires by itself): %s", self.table, _code(exc))
        except BotoCoreError as exc:
            log.warning("table %s: could not release its lease (it expires by itself): %s", self.table,
                        type(exc).__name__)
        self._etag = None


def _process_identity(pid: int) -> str | None:
    """``<boot id>:<start time>`` of a live process on this machine; ``None`` if there is no such process
    (or no ``/proc`` to tell). A pid reused after the holder died has another start time."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 of stat; counted after the command name, which is in parentheses and may hold spaces.
    return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"


def _died_here(body: str) -> bool:
    """Whether the lease's holder ran on this host in this boot and its process is gone."""
    mine = _process_identity(os.getpid())
    try:
        info = json.loads(body)
        host, pid, recorded = info["host"], int(info["pid"]), info.get("process")
    except (ValueError, KeyError, TypeError):
        return False
    if mine is None or not isinstance(recorded, str) or host != socket.gethostname():
        return False
    if recorded.split(":", 1)[0] != mine.split(":", 1)[0]:
        return False  # written in another boot (or by another machine of that name): expiry alone decides
    return _process_identity(pid) != recorded


def _owner(body: str) -> str | None:
    try:
        owner = json.loads(body).get("owner")
    except (ValueError, AttributeError):
        return None
    return owner if isinstance(owner, str) else None


def describe_holder(content: str) -> str:
    """Who holds a lock or lease, from what it wrote there (pid, host, since), for the refusal message."""
    try:
        info = json.loads(content)
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def _describe(body: str) -> tuple[str, float]:
    try:
        ttl = float(json.loads(body)["ttl_seconds"])
    except (ValueError, KeyError, TypeError):
        ttl = 60.0
    return describe_holder(body), ttl
