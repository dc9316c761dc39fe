"""How long a lake request on S3 waits for a store that is away: the engine's client against botocore's attempts.

Not a test: it measures what ``target.storage.retry_seconds`` buys the requests the engine makes
with boto3 (the writer lease, the checkpoint reads). Two clients, each one client for all its calls,
as a run keeps one:

* **engine**: :func:`ingest.lake.location.s3_client`, whose retries are bounded by time
  (``retry_seconds``, pauses from 0.2 s to 10 s);
* **attempts**: the client the engine used before, botocore's standard retries alone with
  ``3 + retry_seconds // 10`` attempts (botocore draws each pause at random from 50 ms up, and keeps a
  retry quota per client).

Two stores that are away:

1. **nobody answers**: a port nothing listens on. Each call is a ``HeadBucket``; the figure is the
   seconds until it failed. A client should wait ``retry_seconds``, every time.
2. **a restart**: an S3 server (moto) that stops, and starts again on the same port after half of
   ``retry_seconds`` (plus the second or so moto takes to start); a call made while it is away should
   get its answer once it is back. Each call stops and starts the server anew.

    .venv/bin/python benchmarks/bench_s3_outage.py
    .venv/bin/python benchmarks/bench_s3_outage.py --retry-seconds 3 --calls 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from harness.stack.s3 import S3Server, free_port
from rich.console import Console
from rich.table import Table

from ingest.lake.location import LakePath, delta_storage_options, s3_client, s3_errors

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import Figure, changed_options, write_result

console = Console()
BUCKET = "outage"


def engine_client(endpoint: str, retry_seconds: int) -> Any:
    """The engine's own client for a lake at ``endpoint`` with ``retry_seconds``."""
    options = delta_storage_options(endpoint_url=endpoint, region="us-east-1", path_style=True, allow_http=True,
                                    retry_seconds=retry_seconds)
    return s3_client(LakePath(f"s3://{BUCKET}/lake", options))


def attempts_client(endpoint: str, retry_seconds: int) -> Any:
    """The client the engine built before its retries were bounded by time: attempts alone."""
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=10,
                                      retries={"mode": "standard", "max_attempts": 3 + retry_seconds // 10}))


CLIENTS: dict[str, Callable[[str, int], Any]] = {"engine": engine_client, "attempts": attempts_client}


def timed_call(client: Any) -> tuple[float, bool]:
    """Seconds a ``HeadBucket`` took, and whether the store answered it (any answer, even an error)."""
    started = time.monotonic()
    try:
        client.head_bucket(Bucket=BUCKET)
        answered = True
    except s3_errors() as exc:
        answered = hasattr(exc, "response")  # a ClientError is the store's answer; others are the way there
    return time.monotonic() - started, answered


def nobody_answers(kind: str, retry_seconds: int, calls: int) -> list[float]:
    client = CLIENTS[kind](f"http://127.0.0.1:{free_port()}", retry_seconds)
    seconds = []
    for _ in range(calls):
        took, answered = timed_call(client)
        if answered:
            raise SystemExit("something answered on a port nothing should listen on")
        seconds.append(took)
    return seconds


def restarts(kind: str, retry_seconds: int, calls: int, workdir: Path) -> list[tuple[float, bool]]:
    server = S3Server(workdir / f"{kind}-{retry_seconds}").start()
    client = CLIENTS[kind](server.endpoint, retry_seconds)
    timed_call(client)  # the connection pool is warm, as in a run
    out = []
    try:
        for _ in range(calls):
            server.stop()
            back = threading.Timer(retry_seconds / 2, server.start)
            back.start()
            out.append(timed_call(client))
            back.join()
    finally:
        server.stop()
    return out


def _seconds(values: list[float]) -> str:
    return " ".join(f"{v:.1f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retry-seconds", default="3,10", help="retry_seconds to measure, comma separated")
    parser.add_argument("--calls", type=int, default=5, help="calls per client and store")
    args = parser.parse_args()

    table = Table(title="A HeadBucket on one client per row, against a store that is away")
    for col in ("store", "retry_seconds", "client", "seconds of each call", "median", "shortest",
                "answered after the restart"):
        table.add_column(col, justify="right")
    figures = []
    with tempfile.TemporaryDirectory(prefix="bench-s3-outage-") as tmp:
        os.environ.update(S3Server(Path(tmp)).environment)  # botocore signs before it connects: keys it must have
        for retry in (int(r) for r in args.retry_seconds.split(",")):
            for kind in CLIENTS:
                console.print(f"nobody answers: {kind}, retry_seconds {retry}, {args.calls} calls")
                waited = nobody_answers(kind, retry, args.calls)
                console.print(f"a restart after {retry / 2:.1f} s: {kind}, retry_seconds {retry}, {args.calls} calls")
                restarted = restarts(kind, retry, args.calls, Path(tmp))
                answered = sum(ok for _, ok in restarted)
                name = f"retry_seconds {retry}, {kind}"
                table.add_row("nobody answers", str(retry), kind, _seconds(waited), f"{statistics.median(waited):.1f}",
                              f"{min(waited):.1f}", "")
                table.add_row("a restart", str(retry), kind, _seconds([s for s, _ in restarted]),
                              f"{statistics.median(s for s, _ in restarted):.1f}",
                              f"{min(s for s, _ in restarted):.1f}", f"{answered} of {len(restarted)}")
                figures += [Figure(f"{name}: nobody answers, each call", _seconds(waited), "s"),
                            Figure(f"{name}: nobody answers, shortest call", round(min(waited), 1), "s"),
                            Figure(f"{name}: a restart, each call", _seconds([s for s, _ in restarted]), "s"),
                            Figure(f"{name}: a restart, calls answered", f"{answered} of {len(restarted)}")]
    console.print(table)
    console.print(f"result: {write_result('bench_s3_outage', changed_options(parser, args), figures)}")


if __name__ == "__main__":
    main()
