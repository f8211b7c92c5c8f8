"""examples/sft_generation_eval.py runs offline, scores every run on its answers at every
chunk end, and shows the scores and the best run's answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sft_generation_eval.py"


def test_example_scores_each_run_on_its_answers(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = importlib.util.spec_from_file_location("sft_generation_eval_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rf = example.main(["--rows", "64", "--eval-rows", "8", "--num-chunks", "2",
                       "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert len(rf.runs) == 4
    for run in rf.runs:
        evals = [e for e in rf.run_trainer(run.name).state.log_history if "eval_loss" in e]
        assert [e["step"] for e in evals] == [4, 8]  # 64 rows, 8 a batch, 2 chunks
        assert all({"eval_exact_match", "eval_rouge_l"} <= set(e) for e in evals)
        saved = Path(run.output_dir) / "generations" / "eval-step-00000008.jsonl"
        rows = [json.loads(line) for line in saved.read_text().splitlines()]
        assert len(rows) == 4 and all(r["step"] == 8 and r["reference"] for r in rows)
    best = rf.best_run
    # The best run is the one that answers best (metric_for_best_model).
    assert best.metrics["eval_exact_match"] == max(r.metrics["eval_exact_match"]
                                                   for r in rf.runs)
    header = next(line for line in out.splitlines() if line.startswith("run "))
    assert "exact" in header and "rouge_l" in header
    assert f"{best.name}'s answers at step 8:" in out and "(reference " in out
