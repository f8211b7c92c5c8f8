"""Runs judged by what they generate: at every chunk end each run answers the eval prompts with
its adapter (``generation_config``) and the user's ``compute_metrics`` scores the decoded
answers. Against plain TRL: the same config trained alone, checkpointed at the chunk ends, each
checkpoint's adapter loaded into a fresh model and asked the same prompts with transformers'
own batching (``apply_chat_template(..., padding=True)``, left padding, ``generate``). The
answers, the scores and the final adapters must be equal, and evaluating must not change
training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from rouge_score import rouge_scorer
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, EvalPrediction, GenerationConfig
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from trl_rapidfire import (
    List,
    RFDPOConfig,
    RFDPOTrainer,
    RFGRPOConfig,
    RFGRPOTrainer,
    RFSFTConfig,
    RFSFTTrainer,
)
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_grpo_dataset,
    make_sft_dataset,
    reward_correct_answer,
    tiny_lora_config,
    tiny_model_path,
)

ROUGE = rouge_scorer.RougeScorer(["rougeL"])
GREEDY = GenerationConfig(max_new_tokens=6, do_sample=False)
SAMPLED = GenerationConfig(max_new_tokens=6, do_sample=True, temperature=1.5, top_k=0)
# 32 rows, 4 a batch: 8 steps in 2 chunks, evaluated (and checkpointed by plain TRL) at 4 and 8.
ROWS, EVAL_ROWS, BATCH, CHUNK_STEPS = 32, 8, 4, 4
COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=BATCH,
              per_device_eval_batch_size=BATCH, num_train_epochs=1, logging_steps=1, seed=7,
              lr_scheduler_type="linear", warmup_steps=2)
# Plain TRL's side: a checkpoint at every chunk end.
CHECKPOINTED = dict(COMMON, save_strategy="steps", save_steps=CHUNK_STEPS)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def exact_and_rouge(prediction: EvalPrediction) -> dict[str, float]:
    """A user's scorer: exact match and ROUGE-L (rouge-score, offline) of decoded answers."""
    answers, references = prediction  # an EvalPrediction unpacks as (predictions, label_ids)
    pairs = list(zip(answers, references))
    return {
        "exact_match": sum(a.strip() == r.strip() for a, r in pairs) / len(pairs),
        "rouge_l": sum(ROUGE.score(r, a)["rougeL"].fmeasure for a, r in pairs) / len(pairs),
    }


def _eval_logs(trainer, run: str) -> dict[int, dict[str, float]]:
    """The run's evaluations by step, from its trainer's log history."""
    return {e["step"]: e for e in trainer.run_trainer(run).state.log_history if "eval_loss" in e}


def _saved_answers(run_dir: Path, step: int) -> list[dict]:
    text = (run_dir / "generations" / f"eval-step-{step:08d}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _reference_answers(checkpoint: Path, prompts: list, config: GenerationConfig,
                       seed: int | None = None) -> list[str]:
    """The checkpoint's adapter in a fresh model, asked ``prompts`` in batches of BATCH as
    transformers batches them (the tokenizer's own left padding)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    tokenizer.padding_side = "left"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    model = PeftModel.from_pretrained(base, str(checkpoint)).eval()
    if seed is not None:
        torch.manual_seed(seed)
    answers = []
    for start in range(0, len(prompts), BATCH):
        batch = prompts[start:start + BATCH]
        if isinstance(batch[0], str):
            inputs = tokenizer(batch, padding=True, return_tensors="pt")
        else:
            inputs = tokenizer.apply_chat_template(batch, add_generation_prompt=True,
                                                   tokenize=True, padding=True,
                                                   return_dict=True, return_tensors="pt")
        out = model.generate(**inputs, generation_config=config,
                             pad_token_id=tokenizer.pad_token_id)
        width = inputs["input_ids"].shape[1]
        answers += [tokenizer.decode(row, skip_special_tokens=True) for row in out[:, width:]]
    return answers


def _same_adapter(a: Path, b: Path) -> None:
    x = load_file(a / "adapter_model.safetensors")
    y = load_file(b / "adapter_model.safetensors")
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), (a, b)


def _check_against_plain(trainer, run: str, plain_dir: Path, prompts: list,
                         references: list[str], config: GenerationConfig) -> None:
    """The run's answers and scores at each chunk end equal the plain checkpoint's; its final
    adapter equals plain TRL's."""
    run_dir = Path(trainer.run_trainer(run).args.output_dir)
    logs = _eval_logs(trainer, run)
    assert sorted(logs) == [CHUNK_STEPS, 2 * CHUNK_STEPS], run
    for step, logged in logs.items():
        sampled = config.do_sample
        want = _reference_answers(plain_dir / f"checkpoint-{step}", prompts, config,
                                  seed=COMMON["seed"] + step if sampled else None)
        saved = _saved_answers(run_dir, step)
        assert [row["answer"] for row in saved] == want, (run, step)
        assert [row["reference"] for row in saved] == references
        scores = exact_and_rouge(EvalPrediction(predictions=want, label_ids=references))
        assert {k: logged[f"eval_{k}"] for k in scores} == scores, (run, step)
    _same_adapter(run_dir / "final", plain_dir / f"checkpoint-{2 * CHUNK_STEPS}")


