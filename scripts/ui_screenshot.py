"""Use the Dagster UI as a person would, then photograph the asset graph.

Starts ``dg dev`` on a free port with a throw-away DAGSTER_HOME and the demo workload generated in
a temporary workdir, waits for the webserver, materializes every asset and runs every check
through the webserver's GraphQL API (the same ``launchPipelineExecution`` call the UI's
"Materialize all" button makes), waits for the run to finish, and takes a headless Chromium
screenshot of the asset graph. Needs Chromium (``apt-get install chromium``); not part of
``make test``.

    .venv/bin/python scripts/ui_screenshot.py [--out docs/img/dagster-asset-graph.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.demo import prepare_workload  # noqa: E402

from dagster_project.settings import CONFIG_ENV, WORKDIR_ENV  # noqa: E402
from ingest.config import load_config  # noqa: E402

LOCATION = "cdc_ingest"
REPOSITORY = "__repository__"

ASSETS_QUERY = """
query {
  assetNodes { assetKey { path } groupName assetChecksOrError { ... on AssetChecks { checks { name } } } }
}
"""
LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
RUN_QUERY = """
query Run($runId: ID!) {
  runOrError(runId: $runId) { __typename ... on Run { status } }
}
"""
CHECKS_QUERY = """
query {
  assetNodes {
    assetKey { path }
    assetMaterializations(limit: 1) { runId }
    assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } }
  }
}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.loads(response.read())
    if payload.get("errors"):
        raise RuntimeError(f"GraphQL errors: {payload['errors']}")
    return payload["data"]


def wait_for_webserver(port: int, server: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"dg dev exited with {server.returncode}")
        try:
            # The code location is loaded once the asset nodes are there.
            if graphql(port, ASSETS_QUERY)["assetNodes"]:
                return
        except (urllib.error.URLError, ConnectionError, RuntimeError, TimeoutError):
            pass
        time.sleep(2)
    raise TimeoutError(f"the webserver on port {port} did not serve the code location within {timeout:.0f}s")


def launch_everything(port: int) -> str:
    """One run materializing every asset and executing every check, as "Materialize all" does."""
    nodes = graphql(port, ASSETS_QUERY)["assetNodes"]
    assets = [{"path": n["assetKey"]["path"]} for n in nodes]
    checks = [{"assetKey": {"path": n["assetKey"]["path"]}, "name": c["name"]}
              for n in nodes for c in (n.get("assetChecksOrError") or {}).get("checks", [])]
    params = {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "pipelineName": "__ASSET_JOB",
                     "assetSelection": assets, "assetCheckSelection": checks},
        "mode": "default",
        "executionMetadata": {"tags": [{"key": "launched_by", "value": "scripts/ui_screenshot.py"}]},
    }
    result = graphql(port, LAUNCH_MUTATION, {"params": params})["launchPipelineExecution"]
    if result["__typename"] != "LaunchRunSuccess":
        raise RuntimeError(f"launch failed: {result}")
    return str(result["run"]["runId"])


def wait_for_run(port: int, run_id: str, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    status = "?"
    while time.monotonic() < deadline:
        status = graphql(port, RUN_QUERY, {"runId": run_id})["runOrError"].get("status", "?")
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return str(status)
        time.sleep(3)
    raise TimeoutError(f"run {run_id} still {status} after {timeout:.0f}s")


def screenshot(url: str, out: Path, chromium: str, profile: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--user-data-dir={profile}", "--window-size=1600,1100", "--virtual-time-budget=20000",
         f"--screenshot={out}", url],
        check=True, capture_output=True, timeout=180,
    )


def stop(server: subprocess.Popen[bytes]) -> None:
    """Stop ``dg dev`` and everything it started (its own process group)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "dagster-asset-graph.png")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    parser.add_argument("--events", type=int, default=3000, help="change events to simulate")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument("--keep", action="store_true", help="keep the temporary DAGSTER_HOME and workdir")
    args = parser.parse_args()
    if not Path(args.chromium).exists():
        print("Chromium is required: apt-get install chromium", file=sys.stderr)
        return 2

    scratch = Path(tempfile.mkdtemp(prefix="cdc-ui-"))
    home, work = scratch / "dagster_home", scratch / "work"
    home.mkdir()
    shutil.copy(ROOT / "dagster_project" / "dagster.yaml", home / "dagster.yaml")
    config = load_config(args.config, workdir=work)
    print(f"workload: {args.events} events into {work}")
    # Like `make demo`: some malformed messages and some changes the expectations suites reject.
    prepare_workload(config, events=args.events, seed=7, malformed_fraction=0.005, violation_fraction=0.004)

    port = free_port()
    env = {**os.environ, "VIRTUAL_ENV": str(ROOT / ".venv"), "DAGSTER_HOME": str(home),
           CONFIG_ENV: str(args.config.resolve()), WORKDIR_ENV: str(work)}
    log = (scratch / "dg-dev.log").open("wb")
    dg = ROOT / ".venv" / "bin" / "dg"
    print(f"dg dev on http://127.0.0.1:{port} (log {scratch / 'dg-dev.log'})")
    server = subprocess.Popen([str(dg), "dev", "--port", str(port), "--host", "127.0.0.1", "--use-active-venv"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_webserver(port, server)
        run_id = launch_everything(port)
        print(f"run {run_id} launched through GraphQL; waiting")
        status = wait_for_run(port, run_id)
        print(f"run {run_id}: {status}")
        for node in graphql(port, CHECKS_QUERY)["assetNodes"]:
            checks = {c["name"]: (c.get("executionForLatestMaterialization") or {}).get("status")
                      for c in (node.get("assetChecksOrError") or {}).get("checks", [])}
            print(f"  {'/'.join(node['assetKey']['path'])}: materialized={bool(node['assetMaterializations'])} "
                  f"checks={checks}")
        graphql(port, "mutation { setNuxSeen }")  # the community dialog a first visit shows
        groups = [g for g in ("cdc_tables", "analytics")]
        expanded = ",".join([f"global@global:{g}" for g in groups] + [f"{REPOSITORY}@{LOCATION}:{g}" for g in groups])
        url = f"http://127.0.0.1:{port}/asset-groups?expanded={urllib.parse.quote(expanded, safe=',')}"
        screenshot(url, args.out, args.chromium, scratch / "chromium")
        print(f"screenshot of {url}: {args.out}")
        return 0 if status == "SUCCESS" else 1
    finally:
        stop(server)
        log.close()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
