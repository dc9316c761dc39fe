"""Lake locations and their configuration: URIs, storage options, what is refused and why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ingest.config import load_config
from ingest.errors import ConfigError
from ingest.lake.location import LakePath


def test_an_s3_location_joins_names_and_keeps_its_options():
    root = LakePath("s3://lake/prefix", {"AWS_REGION": "eu-west-1"})
    table = root / "orders"
    assert table.uri == "s3://lake/prefix/orders"
    assert (table.name, table.bucket, table.key) == ("orders", "lake", "prefix/orders")
    assert table.parent == root and not table.is_local
    assert table.storage_options == {"AWS_REGION": "eu-west-1"}
    assert LakePath("s3://lake").parent == LakePath("s3://lake")
    with pytest.raises(ValueError, match="object store"):
        os.fspath(table)  # never a file named "s3:" in the working directory


def test_a_local_location_is_a_path(tmp_path: Path):
    root = LakePath.of(tmp_path)
    assert root.is_local and root.storage_options is None
    assert (root / "t").local == tmp_path / "t" and os.fspath(root / "t") == str(tmp_path / "t")
    assert (root / "t").parent == root


def _config(tmp_path: Path, **target) -> Path:
    raw = {"workdir": ".", "target": target, "tables": [{"name": "t", "topic": "db.t"}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_an_s3_root_gives_tables_with_the_endpoint_options(tmp_path: Path):
    cfg = load_config(_config(tmp_path, root="s3a://lake/cdc/", storage={"endpoint_url": "http://127.0.0.1:9000"}))
    table = cfg.table_path("t")
    assert table.uri == "s3://lake/cdc/t"
    assert table.storage_options == {"AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                     "AWS_ALLOW_HTTP": "true", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
                                     "max_retries": "1000", "retry_timeout": "120s",
                                     "backoff_config.init_backoff": "200ms", "backoff_config.max_backoff": "10s"}
    assert not cfg.lake_is_local


def test_checkpoints_go_to_s3_with_the_lakes_endpoint_or_stay_under_workdir(tmp_path: Path):
    cfg = load_config(_config(tmp_path, root="tables", checkpoint_dir="s3a://lake/ckpt/",
                              storage={"endpoint_url": "http://127.0.0.1:9000"}))
    assert cfg.checkpoint_location.uri == "s3://lake/ckpt"
    assert cfg.checkpoint_location.options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert cfg.checkpoint_location.spark_uri == "s3a://lake/ckpt"
    with pytest.raises(ValueError, match="object store"):
        _ = cfg.checkpoint_root  # the tools that edit checkpoint files work on local ones only
    local = load_config(_config(tmp_path, root="tables"))
    assert local.checkpoint_root == tmp_path / "checkpoints" and local.checkpoint_location.is_local


def test_a_local_root_stays_under_workdir(tmp_path: Path):
    cfg = load_config(_config(tmp_path, root="tables"))
    assert cfg.table_path("t") == LakePath(str(tmp_path / "tables" / "t")) and cfg.lake_is_local


@pytest.mark.parametrize(("target", "message"), [
    ({"root": "gs://lake/x"}, "not supported yet"),
    ({"root": "s3://"}, "expected s3://bucket"),
    ({"root": "s3://lake", "storage": {"endpoint_url": "http://key:secret@127.0.0.1:9000"}},
     "must not contain credentials"),
    ({"root": "s3://lake", "checkpoint_dir": "gs://lake/checkpoints"}, "not supported yet"),
    ({"root": "s3://lake", "storage": {"lease_seconds": 1}}, "lease_seconds"),
])
def test_what_an_object_store_lake_refuses(tmp_path: Path, target: dict, message: str):
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(_config(tmp_path, **target))
    assert "key:secret" not in str(caught.value)  # the message never echoes a credential


def test_object_store_keys_in_the_secrets_file_reach_the_environment_and_are_redacted(tmp_path: Path, monkeypatch):
    from ingest.secrets import redact

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "placeholder")  # so that teardown puts back what was there before,
        monkeypatch.delenv(name)  # including the keys load_config is about to export
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text('AWS_ACCESS_KEY_ID: "key-from-file"\nAWS_SECRET_ACCESS_KEY: "s3cr3t-from-file"\n')
    secrets.chmod(0o600)
    path = _config(tmp_path, root="s3://lake/cdc")
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "secrets_file": "secrets.yaml"}))
    cfg = load_config(path)
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "s3cr3t-from-file"
    assert "s3cr3t-from-file" not in redact("denied for s3cr3t-from-file")
    assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in str(cfg.table_path("t").storage_options)
