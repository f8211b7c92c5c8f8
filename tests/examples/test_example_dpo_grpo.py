"""examples/dpo_multi_config.py and examples/grpo_multi_config.py run end to end on the tiny
offline model and report truthfully."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def dpo_example(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return _load("dpo_multi_config")


@pytest.fixture()
def grpo_example(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return _load("grpo_multi_config")


def _assert_runs_take_turns(schedule, runs, num_chunks: int) -> None:
    """Every run trains each of its chunks, and no run starts chunk k+1 before every run has
    trained chunk k."""
    assert len(schedule) == len(runs) * num_chunks
    order = [(c.run, c.number) for c in schedule]
    for name in (r.name for r in runs):
        assert [n for run, n in order if run == name] == list(range(num_chunks)), order
    for k in range(num_chunks - 1):
        last_k = max(i for i, (_, n) in enumerate(order) if n == k)
        first_next = min(i for i, (_, n) in enumerate(order) if n == k + 1)
        assert last_k < first_next, order


def _assert_report(out: str, rf, best_metric: str) -> None:
    best = rf.best_run
    assert f"Best run (* above, highest {best_metric}): {best.name}" in out
    assert f"{best.name}*" in out  # marked in the table
    for run in rf.runs:
        assert run.final_dir in out
        assert f"{run.final_dir}  (missing)" not in out
        timeline = [line for line in out.splitlines() if line.startswith(f"{run.name}  ")]
        assert timeline, run.name


def _assert_adapter(run, tmp_path: Path) -> None:
    assert Path(run.output_dir).is_relative_to(tmp_path)
    assert os.path.isfile(os.path.join(run.final_dir, "adapter_model.safetensors"))
    assert os.path.isfile(os.path.join(run.final_dir, "adapter_config.json"))


def _loss_type(value) -> str:
    return value if isinstance(value, str) else value[0]


def test_dpo_example_trains_every_config_against_the_shared_base_model(dpo_example, tmp_path,
                                                                        capsys):
    from trl_rapidfire.shared_state.runs import RunStatus

    num_chunks = 2
    rf = dpo_example.main(["--rows", "40", "--num-chunks", str(num_chunks),
                           "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out

    runs = rf.runs
    assert len(runs) == 4  # 2 betas x 2 loss types
    grid = {(r.knobs["beta"], _loss_type(r.knobs["loss_type"])) for r in runs}
    assert grid == {(b, t) for b in dpo_example.BETAS for t in dpo_example.LOSS_TYPES}
    for run in runs:
        assert run.status == RunStatus.COMPLETED, (run.name, run.status, run.error)
        assert run.global_step == 8  # 32 train rows / batch 4
        _assert_adapter(run, tmp_path)
        assert math.isfinite(run.metrics["eval_loss"])
        assert 0.0 <= run.metrics["eval_rewards/accuracies"] <= 1.0
        assert math.isfinite(run.metrics["eval_rewards/margins"])
        assert math.isfinite(run.metrics["rewards/margins"])

    # One base model serves every run as policy (through its own adapter) and as reference
    # (adapters disabled): no reference copy.
    assert list(rf.model_loads.values()) == [1]
    trainers = [rf.run_trainer(r.name) for r in runs]
    assert all(t.ref_model is None and t.model is trainers[0].model for t in trainers)

    _assert_runs_take_turns(rf.schedule, runs, num_chunks)

    best = rf.best_run
    assert best is not None and best.name in {r.name for r in runs}
    metric = dpo_example.BEST_METRIC
    assert best.metrics[metric] == max(r.metrics[metric] for r in runs)
    _assert_report(out, rf, metric)
    assert "eval acc" in out and "train margin" in out


def test_grpo_example_zips_rewards_and_cuts_chunks_on_generation_cycles(grpo_example, tmp_path,
                                                                         capsys):
    from trl_rapidfire.shared_state.runs import RunStatus
    from trl_rapidfire.trainers.grpo import generation_cycle_steps

    num_chunks = 3
    rf = grpo_example.main(["--rows", "20", "--num-chunks", str(num_chunks),
                            "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out

    runs = rf.runs
    assert len(runs) == 4  # 2 learning rates x 2 (reward set, weights) pairs
    combos = set()
    for run in runs:
        funcs = tuple(f.__name__ for f in run.knobs["reward_funcs"])
        weights = tuple(run.knobs["reward_weights"])
        assert (funcs, weights) in {(("correct_answer", "answer_format"), (1.0, 0.5)),
                                    (("correct_answer",), (1.0,))}  # zipped, not crossed
        combos.add((run.knobs["learning_rate"], funcs))
    assert len(combos) == 4

    total_steps = 16  # 16 train prompts x 4 generations / batch 4
    for run in runs:
        assert run.status == RunStatus.COMPLETED, (run.name, run.status, run.error)
        assert run.global_step == total_steps
        _assert_adapter(run, tmp_path)
        assert 0.0 <= run.metrics["eval_rewards/correct_answer/mean"] <= 1.0
        has_format = "answer_format" in {f.__name__ for f in run.knobs["reward_funcs"]}
        assert ("rewards/answer_format/mean" in run.metrics) == has_format
        assert ("eval_rewards/answer_format/mean" in run.metrics) == has_format

    cycle = generation_cycle_steps(rf.run_trainer(runs[0].name).args)
    assert cycle == 2  # steps_per_generation=2, no accumulation, one iteration
    schedule = rf.schedule
    for record in schedule:  # a boundary never falls inside a generation cycle
        assert record.start_step % cycle == 0, record
        assert record.end_step % cycle == 0 or record.end_step == total_steps, record
    for run in runs:  # each run's chunks tile its steps, in order
        spans = [(c.start_step, c.end_step) for c in schedule if c.run == run.name]
        assert spans[0][0] == 0 and spans[-1][1] == total_steps
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    _assert_runs_take_turns(schedule, runs, num_chunks)

    best = rf.best_run
    assert best is not None and best.name in {r.name for r in runs}
    metric = grpo_example.BEST_METRIC
    assert best.metrics[metric] == max(r.metrics[metric] for r in runs)
    _assert_report(out, rf, metric)
    assert "generation cycle 2 steps" in out


def test_grpo_example_rewards(grpo_example):
    correct, fmt = grpo_example.correct_answer, grpo_example.answer_format
    completions = ["7", "17", "3 plus 4 is 7.", "7 or 8", " Apple", "1,000", "",
                   [{"role": "assistant", "content": "It is 12"}]]
    answers = ["7", "7", "7", "7", "apple", "1000", "7", "12"]
    assert correct(completions, answers) == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    scores = fmt(["42", " apple.", "3 plus 4 is 7", "no " * 30])
    assert scores[:2] == [1.0, 1.0]
    assert 0.0 < scores[2] < 0.5 and scores[3] == 0.0


def test_parse_args_defaults_and_validation(dpo_example, grpo_example):
    args = dpo_example.parse_args([])
    assert args.model is None and args.dataset is None and args.num_chunks == 3
    args = grpo_example.parse_args([])
    assert args.model is None and args.num_chunks == 3 and args.steps_per_generation == 2
    for example in (dpo_example, grpo_example):
        with pytest.raises(SystemExit):
            example.parse_args(["--rows", "3"])
    with pytest.raises(SystemExit):
        grpo_example.parse_args(["--batch-size", "6", "--num-generations", "4"])
