"""What one refresh of the browser's control panel costs, at 8 runs and at 500.

For each ``--runs`` count, a sqlite MLflow store is written as a training experiment leaves it
(the Tracker's own writes: each run with its whole SFT config as params, its knobs tag, status
tags and a ``--steps``-point loss history), then ``mlflow server --app-name trl-rapidfire``
serves it and two things are timed:

- **searches**: the calls every refresh of the page makes (experiments/search, the parents'
  runs/search, the experiment's runs/search), from Python, median of ``--repeat``; and
  **10 histories**: the metric histories a refresh fetches when 10 runs (its most) moved;
- **page**: the page's own measure of a whole refresh in headless Chromium (its REST calls,
  the runs table, the curves: ``window.rfPanel.refreshMs``), median of ``--repeat`` steady
  refreshes (nothing trains, so no history is fetched); skipped without Chromium.

Prints each figure, its cost per run and the ratio of the per-run costs (largest count / the
smallest) measured in this same invocation: a table of N runs must cost O(N), so the per-run
ratio should stay near 1 (or fall: the fixed costs spread); a ratio well above 1 is a cost
growing faster than the runs. Also the refresh interval (2 s) against the page's refresh: the
page refreshes again 2 s after a refresh ends, so a slow refresh lengthens the period, never
piles up.

Run: ``python benchmarks/panel_refresh.py`` (``--runs 8,500 --steps 100 --repeat 5``;
``--quick``: 4 and 40 runs, 2 repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HISTORIES_PER_REFRESH = 10  # as panel.js


def _store(folder: Path, runs: int, steps: int) -> str:
    """The store a training experiment of ``runs`` runs leaves, written by the Tracker."""
    from trl import SFTConfig

    from trl_rapidfire.tracking.tracker import Tracker

    config = SFTConfig(output_dir=str(folder / "out"), report_to="none", use_cpu=True,
                       bf16=False).to_dict()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracker = Tracker(folder / "demo", uri=uri)
    now = int(time.time() * 1000)
    for i in range(runs):
        params = dict(config, learning_rate=10.0 ** -(2 + i % 4), output_dir=f"out/runs/run-{i}",
                      per_device_train_batch_size=4 << (i % 3))
        tracker.ensure_run(f"run-{i}", params, {
            "rapidfire.status": "running", "rapidfire.progress": f"chunk 1/4 (step {steps})",
            "rapidfire.knobs": json.dumps(["learning_rate", "per_device_train_batch_size"])})
        tracker.log_metrics(f"run-{i}", [("loss", 2.0 / (s + i + 1), s, now + s)
                                         for s in range(1, steps + 1)])
    tracker.experiment_started()
    tracker.flush(timeout=3600)
    tracker.close(parent_status=None)  # the parent stays "running", as while it trains
    return uri


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=120) as reply:
        return json.loads(reply.read())


def _search_all(api: str, ids: list[str], filter_string: str) -> list[dict]:
    runs, token = [], None
    while True:
        page = _post(f"{api}/runs/search", {"experiment_ids": ids, "filter": filter_string,
                                            "max_results": 1000, "page_token": token})
        runs += page.get("runs", [])
        token = page.get("next_page_token")
        if not token:
            return runs


def _rest_refresh(api: str) -> tuple[float, float, int]:
    """The REST calls of one page refresh, as panel.js makes them: seconds of the searches
    (every refresh), seconds of the histories of 10 runs (a refresh after 10 runs moved),
    runs seen."""
    t0 = time.perf_counter()
    experiments = _post(f"{api}/experiments/search", {"max_results": 1000})["experiments"]
    ids = [e["experiment_id"] for e in experiments]
    parents = _search_all(api, ids, "tags.`rapidfire.role` = 'experiment'")
    parent = parents[0]
    rfid = {t["key"]: t["value"] for t in parent["data"]["tags"]}["rapidfire.experiment"]
    runs = _search_all(api, [parent["info"]["experiment_id"]],
                       f"tags.`rapidfire.role` = 'run' and tags.`rapidfire.experiment` = '{rfid}'")
    t1 = time.perf_counter()
    for run in runs[:HISTORIES_PER_REFRESH]:
        _get(f"{api}/metrics/get-history?run_id={run['info']['run_id']}&metric_key=loss"
             "&max_results=25000")
    return t1 - t0, time.perf_counter() - t1, len(runs)


def _page_refresh(url: str, runs: int, repeat: int) -> float | None:
    """The page's own measure of a refresh (median seconds), or None without Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if chromium is None or driver_path is None:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(url)
        seen: list[float] = []
        last = 0
        deadline = time.monotonic() + 120 + 30 * repeat
        while len(seen) < repeat + 1 and time.monotonic() < deadline:
            got = driver.execute_script(
                "const s = window.rfPanel; return s && [s.refreshes, s.refreshMs || 0,"
                " document.querySelectorAll('#rows tr').length];")
            if got and got[0] > last and got[1] and got[2] == runs:
                last = got[0]
                seen.append(got[1] / 1000)
            time.sleep(0.1)
        return statistics.median(seen[1:]) if len(seen) > 1 else None  # the first: cold
    finally:
        driver.quit()


def measure(runs: int, steps: int, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        uri = _store(folder, runs, steps)
        built = time.perf_counter() - t0
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
             "--host", "127.0.0.1", "--port", str(port), "--app-name", "trl-rapidfire",
             "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"{base}/health", timeout=2).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("mlflow server did not start") from None
                    time.sleep(0.5)
            api = f"{base}/ajax-api/2.0/mlflow"
            _rest_refresh(api)  # warm: the server's first queries
            rest, histories = [], []
            for _ in range(repeat):
                seconds, history_seconds, seen = _rest_refresh(api)
                assert seen == runs, (seen, runs)
                rest.append(seconds)
                histories.append(history_seconds)
            page = _page_refresh(f"{base}/rapidfire/", runs, repeat)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {"runs": runs, "store_seconds": built, "rest": statistics.median(rest),
            "histories": statistics.median(histories), "page": page}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="8,500", help="run counts, comma-separated")
    parser.add_argument("--steps", type=int, default=100, help="loss points per run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="4 and 40 runs, 2 repeats")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    counts = [4, 40] if args.quick else [int(n) for n in args.runs.split(",")]
    repeat = 2 if args.quick else args.repeat
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{args.steps} loss points a run; refresh interval 2 s")
    results = []
    for n in counts:
        r = measure(n, args.steps, repeat)
        results.append(r)
        page = "skipped (no Chromium)" if r["page"] is None else (
            f"{r['page'] * 1000:7.0f} ms ({r['page'] / n * 1000:6.2f} ms/run)")
        print(f"{n:5d} runs: searches {r['rest'] * 1000:6.0f} ms ({r['rest'] / n * 1000:5.2f} "
              f"ms/run)   10 histories {r['histories'] * 1000:4.0f} ms   page {page}   "
              f"(store written in {r['store_seconds']:.0f} s)", flush=True)
    small, large = results[0], results[-1]
    scale = large["runs"] / small["runs"]
    print(f"per-run cost, {large['runs']} runs / {small['runs']} runs: "
          f"searches {large['rest'] / small['rest'] / scale:.2f}"
          + ("" if small["page"] is None or large["page"] is None else
             f", page {large['page'] / small['page'] / scale:.2f}"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
