"""What one refresh of the browser's control panel costs, at 8 runs, 500 and 2000.

For each ``--runs`` count, a sqlite MLflow store is written as a training experiment leaves it
(the Tracker's own writes: each run with its whole SFT config as params, its knobs tag, status
tags and a ``--steps``-point loss history), then ``mlflow server --app-name trl-rapidfire``
serves it and these are timed, from Python over HTTP on 127.0.0.1 (so the time is the server's,
plus a local round trip), median of ``--repeat``:

- **runs/search**: the calls a refresh made before the panel's own route (experiments/search,
  the parents' runs/search, the experiment's runs/search: every run's whole config);
- **lean, first**: the panel's ``POST /rapidfire/api/runs`` holding nothing (a page just opened:
  every run's row, its knobs and its loss curve, up to ``MAX_POINTS`` points: the rest come
  with the next answers, which the benchmark reads before it goes on), and its size;
- **lean, refresh**: the menu's two calls (experiments/search, the parents' runs/search) and
  the lean route with what the page holds (``held``: about 19 bytes a run), after ``--moved``
  runs moved (a status tag and a loss point each, written into the store by the Tracker
  meanwhile), and its size both ways;
- **page**: the page's own measure of a whole refresh in headless Chromium (its calls, the
  table and the curves: ``window.rfPanel.refreshMs``, and the bytes it read), median of
  ``--repeat`` steady refreshes once the page holds every curve whole; skipped without
  Chromium.

Prints each figure, its cost per run and the ratio of the per-run costs (largest count / the
smallest) measured in this same invocation: a cost that grows with the runs should stay near 1
(or fall: the fixed costs spread); a ratio well above 1 is a cost growing faster than the runs.
A lean refresh should grow far slower than the runs (it reads every run's few lean tags, but
sends only the moved ones).

Run: ``python benchmarks/panel_refresh.py`` (``--runs 8,500,2000 --steps 100 --repeat 5
--moved 10``; ``--quick``: 4 and 40 runs, 2 repeats).
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
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def _store(folder: Path, runs: int, steps: int) -> tuple[str, Any]:
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
    return uri, tracker  # closed with its parent left "running", as while it trains


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


def _experiment(api: str) -> tuple[str, str]:
    """The MLflow experiment id and trl-rapidfire id of the store's experiment."""
    experiments = _post(f"{api}/experiments/search", {"max_results": 1000})["experiments"]
    ids = [e["experiment_id"] for e in experiments]
    (parent,) = _search_all(api, ids, "tags.`rapidfire.role` = 'experiment'")
    tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
    return parent["info"]["experiment_id"], tags["rapidfire.experiment"]


def _search_refresh(api: str) -> tuple[float, int]:
    """The REST calls of a refresh before the panel's own route: seconds, runs seen."""
    t0 = time.perf_counter()
    eid, rfid = _experiment(api)
    runs = _search_all(api, [eid],
                       f"tags.`rapidfire.role` = 'run' and tags.`rapidfire.experiment` = '{rfid}'")
    return time.perf_counter() - t0, len(runs)


