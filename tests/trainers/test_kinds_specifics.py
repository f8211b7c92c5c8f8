"""What each new kind brings beyond the common path: a distillation teacher that is a knob,
loaded once per candidate and shared by the runs that name it; KTO runs judged by what they
generate, as SFT and DPO runs can be, against the completions labelled desirable."""

from __future__ import annotations

import json
from pathlib import Path

from trainer_kinds import KINDS, same_adapter
from transformers import EvalPrediction, GenerationConfig

from trl_rapidfire import List
from trl_rapidfire.testing import make_kto_dataset, tiny_model_path, tiny_teacher_path


def test_each_teacher_is_loaded_once_and_shared_by_the_runs_that_name_it(tmp_path):
    spec = KINDS["distillation"]
    teachers = [tiny_teacher_path(seed=1), tiny_teacher_path(seed=2)]
    experiment = spec.experiment(tmp_path / "rf", trainer={"teacher_model": List(teachers)},
                                 num_chunks=2, learning_rate=List([1e-3, 3e-3]))
    experiment.train()
    assert experiment.teacher_loads == {teachers[0]: 1, teachers[1]: 1}
    by_teacher: dict[str, set[int]] = {}
    for run in experiment.runs:
        trainer = experiment.run_trainer(run.name)
        by_teacher.setdefault(run.knobs["teacher_model"], set()).add(id(trainer.teacher_model))
    assert all(len(ids) == 1 for ids in by_teacher.values()) and len(by_teacher) == 2
    # Each run ends as its plain TRL twin, which loads its own teacher.
    for run in experiment.runs:
        knobs = dict(run.knobs)
        alone = spec.plain_trainer(
            model=tiny_model_path(), **{**spec.shared, "teacher_model": knobs.pop("teacher_model")},
            args=spec.plain_config(output_dir=str(tmp_path / run.name),
                                   **{**spec.common, **knobs}))
        alone.train()
        alone.save_model()
        assert same_adapter(Path(run.output_dir) / "final", tmp_path / run.name), run.name


def _exact(prediction: EvalPrediction) -> dict[str, float]:
    answers, references = prediction
    return {"exact": sum(a.strip() == r.strip() for a, r in zip(answers, references))
            / len(answers)}


def test_kto_runs_answer_the_eval_prompts_and_are_scored_against_the_desirable_ones(tmp_path):
    spec = KINDS["kto"]
    evals = make_kto_dataset(4, seed=3)
    experiment = spec.experiment(
        tmp_path, trainer={"eval_dataset": evals, "compute_metrics": _exact}, num_chunks=2,
        learning_rate=List([1e-3, 3e-3]), eval_strategy="chunk", per_device_eval_batch_size=4,
        generation_config=GenerationConfig(max_new_tokens=4, do_sample=False),
        generation_saved_rows=4)
    experiment.train()
    for run in experiment.runs:
        evaluations = [e for e in experiment.run_trainer(run.name).state.log_history
                       if "eval_exact" in e]
        assert [e["step"] for e in evaluations] == [2, 4]
        saved = sorted((Path(run.output_dir) / "generations").glob("eval-step-*.jsonl"))
        rows = [json.loads(line) for line in saved[-1].read_text().splitlines()]
        # Thumbs-down rows are no answer to aim at: only the desirable ones are references.
        assert [r["reference"] for r in rows] == \
            [c for c, good in zip(evals["completion"], evals["label"]) if good]
        assert 0 < len(rows) < len(evals)
        assert all(isinstance(r["answer"], str) for r in rows)