def test_three_sft_configs_are_scored_on_their_answers_at_every_chunk_end(tmp_path):
    train = make_sft_dataset(ROWS, seed=1, kind="prompt_completion")
    evals = make_sft_dataset(EVAL_ROWS, seed=2, kind="prompt_completion")
    lrs = [1e-3, 3e-3, 1e-2]
    rf = RFSFTTrainer(
        model=tiny_model_path(), train_dataset=train, eval_dataset=evals,
        peft_config=tiny_lora_config(r=4), compute_metrics=exact_and_rouge,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), learning_rate=List(lrs), num_chunks=2,
                         eval_strategy="chunk", generation_config=GREEDY,
                         generation_saved_rows=EVAL_ROWS, **COMMON))
    rf.train()
    prompts = list(evals["prompt"])
    references = [c[0]["content"] for c in evals["completion"]]
    for i, lr in enumerate(lrs):
        plain = SFTTrainer(model=tiny_model_path(), train_dataset=train,
                           peft_config=tiny_lora_config(r=4),
                           args=SFTConfig(output_dir=str(tmp_path / f"plain-{i}"),
                                          **CHECKPOINTED, learning_rate=lr))
        plain.train()
        _check_against_plain(rf, f"run-{i}", tmp_path / f"plain-{i}", prompts, references,
                             GREEDY)
    # The scores reach the runs table as metrics.
    assert all("eval_rouge_l" in r.metrics and "eval_generation_seconds" in r.metrics
               for r in rf.runs)


def test_a_sampling_generation_config_never_moves_training(tmp_path):
    # Two runs that train alike and generate differently (greedy, sampled) end bitwise equal;
    # the sampled answers come from a stream seeded by seed + step.
    train = make_sft_dataset(ROWS, seed=1, kind="prompt_completion")
    evals = make_sft_dataset(EVAL_ROWS, seed=2, kind="prompt_completion")
    rf = RFSFTTrainer(
        model=tiny_model_path(), train_dataset=train, eval_dataset=evals,
        peft_config=tiny_lora_config(r=4), compute_metrics=exact_and_rouge,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), learning_rate=3e-3, num_chunks=2,
                         eval_strategy="chunk", generation_config=List([GREEDY, SAMPLED]),
                         generation_saved_rows=EVAL_ROWS, **COMMON))
    rf.train()
    plain = SFTTrainer(model=tiny_model_path(), train_dataset=train,
                       peft_config=tiny_lora_config(r=4),
                       args=SFTConfig(output_dir=str(tmp_path / "plain"), **CHECKPOINTED,
                                      learning_rate=3e-3))
    plain.train()
    prompts = list(evals["prompt"])
    references = [c[0]["content"] for c in evals["completion"]]
    for run, config in (("run-0", GREEDY), ("run-1", SAMPLED)):
        _check_against_plain(rf, run, tmp_path / "plain", prompts, references, config)
    greedy = _saved_answers(tmp_path / "rf" / "runs" / "run-0", CHUNK_STEPS)
    sampled = _saved_answers(tmp_path / "rf" / "runs" / "run-1", CHUNK_STEPS)
    assert greedy != sampled  # the knob did change what was generated
    assert [r.knobs["generation_config"].do_sample for r in rf.runs] == [False, True]


