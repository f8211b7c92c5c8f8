"""The generation eval's parts and its refusals: which rows give which prompt and reference,
generating never moves torch's random streams, a bad ``generation_config`` or eval set is
refused before anything trains, and a scorer that returns something else than numbers fails
its run with a clear error while the others train on."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, EvalPrediction, GenerationConfig

from trl_rapidfire import List, RFGRPOConfig, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.config.knobs import describe_value
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_dpo_dataset,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)
from trl_rapidfire.trainers.generation_eval import answer, exact_match, examples_of, prompt_ids

GREEDY = GenerationConfig(max_new_tokens=4)
COMMON = dict(cpu_training_kwargs(), per_device_train_batch_size=4, num_train_epochs=1,
              logging_steps=1, num_chunks=2)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_each_row_kind_gives_its_prompt_and_reference():
    rows = [
        {"prompt": "What is 1 plus 2?", "completion": " 3"},
        {"prompt": [{"role": "user", "content": "Hi?"}],
         "completion": [{"role": "assistant", "content": "Hello"}]},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Name a fruit."},
                      {"role": "assistant", "content": "apple"}]},
    ]
    got = examples_of(rows, "completion")
    assert [e.reference for e in got] == [" 3", "Hello", "apple"]
    assert got[0].prompt == "What is 1 plus 2?"
    assert got[2].prompt == rows[2]["messages"][:2]  # the turns before the answer
    dpo = examples_of(make_dpo_dataset(2, seed=3), "chosen")
    assert [e.reference for e in dpo] == list(make_dpo_dataset(2, seed=3)["chosen"])
    with pytest.raises(ValueError, match=r"eval row 1 has no prompt.*\['text'\]"):
        examples_of([rows[0], {"text": "What is 2 plus 2? 4"}], "completion")
    with pytest.raises(ValueError, match="eval row 0"):
        examples_of([{"messages": [{"role": "user", "content": "unanswered"}]}], "completion")


def test_a_conversational_prompt_is_tokenized_with_the_generation_prompt():
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    messages = [{"role": "user", "content": "What comes after 3?"}]
    ids = prompt_ids(tokenizer, messages)
    assert ids == tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=True, return_dict=True)["input_ids"]
    assert tokenizer.decode(ids).endswith("<|assistant|>")
    assert prompt_ids(tokenizer, "plain text") == tokenizer(text="plain text")["input_ids"]


def test_sampling_never_moves_torchs_random_streams_and_repeats_for_a_seed():
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    prompts = [prompt_ids(tokenizer, f"What is {i} plus 1?") for i in range(3)]
    sampled = GenerationConfig(max_new_tokens=5, do_sample=True, temperature=2.0, top_k=0)
    torch.manual_seed(11)
    before = torch.get_rng_state()
    first = answer(model, tokenizer, prompts, sampled, batch_size=2, seed=5)
    assert torch.equal(torch.get_rng_state(), before)
    assert answer(model, tokenizer, prompts, sampled, batch_size=2, seed=5) == first
    assert answer(model, tokenizer, prompts, sampled, batch_size=2, seed=6) != first


def test_exact_match_is_the_default_score():
    got = exact_match(EvalPrediction(predictions=[" 3 ", "4", "x"], label_ids=["3", "5", None]))
    assert got == {"exact_match": 0.5}  # a row without a reference is not scored


@pytest.mark.parametrize(("value", "match"), [
    ({"max_new_token": 8}, "no field `max_new_token` .did you mean `max_new_tokens`"),
    ({"do_sample": True}, "needs max_new_tokens"),
    ("{not json", "not valid JSON"),
    (7, "takes a transformers.GenerationConfig or a dict"),
    (List([GREEDY, {"max_new_tokens": 0}]), "max_new_tokens` is 0: it must be an integer from 1"),
])
def test_a_bad_generation_config_is_refused_when_the_config_is_made(tmp_path, value, match):
    with pytest.raises(RFConfigError, match=match):
        RFSFTConfig(output_dir=str(tmp_path), generation_config=value, **COMMON)


def test_generation_fields_read_from_json_and_show_by_their_fields(tmp_path):
    config = RFSFTConfig(output_dir=str(tmp_path), **COMMON,
                         generation_config='{"max_new_tokens": 8, "do_sample": false}')
    assert config.to_dict()["generation_config"] == '{"max_new_tokens": 8, "do_sample": false}'
    made = RFSFTConfig(output_dir=str(tmp_path), generation_config=GREEDY, **COMMON)
    assert made.to_dict()["generation_config"] == {"max_new_tokens": 4}
    assert describe_value(GREEDY) == "GenerationConfig(max_new_tokens=4)"
    with pytest.raises(TypeError, match="generation_config"):
        RFGRPOConfig(output_dir=str(tmp_path), generation_config=GREEDY)  # GRPO generates itself


def _experiment(tmp_path, eval_dataset, **config):
    return RFSFTTrainer(
        model=tiny_model_path(), peft_config=tiny_lora_config(r=4),
        train_dataset=make_sft_dataset(8, seed=1, kind="prompt_completion"),
        eval_dataset=eval_dataset,
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), generation_config=GREEDY,
                         **COMMON, **config))


def test_a_run_that_is_never_evaluated_or_has_no_prompts_is_refused_before_training(tmp_path):
    pairs = make_sft_dataset(4, seed=2, kind="prompt_completion")
    with pytest.raises(RFConfigError, match="run-0: generation_config .* never evaluated"):
        _experiment(tmp_path, pairs, eval_strategy="no")
    with pytest.raises(RFConfigError, match=r"eval_dataset: eval row 0 has no prompt"):
        _experiment(tmp_path, make_sft_dataset(4, seed=2), eval_strategy="chunk")
    with pytest.raises(RFConfigError, match=r"eval_dataset\['text'\]: eval row 0"):
        _experiment(tmp_path, {"pairs": pairs, "text": make_sft_dataset(4, seed=2)},
                    eval_strategy="chunk")
    assert not (tmp_path / "exp" / "runs").exists()


def test_a_scorer_that_returns_no_numbers_fails_its_run_and_the_others_train_on(tmp_path):
    def words(prediction):
        return {"first_answer": prediction.predictions[0]}

    def length(prediction):
        return {"length": sum(map(len, prediction.predictions))}

    trainer = RFSFTTrainer(
        model=tiny_model_path(), peft_config=tiny_lora_config(r=4),
        train_dataset=make_sft_dataset(8, seed=1, kind="prompt_completion"),
        eval_dataset=make_sft_dataset(4, seed=2, kind="prompt_completion"),
        compute_metrics=List([words, length]),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), generation_config=GREEDY,
                         eval_strategy="chunk", **COMMON))
    with pytest.warns(RuntimeWarning, match="run-0 failed"):
        trainer.train()
    failed, done = trainer.runs
    assert failed.status == RunStatus.FAILED and "every value must be a number" in failed.error
    assert "compute_metrics (" in failed.error and "words" in failed.error
    assert done.status == RunStatus.COMPLETED and "eval_length" in done.metrics


def test_each_of_several_eval_sets_is_generated_for_under_its_own_name(tmp_path):
    sets = {"sums": make_sft_dataset(4, seed=2, kind="prompt_completion"),
            "chats": make_sft_dataset(3, seed=3, kind="messages")}
    trainer = _experiment(tmp_path, sets, eval_strategy="chunk", generation_saved_rows=2,
                          generation_eval_rows=3)
    trainer.train()
    metrics = trainer.runs[0].metrics
    assert {"eval_sums_exact_match", "eval_chats_exact_match"} <= set(metrics)
    folder = tmp_path / "exp" / "runs" / "run-0" / "generations"  # one config: its run folder
    saved = sorted(p.name for p in folder.iterdir())
    assert saved == ["eval_chats-step-00000001.jsonl", "eval_chats-step-00000002.jsonl",
                     "eval_sums-step-00000001.jsonl", "eval_sums-step-00000002.jsonl"]
    assert len((folder / "eval_sums-step-00000002.jsonl").read_text().splitlines()) == 2


def test_runs_that_read_an_eval_set_alike_read_it_once():
    from trl_rapidfire.trainers.generation_eval import GenerationEval

    class Counted(list):
        reads = 0

        def __iter__(self):
            Counted.reads += 1
            return super().__iter__()

    rows = Counted([{"prompt": f"What is {i} plus 1?", "completion": str(i + 1)}
                    for i in range(4)])
    shared: dict = {}
    runs = [GenerationEval.build(GREEDY, None, rows, reference_column="completion",
                                 max_rows=None, saved_rows=0, shared_examples=shared)
            for _ in range(3)]
    got = [run.examples("eval") for run in runs]
    assert Counted.reads == 1 and got[0] is got[1] is got[2]
    assert [e.reference for e in got[0]] == ["1", "2", "3", "4"]
