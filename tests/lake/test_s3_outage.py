"""A store that restarts: delta-rs, the lease and the checkpoint reads wait for it (``storage.retry_seconds``)."""

from __future__ import annotations

import socket
import threading
import time

import pyarrow as pa
import pytest
from harness.stack.s3 import S3Server

from ingest.lake.delta import open_table, write_table
from ingest.lake.lease import Lease
from ingest.lake.location import LakePath, delta_storage_options, s3_client
from tests.lake.outage import Relay


def _lake(relay: Relay, bucket: str, retry_seconds: float) -> LakePath:
    return LakePath(f"s3://{bucket}/lake", delta_storage_options(
        endpoint_url=relay.endpoint, region="us-east-1", path_style=True, allow_http=True,
        retry_seconds=retry_seconds))


def _during_outage(relay: Relay, seconds: float) -> threading.Thread:
    gone = threading.Thread(target=relay.outage, args=(seconds,))
    gone.start()
    time.sleep(0.3)  # the relay is down now
    return gone


def test_commits_and_the_lease_ride_out_a_restart_shorter_than_retry_seconds(s3: S3Server, bucket: str) -> None:
    relay = Relay(s3.endpoint)
    try:
        lake = _lake(relay, bucket, retry_seconds=60)
        write_table(lake / "t", pa.table({"id": [1, 2]}), mode="append")

        gone = _during_outage(relay, 3.0)
        started = time.monotonic()
        write_table(lake / "t", pa.table({"id": [3, 4]}), mode="append")
        assert time.monotonic() - started > 2.0  # it did wait for the store
        gone.join()

        gone = _during_outage(relay, 3.0)
        lease = Lease(lake, "t", ttl=30).acquire()
        gone.join()
        lease.check()
        lease.release()

        table = open_table(lake / "t")
        assert table is not None and sorted(table.to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 4]

        # Without retries the same restart fails the commit, and nothing of it lands.
        hasty = _lake(relay, bucket, retry_seconds=0)
        gone = _during_outage(relay, 3.0)
        with pytest.raises(OSError, match=r"(?i)connect|refused|error sending"):
            write_table(hasty / "t", pa.table({"id": [5]}), mode="append")
        gone.join()
        assert open_table(lake / "t").to_pyarrow_table().num_rows == 4
    finally:
        relay.close()


def test_the_boto3_client_retries_for_retry_seconds_not_for_a_number_of_attempts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's own pauses start at 50 ms and are drawn at random: a count of attempts can last well
    under a second. Against an address nobody answers, the lease's client keeps trying for
    ``retry_seconds`` and then fails; without retry seconds it fails at once."""
    from botocore.exceptions import EndpointConnectionError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")  # a request is signed before it connects
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}"
    for seconds, within in ((3, (3.0, 15.0)), (3, (3.0, 15.0)), (0, (0.0, 2.0))):  # twice: the same client
        where = LakePath(f"s3://b{seconds}/lake", delta_storage_options(
            endpoint_url=nobody, region="us-east-1", path_style=True, allow_http=True, retry_seconds=seconds))
        started = time.monotonic()
        with pytest.raises(EndpointConnectionError):
            s3_client(where).head_bucket(Bucket=where.bucket)
        took = time.monotonic() - started
        assert within[0] <= took < within[1], (seconds, took)


def test_a_store_that_answers_not_implemented_is_not_waited_for() -> None:
    """A 503 is a store restarting or overloaded: it is waited for. A 501 is what a store says of what
    it will never do (a conditional put it does not support): that fails at once, not after minutes."""
    from ingest.lake.location import _RideOut

    class Answer:
        def __init__(self, status: int) -> None:
            self.status_code = status

    ride = _RideOut(60.0)
    assert ride(1, {"context": {}}, response=(Answer(503), {})) == pytest.approx(0.2)
    assert ride(1, {"context": {}}, response=(Answer(501), {})) is None
    assert ride(1, {"context": {}}, response=(Answer(404), {})) is None
    late = {"context": {"ingest_first_failure": time.monotonic() - 61}}
    assert ride(5, late, response=(Answer(503), {})) is None  # past retry_seconds: botocore decides