def test_dpo_runs_answer_the_prompts_and_are_scored_against_the_chosen_answers(tmp_path):
    train, evals = make_dpo_dataset(ROWS, seed=1), make_dpo_dataset(EVAL_ROWS, seed=2)
    rf = RFDPOTrainer(
        model=tiny_model_path(), train_dataset=train, eval_dataset=evals,
        peft_config=tiny_lora_config(r=4), compute_metrics=exact_and_rouge,
        args=RFDPOConfig(output_dir=str(tmp_path / "rf"), beta=List([0.1, 0.5]), num_chunks=2,
                         eval_strategy="chunk", generation_config=GREEDY,
                         generation_saved_rows=EVAL_ROWS, **COMMON,
                         learning_rate=3e-3))
    rf.train()
    for i, beta in enumerate([0.1, 0.5]):
        plain = DPOTrainer(model=tiny_model_path(), train_dataset=train,
                           peft_config=tiny_lora_config(r=4),
                           args=DPOConfig(output_dir=str(tmp_path / f"plain-{i}"), beta=beta,
                                          **CHECKPOINTED, learning_rate=3e-3))
        plain.train()
        _check_against_plain(rf, f"run-{i}", tmp_path / f"plain-{i}", list(evals["prompt"]),
                             list(evals["chosen"]), GREEDY)


class _EvalAt:
    """Plain GRPO's reference: evaluate at the chunk ends, putting the random streams back
    afterwards (what evaluating at a chunk end must not change)."""

    def __init__(self, every: int) -> None:
        from transformers import TrainerCallback

        from trl_rapidfire.runtime.switch import RngState

        outer = self

        class Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % every == 0:
                    control.should_evaluate = True
                    outer.rng = RngState.capture()

            def on_evaluate(self, args, state, control, **kwargs):
                outer.rng.restore()

        self.callback = Callback()


def test_grpo_runs_are_scored_by_their_reward_functions_at_every_chunk_end(tmp_path):
    # 4 prompts, each generated for 4 times a step: 4 steps, 2 chunks of one generation cycle.
    grpo = dict(COMMON, num_generations=4, max_completion_length=8, steps_per_generation=2,
                beta=0.04, learning_rate=3e-3)
    train, evals, chunk = make_grpo_dataset(4, seed=1), make_grpo_dataset(2, seed=2), 2
    rf = RFGRPOTrainer(
        model=tiny_model_path(), reward_funcs=[reward_correct_answer], train_dataset=train,
        eval_dataset=evals, peft_config=tiny_lora_config(r=4),
        args=RFGRPOConfig(output_dir=str(tmp_path / "rf"), temperature=List([0.7, 1.2]),
                          num_chunks=2, eval_strategy="chunk", **grpo))
    rf.train()
    for i, temperature in enumerate([0.7, 1.2]):
        config = dict(grpo, temperature=temperature)
        evaluated = GRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_correct_answer],
                                train_dataset=train, eval_dataset=evals,
                                peft_config=tiny_lora_config(r=4),
                                callbacks=[_EvalAt(chunk).callback],
                                args=GRPOConfig(output_dir=str(tmp_path / f"eval-{i}"), **config))
        evaluated.train()
        want = {e["step"]: e for e in evaluated.state.log_history if "eval_loss" in e}
        got = _eval_logs(rf, f"run-{i}")
        assert sorted(got) == sorted(want) == [chunk, 2 * chunk]
        for step in want:
            keys = [k for k in want[step] if k.startswith("eval_reward")]
            assert keys and {k: got[step][k] for k in keys} == {k: want[step][k] for k in keys}
        plain = GRPOTrainer(model=tiny_model_path(), reward_funcs=[reward_correct_answer],
                            train_dataset=train, peft_config=tiny_lora_config(r=4),
                            args=GRPOConfig(output_dir=str(tmp_path / f"plain-{i}"), **config))
        plain.train()
        plain.save_model()
        _same_adapter(tmp_path / "rf" / "runs" / f"run-{i}" / "final", tmp_path / f"plain-{i}")


