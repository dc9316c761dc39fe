"""A store that restarts: delta-rs, the lease and the checkpoint reads wait for it (``storage.retry_seconds``)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pyarrow as pa
import pytest
from harness.stack.s3 import S3Server

from ingest.errors import LakeUnavailableError
from ingest.lake.delta import open_table, write_table
from ingest.lake.lease import Lease
from ingest.lake.location import LakePath, delta_storage_options, s3_client, unavailable
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
        monkeypatch: pytest.MonkeyPatch, refused_port: int) -> None:
    """botocore's own pauses start at 50 ms and are drawn at random: a count of attempts can last well
    under a second. Against an address nobody answers, the lease's client keeps trying for
    ``retry_seconds`` and then fails; without retry seconds it fails at once."""
    from botocore.exceptions import EndpointConnectionError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")  # a request is signed before it connects
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    nobody = f"http://127.0.0.1:{refused_port}"
    for seconds, within in ((3, (3.0, 15.0)), (3, (3.0, 15.0)), (0, (0.0, 2.0))):  # twice: the same client
        where = LakePath(f"s3://b{seconds}/lake", delta_storage_options(
            endpoint_url=nobody, region="us-east-1", path_style=True, allow_http=True, retry_seconds=seconds))
        started = time.monotonic()
        with pytest.raises(EndpointConnectionError):
            s3_client(where).head_bucket(Bucket=where.bucket)
        took = time.monotonic() - started
        assert within[0] <= took < within[1], (seconds, took)


def test_a_lease_the_store_does_not_answer_for_is_one_line_naming_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                                             refused_port: int) -> None:
    """The run ended in botocore's "EndpointConnectionError: Could not connect to the endpoint URL"."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    nobody = f"http://127.0.0.1:{refused_port}"
    root = LakePath("s3://b/lake", delta_storage_options(endpoint_url=nobody, region="us-east-1", path_style=True,
                                                         allow_http=True, retry_seconds=0))
    with pytest.raises(LakeUnavailableError) as info:
        Lease(root, "t", ttl=60).acquire()
    assert str(info.value) == ("lake s3://b/lake/_cdc_locks/t.lease: the store's endpoint does not answer "
                               "(target.storage.endpoint_url)")


@pytest.mark.parametrize(("error", "cause"), [
    ('Could not connect to the endpoint URL: "http://127.0.0.1:40395/b/lake/_cdc_locks/t.lease"',
     "the store's endpoint does not answer (target.storage.endpoint_url)"),
    ("An error occurred (403) when calling the HeadObject operation: Forbidden",
     "the store refused the credentials (access denied)"),
    ("Generic S3 error: Client error with status 403 Forbidden: No Body",
     "the store refused the credentials (access denied)"),
    ("An error occurred (AccessDenied) when calling the PutObject operation: Access Denied",
     "the store refused the credentials (access denied)"),
])
def test_a_403_in_a_url_is_not_a_refusal(error: str, cause: str) -> None:
    """An endpoint on port 40395 that did not answer was reported as "refused the credentials": the
    needle "403" matched the port (this file's lease test failed so when its free port was 403xx)."""
    where = LakePath("s3://b/lake/_cdc_locks/t.lease", {})
    assert unavailable(where, RuntimeError(error)) == f"lake s3://b/lake/_cdc_locks/t.lease: {cause}"


@pytest.mark.parametrize("error", [
    "Generic S3 error: Error after 10 retries in 2.1s, max_retries:10, retry_timeout:180s, source:error sending "
    "request for url (http://127.0.0.1:9000/b/lake/credentials/_delta_log/_last_checkpoint)",
    'Could not connect to the endpoint URL: "http://127.0.0.1:9000/b/lake/credentials/_delta_log/0.json"',
    "Object at location lake/credentials/_delta_log/0.json not found: tcp connect error",
])
def test_a_path_that_names_credentials_is_not_a_missing_credential(error: str) -> None:
    """A table called "credentials" on an endpoint that did not answer was reported as "no usable S3
    credentials": the needle "credential" matched its path."""
    where = LakePath("s3://b/lake/credentials", {})
    assert unavailable(where, RuntimeError(error)) == ("lake s3://b/lake/credentials: the store's endpoint does not "
                                                      "answer (target.storage.endpoint_url)")


def test_imds_in_a_url_still_says_the_credentials_are_missing() -> None:
    error = "Generic S3 error: Error performing token request: http://169.254.169.254/latest/api/token"
    assert unavailable(LakePath("s3://b/lake", {}), RuntimeError(error)).endswith("no usable S3 credentials: set "
                                                                                 "AWS_ACCESS_KEY_ID and "
                                                                                 "AWS_SECRET_ACCESS_KEY (environment "
                                                                                 "or secrets_file)")


def test_a_store_that_does_not_answer_is_said_once_while_it_is_waited_for(caplog: pytest.LogCaptureFixture) -> None:
    """A run against a wrong endpoint printed nothing for retry_seconds (two minutes by default)."""
    from botocore.exceptions import EndpointConnectionError

    from ingest.lake.location import _RideOut

    ride, away = _RideOut(60.0, "http://store:9000"), EndpointConnectionError(endpoint_url="http://store:9000/b")
    with caplog.at_level(logging.WARNING, logger="ingest.lake.location"):
        assert ride(1, {"context": {}}, caught_exception=away) == pytest.approx(0.2)
        assert ride(2, {"context": {"ingest_first_failure": time.monotonic()}}, caught_exception=away)
        assert ride(1, {"context": {}}, caught_exception=away)  # another request, the same outage
    assert [r.getMessage() for r in caplog.records] == [
        "the object store at http://store:9000 does not answer (EndpointConnectionError); trying again for up "
        "to 60 s (target.storage.retry_seconds)"]


def test_a_table_on_an_endpoint_that_takes_no_connection_is_said_before_delta_rs_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    """delta-rs retries silently: `ingest status` against a wrong endpoint_url seemed to hang for two minutes."""
    from ingest.lake.location import say_if_away

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))
        up, down = (f"http://127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))

        def at(endpoint: str, seconds: int) -> LakePath:
            return LakePath("s3://b/lake/t", delta_storage_options(
                endpoint_url=endpoint, region="us-east-1", path_style=True, allow_http=True, retry_seconds=seconds))

        with caplog.at_level(logging.WARNING, logger="ingest.lake.location"):
            say_if_away(at(up, 30))
            say_if_away(at(down, 0))  # no wait to announce: the command fails at once
            say_if_away(at(down, 30))
            say_if_away(at(down, 30))  # once per endpoint and process
    assert [r.getMessage() for r in caplog.records] == [
        f"the object store at {down} does not answer (Connection refused); trying again for up to 30 s "
        "(target.storage.retry_seconds)"]


def test_a_store_that_answers_not_implemented_is_not_waited_for() -> None:
    """A 503 is a store restarting or overloaded: it is waited for. A 501 is what a store says of what
    it will never do (a conditional put it does not support): that fails at once, not after minutes."""
    from ingest.lake.location import _RideOut

    class Answer:
        def __init__(self, status: int) -> None:
            self.status_code = status

    ride = _RideOut(60.0, "http://store")
    assert ride(1, {"context": {}}, response=(Answer(503), {})) == pytest.approx(0.2)
    assert ride(1, {"context": {}}, response=(Answer(501), {})) is None
    assert ride(1, {"context": {}}, response=(Answer(404), {})) is None
    late = {"context": {"ingest_first_failure": time.monotonic() - 61}}
    assert ride(5, late, response=(Answer(503), {})) is None  # past retry_seconds: botocore decides
