"""Photograph the metrics of a real run in Prometheus' own UI (docs/img/metrics-prometheus.png).

Generates the demo workload in a temporary workdir, starts ``ingest run --continuous
--metrics-port`` over it with small micro-batches (so the catch-up takes a few minutes and the
graphs have a shape), starts Debian's Prometheus scraping it every 2 s with
``infra/monitoring/alerts.yml`` loaded, waits until the tables have caught up, and takes a
headless Chromium screenshot of Prometheus' graph page showing the queries of
``infra/monitoring/grafana-dashboard.json``, one page per panel, tiled. Needs ``apt-get install
prometheus chromium``; not part of ``make test``.

    .venv/bin/python scripts/metrics_screenshot.py [--out docs/img/metrics-prometheus.png]
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.demo import prepare_workload  # noqa: E402
from harness.stack.process import stop  # noqa: E402
from harness.stack.s3 import free_port  # noqa: E402

from ingest.config import load_config  # noqa: E402

MONITORING = ROOT / "infra" / "monitoring"
#: the dashboard panels shown, by title (Prometheus' graph page stacks one graph per query)
#: (the simulated workload's source times lie in the past, so its trailing time says nothing: not shown)
#: (panel title, which of its queries, caption): one query a tile, as the graph page focuses the last one
SHOWN = (("Records applied per second", 0, "Records applied per second, by table and operation"),
         ("Lag: records the Delta tables do not hold yet", 0, "Lag: records the Delta tables do not hold yet"),
         ("Batch duration (p50, p95)", 1, "Batch duration p95 (decode to audit row)"),
         ("Commit (MERGE) duration p95", 0, "Commit (MERGE) duration p95"))
TILE_HEIGHT = 760


def graph_urls(port: int, minutes: int) -> list[str]:
    """Prometheus' graph page for each shown query, with Grafana's variables filled in."""
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    urls = []
    for title, target, _ in SHOWN:
        panel = next(p for p in dashboard["panels"] if p["title"] == title)
        expr = panel["targets"][target]["expr"].replace("$__rate_interval", "20s").replace("$table", ".*")
        params = {"g0.expr": expr, "g0.tab": "0", "g0.range_input": f"{minutes}m"}
        urls.append(f"http://127.0.0.1:{port}/graph?{urllib.parse.urlencode(params)}")
    return urls


def board(urls: list[str]) -> str:
    """A page that tiles the graph pages two by two, each under its panel's title."""
    tiles = "".join(f'<figure><figcaption>{html.escape(title)}</figcaption><iframe src="{html.escape(url)}">'
                    "</iframe></figure>" for (_, _, title), url in zip(SHOWN, urls, strict=True))
    return ("<!doctype html><style>body{margin:8px;font:15px sans-serif;display:grid;"
            "grid-template-columns:1fr 1fr;gap:8px}figure{margin:0}figcaption{font-weight:bold;padding:4px}"
            f"iframe{{width:100%;height:{TILE_HEIGHT}px;border:1px solid #ccc}}</style>{tiles}")


def wait_http(url: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server of {url} ended ({process.returncode}) before it answered")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not answer in {timeout:.0f} s") from None
            time.sleep(1)


def caught_up(port: int) -> bool:
    """Whether every table's lag is 0 (Prometheus' last scrape of the run)."""
    done = "max(cdc_ingest_lag_records) == 0 and sum(cdc_ingest_records_received_total) > 0"
    query = urllib.parse.urlencode({"query": done})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{query}", timeout=10) as answer:
        return bool(json.loads(answer.read())["data"]["result"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "metrics-prometheus.png")
    parser.add_argument("--events", type=int, default=40000, help="change events to simulate")
    parser.add_argument("--batch", type=int, default=1500, help="records per micro-batch (all tables)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary workdir and Prometheus' data")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    for tool in (args.chromium, shutil.which("prometheus")):
        if tool is None or not Path(tool).exists():
            print("Prometheus and Chromium are required: apt-get install prometheus chromium", file=sys.stderr)
            return 2

    scratch = Path(tempfile.mkdtemp(prefix="cdc-metrics-"))
    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    raw["workdir"] = str(scratch / "work")
    raw["source"]["max_records_per_batch"] = args.batch
    raw["quality"]["expectations_dir"] = str(ROOT / "expectations")
    config_path = scratch / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    print(f"workload: {args.events} events into {config.workdir}")
    prepare_workload(config, events=args.events, seed=7, malformed_fraction=0.005, violation_fraction=0.004)

    metrics_port, prom_port = free_port(), free_port()
    (scratch / "prometheus").mkdir()
    shutil.copy(MONITORING / "alerts.yml", scratch / "prometheus" / "alerts.yml")
    prom_config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    prom_config["global"].update(scrape_interval="2s", evaluation_interval="2s")
    prom_config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    (scratch / "prometheus" / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={scratch / 'prometheus' / 'prometheus.yml'}",
         f"--storage.tsdb.path={scratch / 'prometheus' / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=(scratch / "prometheus.log").open("wb"), start_new_session=True)
    run = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "ingest"), "run", "-c", str(config_path), "--continuous",
         "--metrics-port", str(metrics_port)],
        stdout=subprocess.DEVNULL, stderr=(scratch / "run.log").open("wb"), start_new_session=True)
    started = time.monotonic()
    try:
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", prometheus)
        print(f"prometheus on http://127.0.0.1:{prom_port}, the run's metrics on :{metrics_port}")
        while not caught_up(prom_port):
            if run.poll() is not None:
                raise RuntimeError(f"the run ended ({run.returncode}): {(scratch / 'run.log').read_text()[-2000:]}")
            print(f"  {time.monotonic() - started:5.0f} s: catching up")
            time.sleep(10)
        time.sleep(20)  # a flat stretch after the catch-up
        minutes = max(2, int((time.monotonic() - started) / 60) + 1)
        (scratch / "board").mkdir()
        (scratch / "board" / "index.html").write_text(board(graph_urls(prom_port, minutes)))
        # served from loopback like Prometheus (a file:// page's frames may not keep the UI's settings)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(scratch / "board"))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        page = f"http://127.0.0.1:{server.server_port}/index.html"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--hide-scrollbars", f"--user-data-dir={scratch / 'chromium'}",
             f"--window-size=1600,{2 * TILE_HEIGHT + 90}", "--virtual-time-budget=15000",
             f"--screenshot={args.out}", page],
            check=True, capture_output=True, timeout=180)
        server.shutdown()
        print(f"screenshot of Prometheus' graph page, {len(SHOWN)} panels: {args.out}")
        return 0
    finally:
        for process in (run, prometheus):
            if process.poll() is None:
                stop(process.pid, sig=signal.SIGINT, timeout=120)  # the run ends after its current batch
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
