"""``ingest torture`` with the lake on an S3 server: kills during commits, and the server gone for 4 s.

The full run, on the stack's MinIO restarted for real, is ``ingest torture --lake s3`` (README).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.stack.s3 import S3Server
from harness.torture.run import Torture, TortureSpec

from ingest.config import load_config
from ingest.lake.location import s3_client
from tests.lake.outage import Relay


@pytest.fixture
def store(s3: S3Server) -> Iterator[tuple[str, Callable[[], float]]]:
    """The endpoint the runs use, and what restarts the store behind it."""
    if s3.pid is None:  # TEST_S3=stack: the stack's MinIO, restarted for real
        from harness.cli_stack import stack_lake

        yield s3.endpoint, stack_lake("unused")[2]
        return
    relay = Relay(s3.endpoint)  # moto: the relay goes away for 4 s (moto itself would lose its objects)
    yield relay.endpoint, relay.outage
    relay.close()


@pytest.mark.spark
def test_kills_during_commits_and_an_s3_outage_leave_the_lake_equal_to_the_source(
        s3: S3Server, store: tuple[str, Callable[[], float]], bucket: str, tmp_path: Path) -> None:
    endpoint, restart = store
    # Kills inside the MERGE and between the Delta commit and its audit row: the two that leave
    # objects behind on the store (uncommitted data files; a commit without its audit row).
    spec = TortureSpec(workdir=tmp_path / "torture", seed=5, kills=2, events=500, batch=120,
                       damage_probability=0.0, timer_fraction=0.0,
                       schedule=("during-merge@1", "after-delta-commit@1"), tables=("orders",),
                       lake_root=f"s3://{bucket}/lake", storage={**s3.storage(), "endpoint_url": endpoint},
                       restart_store=restart, store_restarts=1)
    lines: list[str] = []
    result = Torture(spec, say=lines.append).run()
    c = result.consistency
    assert c is not None
    assert result.ok, (result.failure, c.problems, lines)
    assert result.kills == {"during-merge": 1, "after-delta-commit": 1}, lines
    assert len(result.store_restarts) == 1 and result.store_restarts[0][2] >= 3.0, lines
    assert c.divergent_rows == 0 and c.duplicate_keys == 0 and c.unbalanced_audit_rows == 0
    assert c.commits > 0
    assert c.received == c.records > 0 and c.quarantined == c.malformed > 0

    # Every table lives in the bucket, none on the local disk, and no run left its lease behind.
    config = load_config(spec.workdir / "config.yaml")
    assert not config.tables_root.is_local and not list(spec.workdir.rglob("_delta_log"))
    client = s3_client(config.tables_root)
    assert client.list_objects_v2(Bucket=bucket, Prefix="lake/orders/_delta_log/")["KeyCount"] > 0
    assert client.list_objects_v2(Bucket=bucket, Prefix="lake/_cdc_locks/")["KeyCount"] == 0
