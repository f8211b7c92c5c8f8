"""examples/sft_optuna_search.py runs offline and shows what the sampler proposed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sft_optuna_search.py"


def test_example_proposes_prunes_and_shows_the_search(monkeypatch, tmp_path, capsys):
    pytest.importorskip("optuna")
    from trl_rapidfire.shared_state.runs import RunStatus

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = importlib.util.spec_from_file_location("sft_optuna_search_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rf = example.main(["--rows", "128", "--num-runs", "5", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert [r.name for r in rf.runs] == [f"run-{i}" for i in range(5)]
    assert {r.status for r in rf.runs} <= {RunStatus.COMPLETED, RunStatus.STOPPED}
    for r in rf.runs:
        row = next(line for line in out.splitlines()
                   if line.split()[:1] in ([r.name], [r.name + "*"]))
        if r.status == RunStatus.STOPPED:  # the pruner's reason on the run's row
            assert "by OptunaPruner SuccessiveHalvingPruner pruned it at step" in row, row
    search = out.split("What the sampler proposed")[1].splitlines()
    proposals = [line for line in search if line.split()[:1] and line.split()[0].isdigit()]
    assert [line.split()[1] for line in proposals] == [f"run-{i}" for i in range(5)]
    assert all("learning_rate=" in line and ("COMPLETE" in line or "PRUNED" in line)
               for line in proposals)
    assert f"Best run (*): {rf.best_run.name}" in out
