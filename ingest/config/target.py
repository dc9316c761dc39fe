"""``target:``: where the Delta tables, audit, quarantine and checkpoints live (a directory or S3), how
the object store is reached, and who writes the commits."""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import AliasChoices, Field, field_validator

from ingest.config.base import URL_USERINFO, Model, PlacementName, WriterName
from ingest.lake.location import OBJECT_STORE_SCHEMES, delta_storage_options, is_uri


class StorageSpec(Model):
    """How to reach an object-store lake (``target.root: s3://bucket/prefix``). No credentials here.

    Keys come from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``) in the
    environment or the secrets file.
    """

    endpoint_url: str | None = Field(
        None, description="S3 API endpoint, e.g. http://127.0.0.1:9000 for MinIO; default: AWS for the region")
    region: str = Field("us-east-1", description="the bucket's region (S3-compatible servers accept any)")
    path_style: bool = Field(
        True, description="address buckets as <endpoint>/<bucket> (MinIO, most S3-compatible servers) rather "
        "than <bucket>.<endpoint> (AWS virtual-hosted style)")
    allow_http: bool | None = Field(
        None, description="allow plain http (default: only when endpoint_url starts with http://)")
    lease_seconds: float = Field(
        60.0, ge=5, description="the single-writer lease of each table on the object store: a run renews it "
        "every third of this; a run that died holding it blocks the table this long at most")
    retry_seconds: float = Field(
        120.0, ge=0, description="how long a request to the store is retried, with growing pauses, before it "
        "fails: a restart or stall of the store shorter than this is ridden out (0: fail at the first error; "
        "`ingest check` always asks once)")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if URL_USERINFO.match(value.strip()):
            raise ValueError("must not contain credentials (user:password@); set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY in the environment or the secrets file")
        if not re.match(r"^https?://[^/\s]+/?$", value.strip()):
            raise ValueError("expected http(s)://host[:port]")
        return value.strip().rstrip("/")

    def delta_options(self) -> Mapping[str, str]:
        """delta-rs storage options for this endpoint."""
        allow_http = self.allow_http if self.allow_http is not None else bool(
            self.endpoint_url and self.endpoint_url.startswith("http://"))
        return delta_storage_options(endpoint_url=self.endpoint_url, region=self.region,
                                     path_style=self.path_style, allow_http=allow_http,
                                     retry_seconds=self.retry_seconds)


def _lake_uri(value: str) -> str:
    """A lake or checkpoint location as given: a directory, or an ``s3://`` URI (``s3a://`` normalised)."""
    value = value.strip()
    if is_uri(value):
        scheme = value.split("://", 1)[0].lower()
        if scheme not in OBJECT_STORE_SCHEMES:
            raise ValueError(f"object store {scheme!r} is not supported yet: give s3://bucket/prefix or a "
                             "directory (docs/object-storage.md says what ADLS and GCS need)")
        if URL_USERINFO.match(value):
            raise ValueError("must not contain credentials; set them in the environment or the secrets file")
        rest = value.split("://", 1)[1].strip("/")
        if not rest:
            raise ValueError("expected s3://bucket[/prefix]")
        return f"s3://{rest}"  # delta-rs and boto3 name it s3; Spark's s3a is derived where needed
    if not value:
        raise ValueError("is empty: give a directory (relative to workdir) or s3://bucket[/prefix]")
    return value


class TargetSpec(Model):
    """Where Delta tables, audit, quarantine and checkpoints live."""

    root: str = Field(
        "tables", description="where the Delta tables live: a directory (relative to workdir) or "
        "s3://bucket/prefix (see target.storage)")
    storage: StorageSpec = Field(default_factory=StorageSpec, description="object-store lake: endpoint, region, "
                                 "addressing, lease")
    audit_table: str = Field("_cdc_audit", description="name of the audit Delta table under root")
    audit_interval_seconds: float = Field(
        10.0, ge=0, description="continuous runs: the audit rows of the micro-batches that end within this many "
        "seconds go to the audit table in one commit, the first micro-batch's at once (0: a commit per micro-batch). "
        "Each table's Delta commit holds its row too: rows a stop loses, the next run restores")
    quarantine_table: str = Field("_cdc_quarantine", description="name of the quarantine Delta table under root")
    cuts_table: str = Field("_cdc_cuts", description="name of the Delta table of published cuts under root "
                            "(source.transactions)")
    checkpoint_dir: str = Field(
        "checkpoints", description="Spark checkpoints, one per query: a directory (relative to workdir) or "
        "s3://bucket/prefix, reached with target.storage (where the driver's disk does not outlive a run). They "
        "are disposable: each table's Delta log records the offsets it applied, and a damaged checkpoint is "
        "discarded")
    target_file_size_mb: int = Field(
        8, gt=0, description="target Parquet file size written by MERGE and compaction; delta-rs rewrites every "
        "file a MERGE touches, so small files keep a hot-set MERGE small (benchmarks/bench_merge.py)")
    writer: WriterName = Field(
        "delta-rs", validation_alias=AliasChoices("writer", "engine"),
        description="who writes the Delta commits (also accepted as engine): delta-rs (on the driver, no JVM jar "
        "needed) or delta-spark (MERGE as Spark jobs, deletion vectors); a table may choose its own")
    deletion_vectors: bool = Field(
        True, description="delta-spark: tables it creates write deletion vectors (a MERGE marks rows deleted "
        "instead of rewriting their files); delta-rs can then no longer write or read them, polars and Spark can")
    driver_lookup_rows: int = Field(
        1_000_000, ge=0, description="delta-spark: before each MERGE the plan looks up what the table stores for "
        "the batch's keys; the driver reads them itself while the files their key range reaches hold at most "
        "this many rows, else Spark's executors do and the driver receives only the rows found. Lower it to bound "
        "the driver's memory (0: always the executors), raise it to spare a small table's batches a Spark job")
    plan_on: PlacementName = Field(
        "driver", description="where a batch is assembled, reduced and planned. driver: its rows are collected and "
        "planned with Arrow (faster on one machine); executors: they stay in Spark, the driver gets counts and "
        "schemas only (a cluster whose batches outgrow the driver; needs writer delta-spark, which merges from "
        "there). A table with a suite under quality.validate_on: driver, and a batch of only truncates or "
        "tombstones, are planned on the driver either way; a table may choose its own")
    change_data_feed: bool = Field(
        True, description="tables record Delta's change data feed (delta.enableChangeDataFeed; an existing table "
        "without it is switched on at its next batch): `ingest changes` and downstream readers get each commit's "
        "inserts, update pre/post images and deletes")

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        return _lake_uri(value)

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint(cls, value: str) -> str:
        return _lake_uri(value)
