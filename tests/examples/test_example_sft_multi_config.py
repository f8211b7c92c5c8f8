"""examples/sft_multi_config.py runs end to end on the tiny offline model and reports truthfully."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sft_multi_config.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("sft_multi_config_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def example(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return _load_example()


def test_example_trains_every_config_and_reports(example, tmp_path, capsys):
    from trl_rapidfire.shared_state.runs import RunStatus

    num_chunks = 2
    rf = example.main(["--rows", "40", "--batch-size", "8", "--num-chunks", str(num_chunks),
                       "--epochs", "1", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out

    runs = rf.runs
    assert len(runs) == 4  # 2 learning rates x 2 LoRA ranks
    assert len({(r.knobs["learning_rate"], r.knobs["peft_config"].r) for r in runs}) == 4
    for run in runs:
        assert run.status == RunStatus.COMPLETED, (run.name, run.status, run.error)
        assert run.global_step == 4  # 32 train rows / batch 8
        assert Path(run.output_dir).is_relative_to(tmp_path)
        assert os.path.isfile(os.path.join(run.final_dir, "adapter_model.safetensors"))
        assert math.isfinite(run.metrics["eval_loss"])
        assert math.isfinite(run.metrics["train_loss"])

    # Runs take turns: every run's first chunk comes before any run's second chunk.
    schedule = rf.schedule
    assert len(schedule) == len(runs) * num_chunks
    order = [(c.run, c.number) for c in schedule]
    last_first = max(i for i, (_, n) in enumerate(order) if n == 0)
    first_second = min(i for i, (_, n) in enumerate(order) if n == 1)
    assert last_first < first_second, order
    assert {run for run, n in order if n == 0} == {r.name for r in runs}

    best = rf.best_run
    assert best is not None and best.name in {r.name for r in runs}
    assert best.metrics["eval_loss"] == min(r.metrics["eval_loss"] for r in runs)

    # The printed report names the best run, every adapter folder and one timeline per run.
    assert f"Best run (* above, lowest eval_loss): {best.name}" in out
    for run in runs:
        assert run.final_dir in out
        timeline = [line for line in out.splitlines() if line.startswith(f"{run.name}  ")]
        assert timeline and "turns " in timeline[-1]


def test_parse_args_defaults_and_validation(example):
    args = example.parse_args([])
    assert args.model is None and args.dataset is None and args.num_chunks == 4
    with pytest.raises(SystemExit):
        example.parse_args(["--rows", "3"])
