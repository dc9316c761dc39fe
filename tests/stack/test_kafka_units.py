"""The Kafka component's own logic, without starting anything."""

from __future__ import annotations

import uuid
from pathlib import Path
from unittest import mock

from harness.stack import kafka


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    # 0xF8 makes the first base64 character '-' (index 62): the storage tool would take it for an option.
    dashed, plain = uuid.UUID(bytes=b"\xf8" + b"\x01" * 15), uuid.UUID(bytes=b"\x10" + b"\x01" * 15)
    with mock.patch.object(kafka.uuid, "uuid4", side_effect=[dashed, plain]):
        assert kafka.new_cluster_id() == "EAEBAQEBAQEBAQEBAQEBAQ"
    assert all(not kafka.new_cluster_id().startswith("-") for _ in range(2000))


def test_a_dashed_cluster_id_left_by_an_older_version_is_replaced(tmp_path: Path) -> None:
    from harness.stack.settings import StackSettings

    settings = StackSettings.from_env({"STACK_DIR": str(tmp_path / "stack")}, create=True)
    component = kafka.Kafka(settings, lambda _message: None)
    component.dir.mkdir(parents=True)
    (component.dir / "cluster.id").write_text("-AbCdEfGhIjKlMnOpQrStUv\n")
    with mock.patch.object(kafka.subprocess, "run", return_value=mock.Mock(returncode=0)) as run, \
            mock.patch.object(kafka.Kafka, "_java", return_value=["java"]):
        component.prepare()
    written = (component.dir / "cluster.id").read_text().strip()
    cmd = run.call_args.args[0]
    assert not written.startswith("-") and cmd[cmd.index("--cluster-id") + 1] == written
