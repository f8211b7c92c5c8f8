"""A boundary checkpoint's adapter weights: the run trainer finds its adapter's parameters once
and reads them at every later boundary instead of walking the shared model's whole state dict;
what it returns must stay what PEFT's ``get_peft_model_state_dict`` returns."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from peft import get_peft_model_state_dict

from trl_rapidfire.runtime.model_pool import ModelPool
from trl_rapidfire.runtime.models import adapter_name, adapter_params
from trl_rapidfire.testing import build_model, build_tokenizer, tiny_lora_config
from trl_rapidfire.trainers.boundary_checkpoints import _params_behind
from trl_rapidfire.trainers.run_trainer import RunTrainerMixin

LORAS = [tiny_lora_config(r=4), tiny_lora_config(r=8, target_modules=("q_proj", "k_proj")),
         tiny_lora_config(r=2, modules_to_save=["lm_head"]),
         tiny_lora_config(r=4, use_dora=True)]


def _group() -> object:
    group = ModelPool().group(build_model(build_tokenizer()), peft_config=LORAS[0],
                              model_init_kwargs=None)
    for i, lora in enumerate(LORAS):
        group.add_adapter(adapter_name(i), lora, seed=i)
    return group


def _same(fast: dict[str, torch.Tensor], peft: dict[str, torch.Tensor]) -> None:
    assert list(fast) == list(peft)
    for key in peft:
        assert fast[key].data_ptr() == peft[key].data_ptr(), key
        assert torch.equal(fast[key], peft[key]), key


def test_adapter_weights_read_from_its_parameters_equal_peft_state_dict_at_every_boundary():
    group = _group()
    model = group.model
    # As the run builder makes them: PEFT is shown the attached adapters' configs only.
    holders = {name: SimpleNamespace(model=model, _rf_adapter=name, _rf_adapter_keys=None,
                                     _rf_attached=lambda: group.attached)
               for name in (adapter_name(i) for i in range(len(LORAS)))}
    generator = torch.Generator().manual_seed(0)
    # Turns as the engine takes them: activate, "train" (change the adapter in place), park
    # and unpark (the values leave the same parameter objects and come back), and one adapter
    # detached out of the rotation for a while.
    turns = ["rf0", "rf1", "rf2", "rf3", "rf0", "detach rf1", "rf2", "rf1", "rf3", "rf0"]
    for turn in turns:
        verb, _, name = turn.rpartition(" ")
        if verb == "detach":
            group.detach(name)
            continue
        group.activate(name)
        with torch.no_grad():
            for p in adapter_params(model, name):
                p.add_(torch.randn(p.shape, generator=generator))
        holder = holders[name]
        fast = RunTrainerMixin._rf_adapter_state_dict(holder)
        _same(fast, get_peft_model_state_dict(model, adapter_name=name))
        assert isinstance(holder._rf_adapter_keys, list)  # the parameters were found
        again = RunTrainerMixin._rf_adapter_state_dict(holder)  # now from them
        _same(again, get_peft_model_state_dict(model, adapter_name=name))
        params = adapter_params(model, name)
        values = [p.data for p in params]
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype)
        for p, v in zip(params, values):
            p.data = v


def test_anything_but_whole_parameters_keeps_peft_walk():
    model = _group().model
    weights = get_peft_model_state_dict(model, adapter_name="rf0")
    assert len(_params_behind(model, weights)) == len(weights)
    key = next(iter(weights))
    assert _params_behind(model, {**weights, key: weights[key].clone()}) == []  # a copy
    assert _params_behind(model, {**weights, key: weights[key][:1]}) == []  # a slice
    twice = {**weights, "twice": weights[key]}
    assert _params_behind(model, twice) == []  # one parameter under two keys
    holder = SimpleNamespace(model=model, _rf_adapter="rf0", _rf_adapter_keys=None,
                             _rf_attached=None)
    assert RunTrainerMixin._rf_adapter_state_dict(holder).keys() == weights.keys()


def test_an_adapter_saved_alone_matches_peft_with_every_adapter_known(tmp_path):
    """Saving shows PEFT only the adapters in the module tree (not the 511 detached ones), so
    its filter against other adapters' keys stays cheap; the files must be what PEFT writes
    knowing every adapter. rf1's name is inside rf10's (with a modules_to_save copy), attached
    beside it: the filter must still leave rf10's keys out of rf1's file."""
    from safetensors.torch import load_file

    from trl_rapidfire.trainers.adapter_files import save_adapter_alone

    group = ModelPool().group(build_model(build_tokenizer()), peft_config=LORAS[0],
                              model_init_kwargs=None)
    for i in range(12):
        lora = tiny_lora_config(r=2, modules_to_save=["lm_head"]) if i == 10 \
            else tiny_lora_config(r=4)
        group.add_adapter(adapter_name(i), lora, seed=i)
    group.activate("rf1")
    model = group.model
    assert group.attached == {"rf1"}  # the others are detached, rf10's lm_head copy too
    group.attach("rf10")  # as an adapter is while its run is being cloned
    save_adapter_alone(model.save_pretrained, model, "rf1", group.attached, tmp_path / "alone")
    model.save_pretrained(str(tmp_path / "peft"), selected_adapters=["rf1"])
    ours = load_file(tmp_path / "alone" / "adapter_model.safetensors")
    peft = load_file(tmp_path / "peft" / "rf1" / "adapter_model.safetensors")
    assert list(ours) == list(peft) and not any("rf10" in k or "lm_head" in k for k in ours)
    assert all(torch.equal(ours[k], peft[k]) for k in peft)
    assert len(model.peft_config) == 12  # shown whole again after the save
    # Shown only rf1 while rf10 is attached, PEFT would take rf10's keys for rf1's: the
    # attached adapters are what keeps them out.
    save_adapter_alone(model.save_pretrained, model, "rf1", {"rf1"}, tmp_path / "wrong")
    wrong = load_file(tmp_path / "wrong" / "adapter_model.safetensors")
    assert set(wrong) != set(peft)
