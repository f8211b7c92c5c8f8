"""Tests for the offline test bed in ``trl_rapidfire.testing``."""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from trl_rapidfire.testing import (
    EOS_TOKEN,
    TINY_MODEL_VERSION,
    build_model,
    build_tokenizer,
    cpu_training_kwargs,
    make_dpo_dataset,
    make_grpo_dataset,
    make_sft_dataset,
    reward_correct_answer,
    reward_short,
    save_tiny_model,
    tiny_lora_config,
    tiny_model_path,
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 3 plus 4?"},
    {"role": "assistant", "content": "7"},
]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _solve(question: str) -> str:
    if match := re.fullmatch(r"What is (\d) plus (\d)\?", question):
        return str(int(match[1]) + int(match[2]))
    if match := re.fullmatch(r"What is (\d) minus (\d)\?", question):
        return str(int(match[1]) - int(match[2]))
    if match := re.fullmatch(r"What comes after (\d)\?", question):
        return str(int(match[1]) + 1)
    if match := re.fullmatch(r"Repeat the word (\w+)\.", question):
        return match[1]
    raise AssertionError(f"unknown question: {question!r}")


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# --- tokenizer -----------------------------------------------------------------------------------


def test_tokenizer_round_trips_text() -> None:
    tokenizer = build_tokenizer()
    for text in ["What is 3 plus 4? 7", "  spaces\tand\nnewlines ", "ünïcödé 😀 and <b>tags</b>"]:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_tokenizer_special_tokens() -> None:
    tokenizer = build_tokenizer()
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.eos_token == EOS_TOKEN
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    # Plain encoding adds no bos/eos: only the chat template (or TRL) adds them.
    assert tokenizer("hello")["input_ids"] == tokenizer.encode("hello", add_special_tokens=False)