class _Page:
    """What the page holds between refreshes, as panel.js keeps it (each run's version and
    the step of its last loss point), and what it sends as ``held``."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, int]] = {}
        self.loaded = False

    def body(self, eid: str, rfid: str) -> dict:
        body = {"experiment": eid, "rfid": rfid}
        if self.loaded:
            body["held"] = ",".join(f"{i[:10]}{v}{step:x}" if step >= 0 else f"{i[:10]}{v}"
                                    for i, (v, step) in self.held.items())
        return body

    def take(self, answer: dict) -> None:
        if answer["full"]:
            self.held = {}
        self.held = {i: h for i, h in self.held.items() if i[:10] not in answer["gone"]}
        for row in answer["runs"]:
            self.held[row["id"]] = (row["v"], self.held.get(row["id"], ("", -1))[1])
        for i, points in answer["points"].items():
            self.held[i] = (self.held[i][0], points[-1][0])
        self.loaded = True


def _lean(base: str, eid: str, rfid: str, page: _Page) -> tuple[float, int, dict]:
    """One read of the panel's route as the page makes it: seconds, bytes both ways, the
    answer (taken into ``page``)."""
    body = json.dumps(page.body(eid, rfid)).encode()
    request = urllib.request.Request(f"{base}/rapidfire/api/runs", body,
                                     {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as reply:
        text = reply.read()
    seconds = time.perf_counter() - t0
    answer = json.loads(text)
    page.take(answer)
    return seconds, len(body) + len(text), answer


def _move(tracker: Any, runs: int, moved: int, step: int) -> None:
    """``moved`` runs take a step: a progress tag and a loss point each, in the store."""
    now = int(time.time() * 1000)
    for i in range(min(moved, runs)):
        name = f"run-{(step * moved + i) % runs}"
        tracker.set_tags(name, {"rapidfire.progress": f"chunk 2/4 (step {step})"})
        tracker.log_metrics(name, [("loss", 0.01, 1000 + step, now)])
    tracker.flush(timeout=600)


def _page_refresh(url: str, runs: int, repeat: int) -> tuple[float, float] | None:
    """The page's own measure of a steady refresh (median seconds and bytes read), or None
    without Chromium."""
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
                " document.querySelectorAll('#rows tr').length, s.refreshBytes || 0,"
                " s.runs.every((r) => !r.metrics.loss || (s.history[r.id]"
                " && s.history[r.id].step === r.metrics.loss.step))];")
            if got and got[0] > last and got[1] and got[2] == runs and got[4]:
                last = got[0]
                seen.append((got[1] / 1000, got[3]))
            time.sleep(0.1)
        if len(seen) < 2:
            return None
        return (statistics.median(s for s, _ in seen[1:]),  # the first: cold
                statistics.median(b for _, b in seen[1:]))
    finally:
        driver.quit()


def measure(runs: int, steps: int, repeat: int, moved: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        uri, tracker = _store(folder, runs, steps)
        built = time.perf_counter() - t0
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
             "--host", "127.0.0.1", "--port", str(port), "--app-name", "trl-rapidfire",
             "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
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
            _search_refresh(api)  # warm: the server's first queries
            searches, first, first_bytes, lean, lean_bytes = [], [], [], [], []
            for k in range(repeat):
                seconds, seen = _search_refresh(api)
                assert seen == runs, (seen, runs)
                searches.append(seconds)
                page = _Page()
                seconds, size, answer = _lean(base, *_experiment(api), page)
                assert len(answer["runs"]) == runs, (len(answer["runs"]), runs)
                first.append(seconds)
                first_bytes.append(size)
                for _ in range(100):  # the curves beyond one answer's points come next
                    if not answer["points"]:
                        break
                    _, _, answer = _lean(base, *_experiment(api), page)
                _move(tracker, runs, moved, k)
                t0 = time.perf_counter()
                eid, rfid = _experiment(api)  # the menu's calls, every refresh
                _, size, answer = _lean(base, eid, rfid, page)
                lean.append(time.perf_counter() - t0)
                lean_bytes.append(size)
                assert len(answer["runs"]) == min(moved, runs), len(answer["runs"])
            in_page = _page_refresh(f"{base}/rapidfire/", runs, repeat)
        finally:
            server.terminate()
            server.wait(timeout=30)
            tracker.close(parent_status=None)
    return {"runs": runs, "store_seconds": built, "search": statistics.median(searches),
            "first": statistics.median(first), "first_bytes": statistics.median(first_bytes),
            "lean": statistics.median(lean), "lean_bytes": statistics.median(lean_bytes),
            "page": in_page and in_page[0], "page_bytes": in_page and in_page[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="8,500,2000", help="run counts, comma-separated")
    parser.add_argument("--steps", type=int, default=100, help="loss points per run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--moved", type=int, default=10, help="runs that move a refresh")
    parser.add_argument("--quick", action="store_true", help="4 and 40 runs, 2 repeats")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    counts = [4, 40] if args.quick else [int(n) for n in args.runs.split(",")]
    repeat = 2 if args.quick else args.repeat
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{args.steps} loss points a run; {args.moved} runs move between two refreshes")
    results = []
    for n in counts:
        r = measure(n, args.steps, repeat, args.moved)
        results.append(r)
        page = "skipped (no Chromium)" if r["page"] is None else (
            f"{r['page'] * 1000:5.0f} ms, {r['page_bytes'] / 1024:5.1f} KB")
        print(f"{n:5d} runs: runs/search {r['search'] * 1000:6.0f} ms "
              f"({r['search'] / n * 1000:5.2f} ms/run) | lean first {r['first'] * 1000:5.0f} ms, "
              f"{r['first_bytes'] / 1024:6.0f} KB | lean refresh {r['lean'] * 1000:4.0f} ms, "
              f"{r['lean_bytes'] / 1024:5.1f} KB | page {page} "
              f"(store written in {r['store_seconds']:.0f} s)", flush=True)
    small, large = results[0], results[-1]
    scale = large["runs"] / small["runs"]
    print(f"per-run cost, {large['runs']} runs / {small['runs']} runs: "
          f"runs/search {large['search'] / small['search'] / scale:.2f}, "
          f"lean first {large['first'] / small['first'] / scale:.2f}, "
          f"lean refresh {large['lean'] / small['lean'] / scale:.3f}"
          + ("" if small["page"] is None or large["page"] is None else
             f", page {large['page'] / small['page'] / scale:.3f}"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
