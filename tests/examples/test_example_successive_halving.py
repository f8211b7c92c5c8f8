"""examples/sft_successive_halving.py runs offline and shows the policy's decisions."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sft_successive_halving.py"


def test_example_halves_the_runs_and_shows_why(monkeypatch, tmp_path, capsys):
    from trl_rapidfire.shared_state.runs import RunStatus

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = importlib.util.spec_from_file_location("sft_successive_halving_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rf = example.main(["--rows", "128", "--num-chunks", "4", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out

    status = {r.name: r.status for r in rf.runs}
    # 8 runs, rungs at 1 and 2 chunks (4 is the end): 4 stopped at the first, 2 at the second.
    assert list(status.values()).count(RunStatus.STOPPED) == 6
    assert list(status.values()).count(RunStatus.COMPLETED) == 2
    assert len(rf.schedule) == 8 + 4 + 2 * 2
    for r in rf.runs:
        if r.status == RunStatus.STOPPED:
            assert r.last_op.startswith("ok: stopped at step ")
            # The table shows the decision on the run's row.
            row = next(line for line in out.splitlines() if line.startswith(r.name + " "))
            assert re.search(r"by SuccessiveHalving rung [01]: eval_loss \S+ not in best 1/2 "
                             r"of [84] \([0-9]+ better\)$", row), row
    assert "last op" in out and f"{len(rf.schedule)} of 32 chunks trained" in out
    best = rf.best_run
    assert best.status == RunStatus.COMPLETED and f"Best run (*): {best.name}" in out
    rows = (tmp_path / "ops.csv").read_text().splitlines()
    assert sum(",policy:SuccessiveHalving," in row for row in rows) == 6
