"""The seven ``examples/*_multi_config.py`` scripts run end to end on the tiny offline model:
every run of the grid completes, the runs take turns chunk by chunk, what is special to the
kind holds (shared reference, score heads, generation cycles, one teacher), and the printed
ranking is the real one, best first."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from trl_rapidfire.shared_state.runs import RunStatus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KINDS = ["sft", "dpo", "grpo", "kto", "reward", "rloo", "distillation"]


def load(kind: str, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the examples import _common, beside them
    spec = importlib.util.spec_from_file_location(f"{kind}_multi_config_example",
                                                  EXAMPLES / f"{kind}_multi_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(kind: str, monkeypatch, tmp_path, capsys, rows: int):
    """The example's ``main`` on ``rows`` rows in 2 chunks: its trainer and what it printed."""
    trainer = load(kind, monkeypatch).main(["--rows", str(rows), "--num-chunks", "2",
                                            "--output-dir", str(tmp_path)])
    return trainer, capsys.readouterr().out


def check_experiment(trainer, out: str, tmp_path: Path, grid: dict[str, list], steps: int):
    """The grid's runs all completed ``steps`` steps in 2 chunks each, taking turns, on one base
    model; the printed ranking is the runs sorted by the metric, and its head is the best run."""
    runs = trainer.runs
    combos = {tuple(_plain(run.knobs[k]) for k in grid) for run in runs}
    assert len(runs) == len(combos) == math.prod(len(v) for v in grid.values())
    assert combos == {tuple(c) for c in _product([[_plain(v) for v in vs]
                                                  for vs in grid.values()])}
    metric = trainer.args.metric_for_best_model
    for run in runs:
        assert run.status == RunStatus.COMPLETED, (run.name, run.status, run.error)
        assert run.global_step == steps, run.name
        assert Path(run.output_dir).is_relative_to(tmp_path)
        assert (Path(run.final_dir) / "adapter_model.safetensors").is_file()
        assert math.isfinite(run.metrics[metric]), (run.name, metric)
    assert list(trainer.model_loads.values()) == [1]  # one base model for every run

    # Runs take turns: each trains its chunks in order, spanning its steps, and no run starts
    # its second chunk before every run has trained its first.
    schedule = trainer.schedule
    assert len(schedule) == 2 * len(runs)
    for run in runs:
        mine = [c for c in schedule if c.run == run.name]
        assert [c.number for c in mine] == [0, 1]
        assert mine[0].start_step == 0 and mine[0].end_step == mine[1].start_step
        assert mine[1].end_step == steps
    numbers = [c.number for c in schedule]
    assert numbers == sorted(numbers), [(c.run, c.number) for c in schedule]

    # The ranking printed is the runs sorted by the metric (ties in declaration order).
    higher = not metric.endswith("loss")
    expected = sorted(runs, key=lambda r: -r.metrics[metric] if higher else r.metrics[metric])
    printed = _ranking_rows(out, metric)
    assert printed == [r.name for r in expected], out
    best = trainer.best_run
    assert best.name == expected[0].name
    assert best.metrics[metric] == (max if higher else min)(r.metrics[metric] for r in runs)
    assert f"Best run: {best.name} ({metric}=" in out
    for run in runs:  # the chunk timeline, a line per run
        assert re.search(rf"^{run.name}  \S+  steps \[0,", out, re.M), run.name


def _ranking_rows(out: str, metric: str) -> list[str]:
    """The run names of the printed ranking, in order (the best one's ``*`` dropped)."""
    table = out.split(f"Runs, best first by {metric}:\n", 1)[1].split("\n\n", 1)[0]
    rows = table.splitlines()[2:]  # after the header and its rule
    assert rows[0].split()[0].endswith("*"), table
    return [row.split()[0].rstrip("*") for row in rows]