def char_score(prediction: EvalPrediction) -> dict[str, float]:
    """A user's score of the answers' text alone (the tiny model's answers are noise: a score
    that tells runs apart, not one that reads well)."""
    return {"score": sum(ord(c) % 7 for a in prediction.predictions for c in a) / 100}


def _generation_experiment(out: Path, lrs, **kwargs) -> RFSFTTrainer:
    return RFSFTTrainer(
        model=tiny_model_path(), peft_config=tiny_lora_config(r=4), compute_metrics=char_score,
        train_dataset=make_sft_dataset(ROWS, seed=1, kind="prompt_completion"),
        eval_dataset=make_sft_dataset(EVAL_ROWS, seed=2, kind="prompt_completion"),
        args=RFSFTConfig(output_dir=str(out), learning_rate=lrs, num_chunks=4,
                         eval_strategy="chunk", generation_config=GREEDY, **COMMON), **kwargs)


def test_successive_halving_keeps_the_runs_that_answer_best(tmp_path):
    from trl_rapidfire import SuccessiveHalving
    from trl_rapidfire.shared_state.runs import RunStatus

    rf = _generation_experiment(tmp_path / "exp", List([1e-3, 3e-3, 1e-2, 3e-2]),
                                policy=SuccessiveHalving("eval_score", mode="max"))
    rf.train()
    # 8 steps in 4 chunks: rung 0 at step 2. Every run stopped there scored below every run
    # that went on (mode="max"), and the policy did stop some.
    at_rung = {r.name: _eval_logs(rf, r.name)[2]["eval_score"] for r in rf.runs}
    stopped = {r.name for r in rf.runs if r.status == RunStatus.STOPPED and r.global_step == 2}
    went_on = set(at_rung) - stopped
    assert stopped and went_on
    assert max(at_rung[r] for r in stopped) < min(at_rung[r] for r in went_on), at_rung


