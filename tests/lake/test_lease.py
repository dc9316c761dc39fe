"""One writer per table on an object store: the lease (ingest/lake/lease.py) against a real S3 API server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import boto3
import pytest
from harness.stack.s3 import S3Server

from ingest.errors import TableLockedError
from ingest.lake import locks
from ingest.lake.lease import Lease, LeaseLostError
from ingest.lake.location import LakePath, s3_client


def _root(s3: S3Server, bucket: str) -> LakePath:
    return LakePath(f"s3://{bucket}/lake", {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": "us-east-1",
                                           "AWS_ALLOW_HTTP": "true"})


def test_a_second_writer_is_refused_until_the_first_releases(s3, bucket):
    root = _root(s3, bucket)
    first = Lease(root, "orders", ttl=30).acquire()
    with pytest.raises(TableLockedError, match=f"pid {os.getpid()}") as refused:
        Lease(root, "orders", ttl=30).acquire()
    assert "lease is s3://" in str(refused.value)
    Lease(root, "customers", ttl=30).acquire().release()  # another table is another lease
    first.check()
    first.release()
    assert s3_client(root).list_objects_v2(Bucket=bucket, Prefix="lake/_cdc_locks/").get("KeyCount") == 0
    Lease(root, "orders", ttl=30).acquire().release()


def test_a_dead_holders_lease_expires_and_is_taken_over(s3, bucket):
    root = _root(s3, bucket)
    dead = Lease(root, "orders", ttl=1.0).acquire()
    dead._stop.set()  # the holder dies: nobody renews, nobody releases
    with pytest.raises(TableLockedError):
        Lease(root, "orders", ttl=1.0).acquire()
    time.sleep(2.5)  # Last-Modified has whole seconds
    heir = Lease(root, "orders", ttl=30).acquire()
    with pytest.raises(LeaseLostError, match="not renewed"):
        dead.check()
    heir.check()
    heir.release()


def test_a_holder_whose_lease_was_replaced_stops_before_its_next_commit(s3, bucket):
    root = _root(s3, bucket)
    holder = Lease(root, "orders", ttl=1.5).acquire()
    # Another run replaced the object (as a take-over after a long pause of this one would).
    s3_client(root).put_object(Bucket=bucket, Key=holder.location.key, Body=b'{"pid": 1}')
    deadline = time.monotonic() + 10
    while holder._lost is None and time.monotonic() < deadline:
        time.sleep(0.1)
    with pytest.raises(LeaseLostError, match="another run replaced it"):
        holder.check()
    holder.release()


def test_commits_check_the_lease_this_process_holds(s3, bucket):
    root = _root(s3, bucket)
    held = locks.acquire_all(root, ["orders", "customers"], lease_seconds=30)
    locks.check(root / "orders")
    held[0]._lost = "another run replaced it"  # as the renewer records it
    with pytest.raises(LeaseLostError):
        locks.check(root / "orders")
    locks.check(root / "customers")
    locks.check(root / "not_held")  # a table this process never leased: nothing to check
    locks.release_all(held)
    locks.check(root / "orders")  # released: no longer tracked


def test_acquire_all_takes_every_lease_or_none(s3, bucket):
    root = _root(s3, bucket)
    other = Lease(root, "customers", ttl=30).acquire()
    with pytest.raises(TableLockedError):
        locks.acquire_all(root, ["orders", "customers"], lease_seconds=30)
    Lease(root, "orders", ttl=30).acquire().release()  # orders was given back when customers was refused
    other.release()


def test_the_lease_keeps_a_writer_in_another_process_out(s3, bucket):
    """Two processes, no shared directory: the second one's lease is refused while the first renews."""
    root = _root(s3, bucket)
    script = ("import sys; from ingest.lake.location import LakePath; from ingest.lake.lease import Lease; "
              f"root = LakePath({root.uri!r}, {dict(root.options)!r}); "
              "Lease(root, 'orders', ttl=6).acquire(); print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=os.environ.copy())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        time.sleep(7)  # longer than its time-to-live: only its renewals keep it
        with pytest.raises(TableLockedError, match=f"pid {holder.pid}"):
            Lease(root, "orders", ttl=6).acquire()
    finally:
        holder.kill()
        holder.wait()
    # Killed on this machine: no renewal, no release, but its process is gone, so the restarted run
    # takes the lease over at once instead of waiting out its time-to-live.
    started = time.monotonic()
    Lease(root, "orders", ttl=600).acquire().release()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("where", "taken_over"), [
    ("this host, this boot, the pid now another process", True),
    ("this host, this boot, the holder alive", False),
    ("this host, another boot", False),
    ("another host", False),
    ("a lease without the process identity", False),
])
def test_only_a_holder_that_died_on_this_machine_loses_its_lease_before_expiry(s3, bucket, where, taken_over):
    import json
    import socket

    from ingest.lake.lease import _process_identity

    root = _root(s3, bucket)
    me = _process_identity(os.getpid())
    assert me is not None, "these tests run on Linux with /proc"
    boot, start = me.split(":")
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "process": me, "since": "then", "ttl_seconds": 600}
    if where.endswith("another process"):
        holder["process"] = f"{boot}:{int(start) - 1}"  # the pid was reused by a younger process
    elif where.endswith("another boot"):
        holder["process"] = f"not-{boot}:{start}"
    elif where == "another host":
        holder["host"] = "elsewhere.example"
        holder["process"] = f"{boot}:{int(start) - 1}"
    elif where.startswith("a lease without"):
        holder["process"] = None
        holder["pid"] = 2**22 + 1  # beyond pid_max: no such process here
    key = "lake/_cdc_locks/orders.lease"
    s3_client(root).put_object(Bucket=bucket, Key=key, Body=json.dumps(holder).encode())
    if taken_over:
        Lease(root, "orders", ttl=600).acquire().release()
    else:
        with pytest.raises(TableLockedError, match="another writer holds its lease"):
            Lease(root, "orders", ttl=600).acquire()


