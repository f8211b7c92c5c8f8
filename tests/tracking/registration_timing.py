"""How long a Tracker keeps its caller before the first chunk could train (issue 46).

For each repetition, in this one process: a Tracker on a NEW sqlite store in a temporary
folder, ``ensure_run`` of ``--runs`` runs with ~200 params each (a TRL config's size); printed:
the construction, the synchronous part (construction + every registration: what the engine
waits for before its first chunk) and the time until every run is in the store with its params
(``flush()``). The first repetition pays MLflow's import; the best of the others is the warm
figure. Another tree's tracker (e.g. the last commit's, to compare) is timed by putting it
first on the path::

    python tests/tracking/registration_timing.py --runs 64 --reps 3
    git archive HEAD trl_rapidfire | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python tests/tracking/registration_timing.py

Not a test: timings on a shared machine are noisy (take the best of several).
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path


def params_of(i: int) -> dict[str, object]:
    """~200 params, numbers and text, as a run's config logs them."""
    params: dict[str, object] = {f"field_{k}": (k * 0.5 if k % 3 else f"value-{k}")
                                 for k in range(196)}
    params.update(learning_rate=1e-4 * (i + 1), lora_r=8, seed=42, run_index=i)
    return params


def one(runs: int) -> tuple[float, float, float]:
    from trl_rapidfire.tracking.tracker import Tracker

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "mlflow.db"
        t0 = time.perf_counter()
        tracker = Tracker(Path(tmp) / "exp", uri=f"sqlite:///{db}")
        built = time.perf_counter() - t0
        for i in range(runs):
            tracker.ensure_run(f"run-{i}", params_of(i), {"rapidfire.status": "pending"})
        sync = time.perf_counter() - t0
        tracker.flush(timeout=600)
        stored = time.perf_counter() - t0
        tracker.close()
        with sqlite3.connect(db) as con:
            found = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            params = con.execute("SELECT COUNT(*) FROM params").fetchone()[0]
        if (found, params) != (runs + 1, runs * 200):
            raise SystemExit(f"the store holds {found} runs and {params} params")
        return built, sync, stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from trl_rapidfire.tracking import tracker

    print(f"tracker: {tracker.__file__}")
    rows = []
    for rep in range(args.reps):
        built, sync, stored = one(args.runs)
        rows.append((built, sync, stored))
        print(f"rep {rep + 1} ({'cold' if rep == 0 else 'warm'}): Tracker() {built:.3f} s, "
              f"Tracker() + {args.runs} ensure_run {sync:.3f} s, "
              f"all in the store {stored:.2f} s", flush=True)
    if len(rows) > 1:
        warm = rows[1:]
        print(f"best warm: Tracker() {min(r[0] for r in warm):.3f} s, synchronous "
              f"{min(r[1] for r in warm):.3f} s, all in the store "
              f"{min(r[2] for r in warm):.2f} s")


if __name__ == "__main__":
    main()