def test_optuna_maximizes_a_generation_metric(tmp_path):
    optuna = pytest.importorskip("optuna")
    from trl_rapidfire import OptunaSearch, Range

    out = tmp_path / "exp"
    rf = _generation_experiment(out, Range(1e-4, 1e-1, log=True),
                                search=OptunaSearch(num_runs=3, max_concurrent=2, seed=3,
                                                    metric="eval_score", direction="maximize"))
    rf.train()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(out / ".rapidfire" / "optuna.journal")))
    study = optuna.load_study(study_name="trl-rapidfire", storage=storage)
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    told = sorted(t.value for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    final = sorted(_eval_logs(rf, r.name)[2 * CHUNK_STEPS]["eval_score"] for r in rf.runs)
    assert len(told) == 3 and told == final
    # The best run is the study's best (no metric_for_best_model given).
    assert rf.best_run.name == max(rf.runs, key=lambda r: r.metrics["eval_score"]).name


def _dominates(a: list[float], b: list[float], signs: list[float]) -> bool:
    """``a`` at least as good as ``b`` in every objective and better in one (signs: +1 to
    minimize, -1 to maximize)."""
    pairs = [(s * x, s * y) for s, x, y in zip(signs, a, b)]
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def test_a_two_objective_search_tells_both_values_and_reports_the_pareto_front(tmp_path,
                                                                            capsys):
    optuna = pytest.importorskip("optuna")
    from trl_rapidfire import OptunaSearch, Range
    from trl_rapidfire.cli import main as cli
    from trl_rapidfire.reports.experiment_data import load_experiment
    from trl_rapidfire.reports.plots import summary_markdown

    out = tmp_path / "exp"
    search = OptunaSearch(num_runs=4, max_concurrent=2, seed=3,
                          metric=["eval_loss", "eval_score"],
                          direction=["minimize", "maximize"])
    rf = _generation_experiment(out, Range(1e-4, 1e-1, log=True), search=search)
    rf.train()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(out / ".rapidfire" / "optuna.journal")))
    study = optuna.load_study(study_name="trl-rapidfire", storage=storage)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MAXIMIZE"]
    told = {t.user_attrs["run"]: t.values for t in study.trials
            if t.state == optuna.trial.TrialState.COMPLETE}
    last = {r.name: _eval_logs(rf, r.name)[2 * CHUNK_STEPS] for r in rf.runs}
    assert told == {run: [e["eval_loss"], e["eval_score"]] for run, e in last.items()}
    assert all(not t.intermediate_values for t in study.trials)  # Optuna prunes on one
    # The front: the runs no other run dominates, as Optuna computed it and as logged.
    front = sorted(run for run, v in told.items()
                   if not any(_dominates(w, v, [1, -1]) for w in told.values()))
    assert sorted(t.user_attrs["run"] for t in study.best_trials) == front
    assert len(front) < len(told)  # this study has dominated runs: the front is a choice
    cli(["status", "--output-dir", str(out)])
    shown = [line for line in capsys.readouterr().out.splitlines() if "Pareto" in line]
    assert shown == [f"Pareto front: {' '.join(front)} (no run better in every objective)"]
    summary = summary_markdown(load_experiment(out), "eval_score").splitlines()
    assert [line for line in summary if "Pareto" in line] == [
        "Pareto front (no run better in every objective): " + ", ".join(front)]
    # The best run: the best by the first objective, which is on the front.
    best = rf.best_run.name
    assert best == min(last, key=lambda run: last[run]["eval_loss"]) and best in front


@pytest.mark.parametrize(("metric", "direction", "match"), [
    (["eval_loss", "eval_score"], "minimize", "2 metric.s. and 1 direction"),
    (["eval_loss", "eval_loss"], ["minimize", "maximize"], "each metric once"),
    ([], [], "a logged metric's name"),
    (["eval_loss", "eval_score"], ["minimize", "up"], "'minimize' or 'maximize'"),
])
def test_a_bad_objective_list_is_refused(metric, direction, match):
    pytest.importorskip("optuna")
    from trl_rapidfire import OptunaSearch
    from trl_rapidfire.search.searches import SearchError

    with pytest.raises(SearchError, match=match):
        OptunaSearch(num_runs=2, metric=metric, direction=direction)


def test_one_configs_final_adapter_and_answers_are_in_its_run_folder(tmp_path):
    # One config trains with the experiment's output_dir as its TRL one (checkpoints there, as
    # plain TRL), and keeps what is its own where docs/evaluation.md says: runs/run-0/.
    out = tmp_path / "rf"
    rf = RFSFTTrainer(
        model=tiny_model_path(),
        train_dataset=make_sft_dataset(ROWS, seed=1, kind="prompt_completion"),
        eval_dataset=make_sft_dataset(EVAL_ROWS, seed=2, kind="prompt_completion"),
        peft_config=tiny_lora_config(r=4),
        args=RFSFTConfig(output_dir=str(out), num_chunks=2, eval_strategy="chunk",
                         generation_config=GREEDY, **COMMON))
    rf.train()
    (run,) = rf.runs
    assert Path(run.output_dir) == out / "runs" / "run-0"
    assert (Path(run.final_dir) / "adapter_model.safetensors").is_file()
    saved = sorted(p.name for p in (out / "runs" / "run-0" / "generations").iterdir())
    assert saved == [f"eval-step-{CHUNK_STEPS:08d}.jsonl", f"eval-step-{2 * CHUNK_STEPS:08d}.jsonl"]
    assert not (out / "generations").exists()