class LostAnswers:
    """A client of one lease's own that loses the store's next successful PutObject answers on their way
    back: the store has written the object, and botocore sends the request again as after a cut connection.
    (Its own client: the engine's are shared by every lease of an endpoint in the process.)"""

    def __init__(self, root: LakePath) -> None:
        self.armed = 0
        self.lost: list[int] = []  # the attempt whose answer was lost, per loss
        self.retried: list[int] = []  # the status of each retry's answer
        self.client = boto3.client("s3", endpoint_url=root.options["AWS_ENDPOINT_URL"], region_name="us-east-1")
        self.client.meta.events.register_first("needs-retry.s3.PutObject", self._lose)

    def _lose(self, response: tuple | None, attempts: int, **_: object) -> float | None:
        if response is not None and attempts > 1:
            self.retried.append(response[0].status_code)
        if response is None or response[0].status_code != 200 or self.armed == 0:
            return None
        self.armed -= 1
        self.lost.append(attempts)
        return 0.01  # retry, as botocore would after a connection error


def _owner_of(root: LakePath, lease: Lease) -> str:
    body = s3_client(root).get_object(Bucket=lease.location.bucket, Key=lease.location.key)["Body"].read()
    return json.loads(body)["owner"]


def test_a_lease_whose_answers_were_lost_stays_with_its_writer(s3, bucket):
    """The retry of a conditional put that had landed is refused (412): the writer holds the lease all
    the same, when it creates it, renews it and takes over an expired one."""
    root = _root(s3, bucket)
    answers = LostAnswers(root)
    first = Lease(root, "orders", ttl=1.5, client=answers.client)
    answers.armed = 1
    first.acquire()  # its create landed; the retry met the object it had created
    assert answers.lost == [1] and answers.retried == [412]
    assert _owner_of(root, first) == first._owner

    # A renewal (every half second) lands, and its retry is refused. A renewal within the second of
    # the one before writes the same bytes, whose ETag the retry's If-Match still names (it lands
    # again): lose answers until a retry is refused.
    deadline = time.monotonic() + 20
    while 412 not in answers.retried[1:] and time.monotonic() < deadline:
        answers.armed = 1
        while answers.armed and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    assert 412 in answers.retried[1:], answers.retried
    renewed = first._renewed_at
    while first._renewed_at == renewed and first._lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first._lost is None  # a later renewal went through: the lease is still this writer's
    assert first._renewed_at > renewed

    first._stop.set()  # now it dies: nobody renews, nobody releases
    time.sleep(2.5)  # expired (Last-Modified has whole seconds)
    heir_answers = LostAnswers(root)
    heir = Lease(root, "orders", ttl=30, client=heir_answers.client)
    heir_answers.armed = 1
    heir.acquire()  # its take-over (If-Match) landed; the retry met the object it had written
    assert heir_answers.lost == [1] and heir_answers.retried == [412]
    assert _owner_of(root, heir) == heir._owner
    heir.check()
    heir.release()
    assert s3_client(root).list_objects_v2(Bucket=bucket, Prefix="lake/_cdc_locks/").get("KeyCount") == 0
