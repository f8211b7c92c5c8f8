"""The core guarantee: a run trained in chunks, interleaved with other runs on a shared base
model, ends bitwise equal to the same config trained alone by plain TRL.

Every test trains both sides in this process at the same torch thread count and compares
tensors and logs, never "the loss went down".
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file
from transformers import LlamaForCausalLM, TrainerCallback
from trl import SFTConfig, SFTTrainer

from trl_rapidfire import GridSearch, List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

SPEED_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_path():
    return tiny_model_path()


def _logs(trainer) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in SPEED_KEYS} for e in trainer.state.log_history]


def _train_logs(trainer) -> list[dict]:
    return [e for e in _logs(trainer) if "eval_loss" not in e]


def _assert_same_tensors(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), f"{what}: {k} differs"


def _assert_same_weights(dir_a: Path, dir_b: Path) -> None:
    for name in ("adapter_model.safetensors", "model.safetensors"):
        if (Path(dir_a) / name).exists() or (Path(dir_b) / name).exists():
            _assert_same_tensors(
                load_file(Path(dir_a) / name), load_file(Path(dir_b) / name), f"{dir_a}/{name}"
            )
            return
    raise AssertionError(f"no weights in {dir_a}")


def _assert_same_checkpoint(a: Path, b: Path) -> None:
    _assert_same_weights(a, b)
    opt_a = torch.load(a / "optimizer.pt", weights_only=True)
    opt_b = torch.load(b / "optimizer.pt", weights_only=True)
    assert opt_a["param_groups"] == opt_b["param_groups"]
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for k in opt_a["state"]:
        _assert_same_tensors(opt_a["state"][k], opt_b["state"][k], f"{a} optimizer state {k}")
    assert torch.load(a / "scheduler.pt", weights_only=True) == torch.load(
        b / "scheduler.pt", weights_only=True
    )
    rng_a = torch.load(a / "rng_state.pth", weights_only=False)
    rng_b = torch.load(b / "rng_state.pth", weights_only=False)
    assert torch.equal(rng_a["cpu"], rng_b["cpu"])
    assert rng_a["python"] == rng_b["python"]
    state_a = json.loads((a / "trainer_state.json").read_text())
    state_b = json.loads((b / "trainer_state.json").read_text())
    strip = [
        [{k: v for k, v in e.items() if k not in SPEED_KEYS} for e in s["log_history"]]
        for s in (state_a, state_b)
    ]
    assert strip[0] == strip[1]
    assert state_a["global_step"] == state_b["global_step"]


def _reference(model_path, out: Path, config_kwargs: dict, dataset, peft_config=None, **kw):
    """Plain TRL: the config trained alone, its final weights saved to ``out/final``."""
    trainer = SFTTrainer(
        model=model_path,
        args=SFTConfig(output_dir=str(out), **config_kwargs),
        train_dataset=dataset,
        peft_config=peft_config,
        **kw,
    )
    trainer.train()
    trainer.save_model(str(out / "final"))
    return trainer


BASE = dict(
    cpu_training_kwargs(),
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    logging_steps=3,
)


def test_three_lora_configs_interleaved_equal_plain_sft_bitwise(model_path, tmp_path):
    # 72 rows, batch 4, accumulation 2: 9 steps per epoch, chunks of 3,2,2,2 steps, so most
    # boundaries (5, 7, 14, 16) fall between logging steps (every 3).
    data = make_sft_dataset(72, seed=1)
    lora = tiny_lora_config(r=8, lora_dropout=0.1)
    lrs = [1e-3, 3e-3, 5e-4]
    schedulers = ["linear", "cosine", "constant_with_warmup"]
    common = dict(BASE, num_train_epochs=2, warmup_steps=0.1, save_strategy="epoch")
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(
            output_dir=str(tmp_path / "rf"), num_chunks=4, learning_rate=List(lrs),
            lr_scheduler_type=List(schedulers), **common,
        ),
        train_dataset=data,
        peft_config=lora,
        search=GridSearch(zip=[("learning_rate", "lr_scheduler_type")]),
    )
    assert isinstance(rf, SFTTrainer)
    rf.train()

    # The runs really were interleaved: every run's first chunk before any second chunk.
    order = [(c.run, c.number) for c in rf.schedule]
    assert [r for r, n in order[:3]] == ["run-0", "run-1", "run-2"]
    assert all(n == 0 for _, n in order[:3]) and len(order) == 3 * 8
    assert rf.model_loads == {next(iter(rf.model_loads)): 1}

    for i, (lr, sched) in enumerate(zip(lrs, schedulers)):
        name = f"run-{i}"
        ref = _reference(
            model_path, tmp_path / f"ref{i}",
            dict(common, learning_rate=lr, lr_scheduler_type=sched), data, peft_config=lora,
        )
        run_dir = tmp_path / "rf" / "runs" / name
        _assert_same_weights(run_dir / "final", tmp_path / f"ref{i}" / "final")
        logs = _logs(rf.run_trainer(name))
        assert logs == _logs(ref)
        assert any("grad_norm" in e for e in logs) and len(logs) == 18 // 3 + 1
        # "epoch" strategies still fire once per epoch, not at every chunk boundary.
        ckpts = sorted(p.name for p in run_dir.glob("checkpoint-*"))
        assert ckpts == sorted(p.name for p in (tmp_path / f"ref{i}").glob("checkpoint-*"))
        assert ckpts == ["checkpoint-18", "checkpoint-9"]
        for ck in ckpts:
            _assert_same_checkpoint(run_dir / ck, tmp_path / f"ref{i}" / ck)


def test_full_fine_tuning_runs_share_one_module_and_equal_plain_sft(model_path, tmp_path):
    data = make_sft_dataset(32, seed=2)
    common = dict(BASE, num_train_epochs=1, gradient_accumulation_steps=1, logging_steps=2)
    lrs = [1e-3, 1e-4]
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4,
                         learning_rate=List(lrs), **common),
        train_dataset=data,
    )
    assert rf.run_trainer("run-0").model is rf.run_trainer("run-1").model
    rf.train()
    for i, lr in enumerate(lrs):
        ref = _reference(model_path, tmp_path / f"ref{i}", dict(common, learning_rate=lr), data)
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)
    # After train(), the module holds the best run's weights.
    best = rf.best_run.name
    ref_best = load_file(tmp_path / f"ref{best[-1]}" / "final" / "model.safetensors")
    live = rf.model.state_dict()
    assert torch.equal(live["lm_head.weight"], ref_best["lm_head.weight"])


def test_list_of_lora_configs_with_different_ranks_and_targets(model_path, tmp_path):
    data = make_sft_dataset(48, seed=3)
    loras = [tiny_lora_config(r=4), tiny_lora_config(r=8, target_modules=("q_proj", "k_proj",
                                                                           "v_proj", "o_proj"))]
    # Different accumulation per run: accelerate's shared GradientState must follow each run.
    common = dict(BASE, num_train_epochs=1, learning_rate=2e-3, logging_steps=2)
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=3,
                         **{**common, "gradient_accumulation_steps": List([1, 2])}),
        train_dataset=data,
        peft_config=List(loras),
    )
    rf.train()
    assert len(rf.runs) == 4 and rf.model_loads and set(rf.model_loads.values()) == {1}
    i = 0
    for ga in (1, 2):
        for lora in loras:
            ref = _reference(model_path, tmp_path / f"ref{i}",
                             dict(common, gradient_accumulation_steps=ga), data, peft_config=lora)
            _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                                 tmp_path / f"ref{i}" / "final")
            assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)
            i += 1


def test_runs_parked_on_disk_resume_exactly(model_path, tmp_path):
    data = make_sft_dataset(32, seed=4)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    common = dict(BASE, num_train_epochs=1, gradient_accumulation_steps=1, logging_steps=2)
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4, cache_budget_bytes=0,
                         learning_rate=List([1e-3, 2e-3]), **common),
        train_dataset=data,
        peft_config=lora,
    )
    spilled = []

    class SeeSpills(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            cache = rf.engine.cache
            spilled.extend(k for k in cache.keys() if cache.location(k) == "disk")

    rf.add_callback(SeeSpills())
    rf.train()
    assert spilled, "with a zero budget every parked run must have gone to disk"
    assert (tmp_path / "rf" / ".rapidfire" / "cache").is_dir()
    for i, lr in enumerate([1e-3, 2e-3]):
        ref = _reference(model_path, tmp_path / f"ref{i}", dict(common, learning_rate=lr), data,
                         peft_config=lora)
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)


def _lora_state_bytes(model_path, lora) -> int:
    """Bytes of one run's live state: its adapter and Adam's two moments and step per tensor."""
    from peft import get_peft_model

    params = [p for p in get_peft_model(LlamaForCausalLM.from_pretrained(model_path),
                                        lora).parameters() if p.requires_grad]
    return sum(3 * p.numel() * p.element_size() + 4 for p in params)


@pytest.mark.parametrize("budget", ["default", "one run"])
def test_runs_idle_in_place_on_the_host_within_the_cache_budget(model_path, tmp_path, budget):
    # On the host, parking would only hand the cache the very tensors the run holds: between
    # their turns runs stay in place while the budget holds them (nothing in the cache), and
    # beyond it the least recently trained are parked. Either way, bitwise as trained alone.
    data = make_sft_dataset(32, seed=4)
    lora = tiny_lora_config(r=4)
    common = dict(BASE, num_train_epochs=1, gradient_accumulation_steps=1, logging_steps=2)
    one = _lora_state_bytes(model_path, lora)
    extra = {} if budget == "default" else {"cache_budget_bytes": one}
    lrs = [1e-3, 2e-3, 3e-3]
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4,
                         learning_rate=List(lrs), **extra, **common),
        train_dataset=data,
        peft_config=lora,
    )
    seen = {"idle": 0, "parked": 0}

    class SeeResidency(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            engine = rf.engine
            # Runs that have trained and are not training now: idle in place, or parked.
            live = [s for s in engine.slots.values() if s.residency.resident
                    and s.trainer.state.global_step and s.trainer.state is not state]
            seen["idle"] = max(seen["idle"], len(live))
            in_rotation = [k for k in engine.cache.keys()  # (a completed run is parked)
                           if engine.slots[k].state.status.schedulable]
            seen["parked"] = max(seen["parked"], len(in_rotation))
            held = sum(s.residency.live_bytes(s.trainer.optimizer) for s in live)
            assert held + engine.cache.bytes_in_memory <= engine.cache.budget_bytes

    rf.add_callback(SeeResidency())
    rf.train()
    if budget == "default":
        assert seen == {"idle": len(lrs) - 1, "parked": 0}
    else:
        assert seen["idle"] == 1 and seen["parked"] >= 1
    for i, lr in enumerate(lrs):
        ref = _reference(model_path, tmp_path / f"ref{i}", dict(common, learning_rate=lr), data,
                         peft_config=lora)
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)


def test_single_config_equals_sft_trainer_including_save_model(model_path, tmp_path):
    data = make_sft_dataset(32, seed=5)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    common = dict(BASE, num_train_epochs=1, learning_rate=1e-3, logging_steps=1)
    rf = RFSFTTrainer(model=model_path, train_dataset=data, peft_config=lora,
                      args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=2, **common))
    out = rf.train()
    rf.save_model()
    ref = SFTTrainer(model=model_path, train_dataset=data, peft_config=lora,
                     args=SFTConfig(output_dir=str(tmp_path / "ref"), **common))
    ref_out = ref.train()
    ref.save_model()
    assert out.global_step == ref_out.global_step and out.training_loss == ref_out.training_loss
    assert _logs(rf) == _logs(ref)
    _assert_same_weights(tmp_path / "rf", tmp_path / "ref")
    written = {p.name for p in (tmp_path / "rf").iterdir() if p.is_file()}
    assert written - {"schedule.csv"} == {p.name for p in (tmp_path / "ref").iterdir()
                                         if p.is_file()}
    cfg = [json.loads((tmp_path / d / "adapter_config.json").read_text()) for d in ("rf", "ref")]
    for c in cfg:  # PEFT keeps target modules in a set: their order in the JSON is arbitrary
        c["target_modules"] = sorted(c["target_modules"])
    assert cfg[0] == cfg[1]


def test_base_model_is_loaded_once_for_runs_that_share_it(model_path, tmp_path, monkeypatch):
    loads = []
    original = LlamaForCausalLM.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(args[0] if args else kwargs.get("pretrained_model_name_or_path"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(LlamaForCausalLM, "from_pretrained", classmethod(counting))
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path), num_chunks=2, max_steps=2,
                         learning_rate=List([1e-3, 2e-3, 3e-3]), **BASE),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )
    assert len(loads) == 1
    models = {id(rf.run_trainer(f"run-{i}").model) for i in range(3)}
    assert len(models) == 1
    # Dataset preparation happened once, too: the runs share the prepared dataset object.
    assert len({id(rf.run_trainer(f"run-{i}").train_dataset) for i in range(3)}) == 1


class _FailOnChunkTwo(TrainerCallback):
    """Raises in the second chunk of the run trained with the given learning rate."""

    def __init__(self, lr: float, step: int):
        self.lr, self.step = lr, step

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate == self.lr and state.global_step == self.step:
            raise RuntimeError("boom in chunk 2")


def test_a_failing_run_fails_alone_and_the_others_finish_exactly(model_path, tmp_path):
    data = make_sft_dataset(32, seed=6)
    common = dict(BASE, num_train_epochs=1, gradient_accumulation_steps=1, logging_steps=2)
    lrs = [1e-3, 2e-3, 3e-3]
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4,
                         learning_rate=List(lrs), **common),
        train_dataset=data,
        peft_config=tiny_lora_config(r=4),
        callbacks=[_FailOnChunkTwo(lr=2e-3, step=3)],  # steps 2..3 are chunk 2 of 8 steps
    )
    with pytest.warns(RuntimeWarning, match="run-1"):
        rf.train()
    status = {r.name: r.status for r in rf.runs}
    assert status == {"run-0": RunStatus.COMPLETED, "run-1": RunStatus.FAILED,
                      "run-2": RunStatus.COMPLETED}
    failed = next(r for r in rf.runs if r.name == "run-1")
    assert "boom in chunk 2" in failed.error and failed.global_step == 3
    assert not (tmp_path / "rf" / "runs" / "run-1" / "final").exists()
    assert rf.best_run.name != "run-1"
    for i in (0, 2):
        ref = _reference(model_path, tmp_path / f"ref{i}", dict(common, learning_rate=lrs[i]),
                         data, peft_config=tiny_lora_config(r=4))
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)


def _format_ok(example):
    return example["text"]


def _format_broken(example):
    if "7" in example["text"]:
        raise ValueError("formatting bug")
    return example["text"]


def test_a_raising_formatting_function_fails_its_run_only(model_path, tmp_path):
    data = make_sft_dataset(32, seed=7)
    common = dict(BASE, num_train_epochs=1, gradient_accumulation_steps=1, learning_rate=1e-3)
    with pytest.warns(RuntimeWarning, match="formatting bug"):
        rf = RFSFTTrainer(
            model=model_path,
            args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=2, **common),
            train_dataset=data,
            peft_config=tiny_lora_config(r=4),
            formatting_func=List([_format_broken, _format_ok]),
        )
        rf.train()
    status = {r.name: r.status for r in rf.runs}
    assert status == {"run-0": RunStatus.FAILED, "run-1": RunStatus.COMPLETED}
    ref = _reference(model_path, tmp_path / "ref", common, data,
                     peft_config=tiny_lora_config(r=4), formatting_func=_format_ok)
    _assert_same_weights(tmp_path / "rf" / "runs" / "run-1" / "final", tmp_path / "ref" / "final")
    assert _logs(rf.run_trainer("run-1")) == _logs(ref)


class _Seen(TrainerCallback):
    pass


def test_callbacks_reach_the_runs_that_have_trainers_when_one_failed_to_build(model_path,
                                                                              tmp_path):
    """A run whose dataset preparation raised has no trainer: adding, removing and popping
    callbacks on the experiment acts on the others (it raised AttributeError on None)."""
    data = make_sft_dataset(32, seed=7)
    with pytest.warns(RuntimeWarning, match="formatting bug"):
        rf = RFSFTTrainer(
            model=model_path,
            args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=2, **BASE),
            train_dataset=data,
            peft_config=tiny_lora_config(r=4),
            formatting_func=List([_format_broken, _format_ok]),
        )

    def seen() -> list:
        return [cb for cb in rf.run_trainer("run-1").callback_handler.callbacks
                if isinstance(cb, _Seen)]

    assert rf.run_trainer("run-0") is None
    mine = _Seen()
    rf.add_callback(mine)
    (copy,) = seen()
    assert copy is not mine  # each run has its own copy
    rf.remove_callback(_Seen)
    assert seen() == []
    rf.add_callback(_Seen)
    assert isinstance(rf.pop_callback(_Seen), _Seen) and seen() == []


def test_two_base_models_each_loaded_once_each_run_exact(model_path, tmp_path):
    other_path = tiny_model_path(seed=1)  # same architecture, other weights and tokenizer
    data = make_sft_dataset(32, seed=8)
    lora = tiny_lora_config(r=4, lora_dropout=0.1)
    common = dict(BASE, num_train_epochs=1, gradient_accumulation_steps=1, learning_rate=2e-3)
    rf = RFSFTTrainer(
        model=List([model_path, other_path]),
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4, **common),
        train_dataset=data,
        peft_config=lora,
    )
    assert sorted(rf.model_loads.values()) == [1, 1]
    assert rf.run_trainer("run-0").model is not rf.run_trainer("run-1").model
    rf.train()
    for i, path in enumerate([model_path, other_path]):
        ref = _reference(path, tmp_path / f"ref{i}", common, data, peft_config=lora)
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)


def test_configs_built_between_chunks_do_not_disturb_live_runs(model_path, tmp_path):
    """Building any TrainingArguments resets accelerate's global state (and the last trainer
    built rewrites GradientState); each run gets its own back at every switch."""
    data = make_sft_dataset(32, seed=9)
    common = dict(BASE, num_train_epochs=1, learning_rate=1e-3, logging_steps=1)
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4,
                         gradient_accumulation_steps=List([2, 1]),
                         **{k: v for k, v in common.items() if k != "gradient_accumulation_steps"}),
        train_dataset=data,
        peft_config=tiny_lora_config(r=4),
    )
    built = []

    def build_a_config_before_the_switch(slot):
        # No guard on purpose: the worst a later clone or tool could do between two chunks.
        built.append(SFTConfig(output_dir=str(tmp_path / "unused"), **cpu_training_kwargs()))

    rf.engine.hooks.before_switch_in = build_a_config_before_the_switch
    rf.train()
    assert len(built) >= 8
    assert all(r.status == RunStatus.COMPLETED for r in rf.runs)
    for i, ga in enumerate([2, 1]):
        ref = _reference(model_path, tmp_path / f"ref{i}",
                         dict(common, gradient_accumulation_steps=ga), data,
                         peft_config=tiny_lora_config(r=4))
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)


def test_knobs_inside_a_lora_config_equal_plain_sft_with_the_concrete_config(model_path,
                                                                            tmp_path):
    """LoraConfig(r=List(...), target_modules=List(...)): each run's adapter is bitwise the one
    plain TRL trains with that LoraConfig written out."""
    data = make_sft_dataset(32, seed=11)
    common = dict(BASE, num_train_epochs=1, learning_rate=2e-3)
    targets = [["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"]]
    lora_rest = dict(lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM")
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=2, **common),
        train_dataset=data,
        peft_config=LoraConfig(r=List([2, 4]), target_modules=List(targets), **lora_rest),
    )
    rf.train()
    runs = {r.name: r for r in rf.runs}
    assert len(runs) == 4 and all(r.status == RunStatus.COMPLETED for r in runs.values())
    for i, (r, target) in enumerate(itertools.product([2, 4], targets)):
        assert runs[f"run-{i}"].knobs == {"peft_config.r": r,
                                          "peft_config.target_modules": target}
        ref = _reference(model_path, tmp_path / f"ref{i}", common, data,
                         peft_config=LoraConfig(r=r, target_modules=target, **lora_rest))
        _assert_same_weights(tmp_path / "rf" / "runs" / f"run-{i}" / "final",
                             tmp_path / f"ref{i}" / "final")
        assert _logs(rf.run_trainer(f"run-{i}")) == _logs(ref)