def _plain(value):
    """A knob value as something hashable and comparable across the run and the grid."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if callable(value):
        return value.__name__
    if hasattr(value, "r") and hasattr(value, "target_modules"):  # a LoraConfig
        return ("lora", value.r, value.task_type)
    return value


def _product(axes):
    if not axes:
        return [()]
    return [(v, *rest) for v in axes[0] for rest in _product(axes[1:])]


def test_sft_example(monkeypatch, tmp_path, capsys):
    trainer, out = run_example("sft", monkeypatch, tmp_path, capsys, rows=40)
    lora = [("lora", r, "CAUSAL_LM") for r in (4, 16)]
    check_experiment(trainer, out, tmp_path, steps=4,  # 32 train rows, batch 8
                     grid={"learning_rate": [5e-3, 1e-3], "peft_config": lora})


def test_dpo_example_uses_the_shared_base_model_as_reference(monkeypatch, tmp_path, capsys):
    trainer, out = run_example("dpo", monkeypatch, tmp_path, capsys, rows=20)
    check_experiment(trainer, out, tmp_path, steps=4,  # 16 train pairs, batch 4
                     grid={"beta": [0.1, 0.5], "loss_type": ["sigmoid", "ipo"]})
    trainers = [trainer.run_trainer(r.name) for r in trainer.runs]
    assert all(t.ref_model is None and t.model is trainers[0].model for t in trainers)
    for run in trainer.runs:
        assert 0.0 <= run.metrics["eval_rewards/accuracies"] <= 1.0


def _check_generation_cycles(trainer, cycle: int) -> None:
    from trl_rapidfire.trainers.generation_loop import generation_cycle_steps

    for run in trainer.runs:
        assert generation_cycle_steps(trainer.run_trainer(run.name).args) == cycle
    for chunk in trainer.schedule:  # no boundary inside a generation cycle
        assert chunk.start_step % cycle == 0 and chunk.end_step % cycle == 0, chunk


def test_grpo_example_zips_rewards_with_weights_and_cuts_on_cycles(monkeypatch, tmp_path,
                                                                   capsys):
    trainer, out = run_example("grpo", monkeypatch, tmp_path, capsys, rows=10)
    check_experiment(trainer, out, tmp_path, steps=8,  # 8 prompts x 4 completions, batch 4
                     grid={"learning_rate": [1e-2, 3e-3],
                           "reward_funcs": [("reward_correct_answer", "reward_short"),
                                            ("reward_correct_answer",)]})
    for run in trainer.runs:  # zipped, not crossed: each reward set with its own weights
        funcs = _plain(run.knobs["reward_funcs"])
        assert tuple(run.knobs["reward_weights"]) == ((1.0, 0.5) if len(funcs) == 2 else (1.0,))
        assert ("eval_rewards/reward_short/mean" in run.metrics) == (len(funcs) == 2)
    _check_generation_cycles(trainer, cycle=2)


def test_kto_example_uses_the_shared_base_model_as_reference(monkeypatch, tmp_path, capsys):
    trainer, out = run_example("kto", monkeypatch, tmp_path, capsys, rows=20)
    check_experiment(trainer, out, tmp_path, steps=4,  # 16 train rows, batch 4
                     grid={"learning_rate": [1e-2, 1e-3], "desirable_weight": [1.0, 1.5]})
    trainers = [trainer.run_trainer(r.name) for r in trainer.runs]
    assert all(t.ref_model is None and t.model is trainers[0].model for t in trainers)
    for run in trainer.runs:
        assert {"eval_rewards/chosen", "eval_rewards/rejected", "eval_kl"} <= set(run.metrics)


def test_reward_example_trains_a_score_head_per_run(monkeypatch, tmp_path, capsys):
    trainer, out = run_example("reward", monkeypatch, tmp_path, capsys, rows=20)
    lora = [("lora", r, "SEQ_CLS") for r in (4, 16)]
    check_experiment(trainer, out, tmp_path, steps=4,  # 16 train pairs, batch 4
                     grid={"learning_rate": [3e-3, 3e-4], "peft_config": lora})
    (load_key,) = trainer.model_loads
    assert "AutoModelForSequenceClassification" in load_key  # loaded once, as a classifier
    heads = []
    for run in trainer.runs:
        assert 0.0 <= run.metrics["accuracy"] <= 1.0 and 0.0 <= run.metrics["eval_accuracy"] <= 1
        saved = load_file(Path(run.final_dir) / "adapter_model.safetensors")
        (head,) = [v for k, v in saved.items() if "score" in k]  # its own copy of the head
        assert head.shape[0] == 1  # one label
        heads.append(head)
    assert not any((heads[0] == other).all() for other in heads[1:])  # trained apart


def test_rloo_example_cuts_chunks_on_generation_cycles(monkeypatch, tmp_path, capsys):
    trainer, out = run_example("rloo", monkeypatch, tmp_path, capsys, rows=10)
    check_experiment(trainer, out, tmp_path, steps=4,  # 8 prompts x 2 completions, batch 4
                     grid={"learning_rate": [1e-2, 3e-3], "beta": [0.0, 0.05]})
    _check_generation_cycles(trainer, cycle=2)  # generation_batch_size 8 = 2 steps of 4
    for run in trainer.runs:  # with beta > 0 the reference is the base model, adapters off
        assert trainer.run_trainer(run.name).ref_model is None
        assert {"eval_rewards/reward_correct_answer/mean", "eval_reward"} <= set(run.metrics)


def test_distillation_example_loads_the_teacher_once(monkeypatch, tmp_path, capsys):
    from trl_rapidfire.testing import tiny_teacher_path

    trainer, out = run_example("distillation", monkeypatch, tmp_path, capsys, rows=10)
    lora = [("lora", r, "CAUSAL_LM") for r in (4, 16)]
    check_experiment(trainer, out, tmp_path, steps=2,  # 8 train prompts, batch 4
                     grid={"learning_rate": [1e-2, 1e-3], "peft_config": lora})
    assert trainer.teacher_loads == {tiny_teacher_path(): 1}
    teachers = {id(trainer.run_trainer(r.name).teacher_model) for r in trainer.runs}
    assert len(teachers) == 1  # one teacher object serves every run
    assert f"Teacher loads: {{'{tiny_teacher_path()}': 1}}" in out


@pytest.mark.parametrize("kind", KINDS)
def test_every_example_fits_a_screen_and_parses_its_command_line(kind, monkeypatch):
    source = (EXAMPLES / f"{kind}_multi_config.py").read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 60
    assert "print_ranking(trainer)" in source and "trainer.train()" in source
    example = load(kind, monkeypatch)
    import _common

    args = _common.command_line(example.__doc__, [], rows=20)
    assert args.tiny and Path(args.model).is_dir() and args.num_chunks == 2
    with pytest.raises(SystemExit):
        _common.command_line(example.__doc__, ["--rows", "3"], rows=20)


def test_a_dataset_file_is_kept_to_the_columns_the_trainer_reads(monkeypatch, tmp_path):
    load("sft", monkeypatch)
    import _common

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}", "id": i, "source": "x"}) + "\n"
                            for i in range(30)))
    args = _common.command_line("x", ["--dataset", str(data), "--rows", "20"], rows=10)
    train, held_out = _common.splits(args, None, ["prompt", "completion"], ["text"])
    assert train.column_names == held_out.column_names == ["text"]
    assert (len(train), len(held_out)) == (16, 4)
    with pytest.raises(SystemExit, match="expected"):
        _common.splits(args, None, ["prompt", "answer"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["reward"])
def test_an_example_runs_as_its_docstring_says(kind, tmp_path):
    """``HF_HUB_OFFLINE=1 python examples/<kind>_multi_config.py``, on its own defaults, as a
    script (so ``_common`` is found beside it), ends with the ranking and the best run. One
    kind: every script's ``__main__`` is the same two lines, and each script's ``main()`` is
    run in this process by the tests above (a fresh process a script costs ~25 s here)."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{kind}_multi_config.py"),
                           "--output-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranking = proc.stdout.split("Runs, best first by ", 1)[1]
    rows = ranking.split("\n\n", 1)[0].splitlines()[3:]  # after the title, header and rule
    assert len(rows) == 4 and rows[0].split()[0].endswith("*"), ranking
    best = rows[0].split()[0].rstrip("*")
    assert f"Best run: {best} (" in proc.stdout
    assert (tmp_path / "runs" / best / "final" / "adapter_model.safetensors").is_file()
