"""boto3 is the `s3` extra: without it a local lake works as before, and a lake on S3 fails with one line
naming the extra (tests/packaging installs the wheel without it and runs on a local lake)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.errors import EnvironmentProblem
from ingest.lake import location
from ingest.lake.lease import Lease
from ingest.lake.location import LakePath
from ingest.stream import checkpoint


@pytest.fixture
def no_boto3(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Imports of boto3 and botocore fail, as where the extra is not installed."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("boto3", "botocore", "botocore.config", "botocore.exceptions"):
        monkeypatch.setitem(sys.modules, name, None)
    location._client.cache_clear()  # no client kept from an earlier test
    yield
    location._client.cache_clear()


@pytest.mark.usefixtures("no_boto3")
def test_a_lake_on_s3_names_the_extra() -> None:
    root = LakePath("s3://lake/tables", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    with pytest.raises(EnvironmentProblem) as caught:
        Lease(root, "orders", ttl=60.0)
    assert str(caught.value) == location.S3_EXTRA
    assert "cdc-lakehouse-ingest[s3]" in str(caught.value) and "\n" not in str(caught.value)
    assert location.s3_errors() == ()


@pytest.mark.usefixtures("no_boto3")
def test_a_local_checkpoint_is_checked_without_boto3(tmp_path: Path) -> None:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "0").write_text("v1\n{not json")
    (tmp_path / "metadata").write_text('{"id":"q"}\n')
    verdict = checkpoint.inspect(tmp_path, topic="db.t", applied=lambda partition: None)
    assert not verdict.ok and "offsets/0" in (verdict.problem or "")
