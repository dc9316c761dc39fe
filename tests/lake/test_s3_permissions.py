"""The runbook "S3 permissions" (docs/operations.md): the policy it gives is enough, and a missing
permission is one line naming it.

The S3 server here enforces IAM policies (moto's access control, switched on after the set-up): the
engine runs with the keys of a user whose only policy is the runbook's, writes a lake on S3, runs
again and maintains it (compaction, vacuum: deletes). A user without ``s3:PutObject`` gets one line
naming the permission, no traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import requests
import yaml
from harness.stack.s3 import S3Server

from ingest.config import load_config
from tests.dagster.conftest import produce
from tests.harness import ingest_cli

#: The runbook's policy, for a lake under s3://<bucket>/<prefix>.
ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
#: moto authorizes a multi-object delete (vacuum's) against the bucket before each key; AWS checks
#: s3:DeleteObject for each key only, which the runbook's policy grants.
MOTO_ONLY = {"Effect": "Allow", "Action": ["s3:DeleteObject"], "Resource": "arn:aws:s3:::lake"}


def _user(s3: S3Server, bucket: str, actions: list[str]) -> dict[str, str]:
    iam = boto3.client("iam", endpoint_url=s3.endpoint, region_name="us-east-1",
                       aws_access_key_id="set-up", aws_secret_access_key="set-up")
    name = f"engine-{len(actions)}"
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": f"arn:aws:s3:::{bucket}"},
        {"Effect": "Allow", "Action": actions, "Resource": f"arn:aws:s3:::{bucket}/*"}, MOTO_ONLY]}
    iam.create_user(UserName=name)
    arn = iam.create_policy(PolicyName=name, PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
    iam.attach_user_policy(UserName=name, PolicyArn=arn)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_REGION": "us-east-1"}



@pytest.mark.spark
def test_the_runbooks_policy_is_enough_and_a_missing_permission_is_named(tmp_path: Path) -> None:
    s3 = S3Server(tmp_path / "s3").start()  # its own server: access control stays on until it stops
    try:
        s3.create_bucket("lake")
        engine, no_put = _user(s3, "lake", ACTIONS), _user(s3, "lake", ["s3:GetObject", "s3:DeleteObject"])
        requests.post(f"{s3.endpoint}/moto-api/reset-auth", data="0", timeout=10).raise_for_status()
        denied = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1",
                              aws_access_key_id=engine["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=engine["AWS_SECRET_ACCESS_KEY"])
        with pytest.raises(Exception, match="AccessDenied"):  # the server really enforces the policy
            denied.create_bucket(Bucket="elsewhere")

        raw = {"workdir": str(tmp_path / "work"), "source": {"value_format": "json"},
               "target": {"root": "s3://lake/tables", "storage": s3.storage()},
               "tables": [{"name": "items", "topic": "app.public.items"}]}
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(raw))
        config = load_config(path)
        produce(config, "app.public.items", [("c", {"id": i, "qty": i}, 100 + i) for i in range(20)])
        first = ingest_cli("run", "-c", str(path), env=engine)
        assert first.returncode == 0, first.stderr[-2000:]
        assert "AccessDenied" not in first.stderr, first.stderr  # the leases were released, too
        produce(config, "app.public.items", [("u", {"id": i, "qty": -i}, 200 + i) for i in range(10)])
        again = ingest_cli("run", "-c", str(path), env=engine)
        assert again.returncode == 0 and "AccessDenied" not in again.stderr, again.stderr[-2000:]
        kept = ingest_cli("maintain", "-c", str(path), "--vacuum-retention-hours", "0", env=engine)
        assert kept.returncode == 0 and "AccessDenied" not in kept.stdout + kept.stderr, kept.stdout + kept.stderr

        refused = ingest_cli("run", "-c", str(path), env=no_put)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert "lacks s3:PutObject" in refused.stderr or "lack s3:PutObject" in refused.stderr, refused.stderr
    finally:
        s3.stop()