def test_chat_template_renders_conversation() -> None:
    tokenizer = build_tokenizer()
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered == (
        "<s><|system|>Be brief.<|eot|><|user|>What is 3 plus 4?<|eot|><|assistant|>7<|eot|>"
    )
    prompt = tokenizer.apply_chat_template(
        CONVERSATION[:2], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<s><|system|>Be brief.<|eot|><|user|>What is 3 plus 4?<|eot|><|assistant|>"


def test_chat_template_prompt_tokens_prefix_full_conversation() -> None:
    tokenizer = build_tokenizer()
    prompt_ids = tokenizer.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)
    full_ids = tokenizer.apply_chat_template(CONVERSATION)
    prompt_ids, full_ids = prompt_ids["input_ids"], full_ids["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids
    assert tokenizer.decode(full_ids[len(prompt_ids) :]) == "7" + EOS_TOKEN


def test_chat_template_marks_assistant_tokens() -> None:
    tokenizer = build_tokenizer()
    out = tokenizer.apply_chat_template(
        CONVERSATION, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(masked) == "7" + EOS_TOKEN


def test_chat_template_rejects_unknown_role() -> None:
    with pytest.raises(Exception, match="Unsupported role: tool"):
        build_tokenizer().apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_build_tokenizer_is_deterministic() -> None:
    assert build_tokenizer(0).get_vocab() == build_tokenizer(0).get_vocab()
    assert build_tokenizer(0).get_vocab() != build_tokenizer(1).get_vocab()


def test_saved_tokenizer_reloads_with_identical_ids(tiny_model_dir: str) -> None:
    built, loaded = build_tokenizer(0), AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "What is 9 minus 2? 7 and some unseen words"
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert loaded.apply_chat_template(CONVERSATION) == built.apply_chat_template(CONVERSATION)
    assert (loaded.pad_token, loaded.bos_token, loaded.eos_token) == ("<pad>", "<s>", EOS_TOKEN)
    assert len(loaded) == len(built)


# --- model ---------------------------------------------------------------------------------------


def _assert_same_weights(a: PreTrainedModel, b: PreTrainedModel) -> None:
    a_state, b_state = a.state_dict(), b.state_dict()
    assert a_state.keys() == b_state.keys()
    for name, tensor in a_state.items():
        assert torch.equal(tensor, b_state[name]), name


def test_build_model_same_seed_gives_identical_weights() -> None:
    tokenizer = build_tokenizer()
    _assert_same_weights(build_model(tokenizer, seed=3), build_model(tokenizer, seed=3))


def test_build_model_different_seed_gives_different_weights() -> None:
    tokenizer = build_tokenizer()
    a, b = build_model(tokenizer, seed=0), build_model(tokenizer, seed=1)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(a.state_dict()[weight], b.state_dict()[weight])


def test_build_model_leaves_global_rng_untouched() -> None:
    tokenizer = build_tokenizer()
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    build_model(tokenizer, seed=0)
    assert torch.equal(torch.rand(4), expected)


def test_build_model_config_matches_tokenizer() -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    config = model.config
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 128, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.vocab_size == len(tokenizer)
    assert model.dtype == torch.float32
    for source in (config, model.generation_config):
        assert source.pad_token_id == tokenizer.pad_token_id
        assert source.bos_token_id == tokenizer.bos_token_id
        assert source.eos_token_id == tokenizer.eos_token_id


def test_build_model_applies_overrides() -> None:
    model = build_model(build_tokenizer(), num_hidden_layers=1, hidden_size=32)
    assert model.config.num_hidden_layers == 1
    assert model.config.hidden_size == 32


def test_saved_model_reloads_with_identical_logits(tiny_model_dir: str) -> None:
    tokenizer = build_tokenizer(0)
    built, loaded = (
        build_model(tokenizer, seed=0),
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
    )
    _assert_same_weights(built, loaded)
    input_ids = torch.tensor([tokenizer("What is 3 plus 4? 7")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(built(input_ids).logits, loaded(input_ids).logits)


def _snapshot(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in [directory, *directory.iterdir()]}


def test_save_tiny_model_is_idempotent(tmp_path: Path) -> None:
    target = tmp_path / "model"
    assert save_tiny_model(target) == str(target)
    before = _snapshot(target)
    assert save_tiny_model(target) == str(target)
    assert _snapshot(target) == before


def test_save_tiny_model_concurrent_callers_share_one_copy(tmp_path: Path) -> None:
    target, results = tmp_path / "model", []
    barrier = threading.Barrier(4)

    def call() -> None:
        barrier.wait()
        results.append(save_tiny_model(target))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [str(target)] * 4
    assert os.listdir(tmp_path) == ["model"]  # no staging directories left behind
    assert AutoModelForCausalLM.from_pretrained(target).config.vocab_size > 256


def test_save_tiny_model_refuses_other_seed(tiny_model_dir: str) -> None:
    with pytest.raises(ValueError, match="seed"):
        save_tiny_model(tiny_model_dir, seed=1)


def test_save_tiny_model_refuses_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        save_tiny_model(tmp_path)
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_tiny_model_path_uses_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_RAPIDFIRE_TINY_CACHE", str(tmp_path / "from_env"))
    from_env = tiny_model_path(seed=2)
    assert Path(from_env).parent == tmp_path / "from_env"
    assert "seed2" in from_env and TINY_MODEL_VERSION in Path(from_env).name
    explicit = tiny_model_path(cache_dir=tmp_path / "explicit", seed=2)
    assert Path(explicit).parent == tmp_path / "explicit"
    assert AutoTokenizer.from_pretrained(explicit)("hi")["input_ids"]


def test_tiny_model_path_defaults_to_system_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRL_RAPIDFIRE_TINY_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert Path(tiny_model_path()).parent == tmp_path / "trl-rapidfire-tiny"


# --- datasets ------------------------------------------------------------------------------------

DATASET_BUILDERS: dict[str, Callable[..., Dataset]] = {
    "sft_text": lambda **kw: make_sft_dataset(kind="text", **kw),
    "sft_prompt_completion": lambda **kw: make_sft_dataset(kind="prompt_completion", **kw),
    "sft_messages": lambda **kw: make_sft_dataset(kind="messages", **kw),
    "dpo": make_dpo_dataset,
    "dpo_conversational": lambda **kw: make_dpo_dataset(conversational=True, **kw),
    "grpo": make_grpo_dataset,
    "grpo_plain": lambda **kw: make_grpo_dataset(conversational=False, **kw),
}


@pytest.mark.parametrize("name", DATASET_BUILDERS)
def test_dataset_is_deterministic_and_sized(name: str) -> None:
    build = DATASET_BUILDERS[name]
    first = build(n=32, seed=5)
    assert len(first) == 32
    assert first.to_list() == build(n=32, seed=5).to_list()
    assert first.to_list() != build(n=32, seed=6).to_list()


def test_sft_text_dataset_answers_are_correct() -> None:
    dataset = make_sft_dataset(n=64, kind="text")
    assert dataset.column_names == ["text"]
    for text in dataset["text"]:
        question, answer = re.fullmatch(r"(.+[?.]) (\w+)", text).groups()
        assert _solve(question) == answer


def test_sft_prompt_completion_dataset_is_conversational() -> None:
    dataset = make_sft_dataset(n=16, kind="prompt_completion")
    assert dataset.column_names == ["prompt", "completion"]
    for row in dataset:
        (prompt,), (completion,) = row["prompt"], row["completion"]
        assert (prompt["role"], completion["role"]) == ("user", "assistant")
        assert _solve(prompt["content"]) == completion["content"]


def test_sft_messages_dataset_is_a_conversation() -> None:
    dataset = make_sft_dataset(n=16, kind="messages")
    assert dataset.column_names == ["messages"]
    for messages in dataset["messages"]:
        assert [m["role"] for m in messages] == ["system", "user", "assistant"]
        assert _solve(messages[1]["content"]) == messages[2]["content"]


def test_sft_dataset_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        make_sft_dataset(kind="chat")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be"):
        make_sft_dataset(n=0)


def test_dpo_dataset_prefers_the_right_answer() -> None:
    plain, conversational = make_dpo_dataset(n=32), make_dpo_dataset(n=32, conversational=True)
    assert plain.column_names == conversational.column_names == ["prompt", "chosen", "rejected"]
    for row, conv in zip(plain, conversational, strict=True):
        assert row["chosen"] == " " + _solve(row["prompt"])
        assert row["rejected"].startswith(" ") and row["rejected"] != row["chosen"]
        assert conv["prompt"] == [{"role": "user", "content": row["prompt"]}]
        assert conv["chosen"] == _assistant(row["chosen"].strip())
        assert conv["rejected"] == _assistant(row["rejected"].strip())


def test_datasets_share_questions_for_a_seed() -> None:
    sft = make_sft_dataset(n=8, seed=9)["text"]
    dpo = make_dpo_dataset(n=8, seed=9)
    assert [p + c for p, c in zip(dpo["prompt"], dpo["chosen"], strict=True)] == sft


def test_grpo_dataset_columns() -> None:
    conversational, plain = make_grpo_dataset(n=16), make_grpo_dataset(n=16, conversational=False)
    assert conversational.column_names == plain.column_names == ["prompt", "answer"]
    for conv, row in zip(conversational, plain, strict=True):
        assert conv["prompt"] == [{"role": "user", "content": row["prompt"]}]
        assert conv["answer"] == row["answer"] == _solve(row["prompt"])


# --- reward functions ----------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [str, _assistant], ids=["plain", "conversational"])
def test_reward_correct_answer(wrap: Callable[[str], Any]) -> None:
    texts = ["7", "The answer is 7.", "17", "8", "", "green tea", "greenish"]
    answers = ["7", "7", "7", "7", "7", "green", "green"]
    rewards = reward_correct_answer([wrap(t) for t in texts], answer=answers, prompts=texts)
    assert rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("wrap", [str, _assistant], ids=["plain", "conversational"])
def test_reward_short(wrap: Callable[[str], Any]) -> None:
    rewards = reward_short([wrap(t) for t in ["", "x" * 8, "x" * 16, "x" * 100]], answer=["1"] * 4)
    assert rewards == [1.0, 0.75, 0.5, 0.0]


def test_reward_functions_have_meaningful_names() -> None:
    assert reward_correct_answer.__name__ == "reward_correct_answer"
    assert reward_short.__name__ == "reward_short"


def test_reward_correct_answer_accepts_dataset_answers() -> None:
    dataset = make_grpo_dataset(n=8)
    completions = [_assistant(f"It is {a}") for a in dataset["answer"]]
    assert reward_correct_answer(completions, answer=dataset["answer"]) == [1.0] * 8


# --- training flags and LoRA ---------------------------------------------------------------------


@pytest.mark.parametrize("config_class", [SFTConfig, DPOConfig, GRPOConfig])
def test_cpu_training_kwargs_build_a_cpu_config(config_class: type, tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_class(output_dir=str(tmp_path), **cpu_training_kwargs())
    assert not [w for w in caught if "checkpointing" in str(w.message)]
    assert config.bf16 is False and config.fp16 is False
    assert config.gradient_checkpointing is False
    assert config.save_strategy == "no"
    assert config.report_to == []
    assert config.dataloader_pin_memory is False
    assert config.device.type == "cpu"


def test_tiny_lora_config() -> None:
    config = tiny_lora_config(r=4, lora_dropout=0.1)
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 8, 0.1)
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert config.task_type == "CAUSAL_LM"
    assert set(tiny_lora_config(target_modules=("o_proj",)).target_modules) == {"o_proj"}


# --- the test bed trains with plain TRL trainers -------------------------------------------------

STEPS = 3
COMMON_ARGS: dict[str, Any] = {
    "max_steps": STEPS,
    "per_device_train_batch_size": 4,
    "learning_rate": 1e-2,
    "logging_steps": 1,
}


def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _train_and_check(trainer: Any) -> list[dict[str, float]]:
    """Train, then check the facts every LoRA run must show; return the per-step logs."""
    before = _parameters(trainer.model)
    assert any("lora_" in name for name in before), "the trainer did not wrap the model with LoRA"
    trainer.train()
    assert trainer.state.global_step == STEPS
    after = _parameters(trainer.model)
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed == {name for name in before if "lora_" in name}
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == STEPS
    assert all(math.isfinite(entry["loss"]) for entry in logs)
    return logs


def _model_and_tokenizer(path: str) -> dict[str, Any]:
    return {
        "model": AutoModelForCausalLM.from_pretrained(path),
        "processing_class": AutoTokenizer.from_pretrained(path),
    }


def test_sft_trains_on_text_from_a_model_path(tiny_model_dir: str, tmp_path: Path) -> None:
    args = SFTConfig(output_dir=str(tmp_path), **COMMON_ARGS, **cpu_training_kwargs())
    trainer = SFTTrainer(
        model=tiny_model_dir,
        args=args,
        train_dataset=make_sft_dataset(kind="text"),
        peft_config=tiny_lora_config(),
    )
    _train_and_check(trainer)
    assert os.listdir(tmp_path) == []  # save_strategy="no": no checkpoint at the end


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("prompt_completion", {}), ("messages", {"assistant_only_loss": True})],
)
def test_sft_trains_only_on_assistant_tokens(
    kind: str, extra: dict[str, Any], tiny_model_dir: str, tmp_path: Path
) -> None:
    args = SFTConfig(output_dir=str(tmp_path), **COMMON_ARGS, **extra, **cpu_training_kwargs())
    dataset = make_sft_dataset(kind=kind)
    trainer = SFTTrainer(
        **_model_and_tokenizer(tiny_model_dir),
        args=args,
        train_dataset=dataset,
        peft_config=tiny_lora_config(),
    )
    # The template renders prompts on a token boundary, so only the answer and eos are learned.
    tokenizer = trainer.processing_class
    row = trainer.train_dataset[0]
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    answer = dataset[0]["completion"] if kind == "prompt_completion" else dataset[0]["messages"]
    assert tokenizer.decode(trained) == answer[-1]["content"] + EOS_TOKEN
    _train_and_check(trainer)


@pytest.mark.parametrize("conversational", [False, True], ids=["plain", "conversational"])
def test_dpo_trains_with_implicit_reference(
    conversational: bool, tiny_model_dir: str, tmp_path: Path
) -> None:
    args = DPOConfig(output_dir=str(tmp_path), **COMMON_ARGS, **cpu_training_kwargs())
    trainer = DPOTrainer(
        **_model_and_tokenizer(tiny_model_dir),
        ref_model=None,
        args=args,
        train_dataset=make_dpo_dataset(conversational=conversational),
        peft_config=tiny_lora_config(),
    )
    logs = _train_and_check(trainer)
    assert logs[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)  # policy == reference at step 1


@pytest.mark.parametrize("conversational", [True, False], ids=["conversational", "plain"])
def test_grpo_trains_with_both_rewards(
    conversational: bool, tiny_model_dir: str, tmp_path: Path
) -> None:
    args = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=2,
        max_completion_length=8,
        **COMMON_ARGS,
        **cpu_training_kwargs(),
    )
    trainer = GRPOTrainer(
        **_model_and_tokenizer(tiny_model_dir),
        reward_funcs=[reward_correct_answer, reward_short],
        args=args,
        train_dataset=make_grpo_dataset(conversational=conversational),
        peft_config=tiny_lora_config(),
    )
    logs = _train_and_check(trainer)
    for entry in logs:
        assert 0.0 <= entry["rewards/reward_correct_answer/mean"] <= 1.0
        assert 0.0 <= entry["rewards/reward_short/mean"] <= 1.0
        assert entry["completions/max_length"] <= 8


def test_tiny_model_learns_the_language(tiny_model_dir: str, tmp_path: Path) -> None:
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=40,
        per_device_train_batch_size=16,
        learning_rate=1e-2,
        logging_steps=10,
        **cpu_training_kwargs(),
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=args,
        train_dataset=make_sft_dataset(n=640, kind="text"),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0] / 2
