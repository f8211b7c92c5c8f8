"""Shared base models: grouping, adapters, moving modules, and the offload policy."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trl_rapidfire.runtime.model_pool import ModelPool, choose_offloads, move_module
from trl_rapidfire.runtime.models import adapter_name, adapter_params
from trl_rapidfire.testing import build_model, build_tokenizer, tiny_lora_config


def test_offload_policy_frees_least_recently_used_groups_first():
    resident = [("old", 40), ("mid", 30), ("new", 20)]
    assert choose_offloads(resident, need=10, free=50) == []
    assert choose_offloads(resident, need=60, free=50) == ["old"]
    assert choose_offloads(resident, need=100, free=50) == ["old", "mid"]
    assert choose_offloads(resident, need=50, free=50, reserve=10) == ["old"]
    # Not even offloading everything is enough: offload everything, the newcomer gets it all.
    assert choose_offloads(resident, need=500, free=50) == ["old", "mid", "new"]


def test_move_module_to_where_the_model_is_copies_nothing():
    model = build_model(build_tokenizer())
    before = [(p, p.data_ptr()) for p in model.parameters()]
    move_module(model, "cpu")
    assert all(a is p and p.data_ptr() == ptr
               for (a, ptr), p in zip(before, model.parameters()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_move_module_keeps_parameter_identity_across_devices():
    model = build_model(build_tokenizer())
    params = list(model.parameters())
    move_module(model, "cuda")
    assert all(a is b and b.is_cuda for a, b in zip(params, model.parameters()))
    move_module(model, "cpu")
    assert all(a is b and not b.is_cuda for a, b in zip(params, model.parameters()))


def test_pool_groups_runs_by_model_and_kind_and_loads_paths_once(tmp_path):
    from trl_rapidfire.testing import tiny_model_path

    path = tiny_model_path()
    pool = ModelPool()
    lora = tiny_lora_config(r=4)
    g1 = pool.group(path, peft_config=lora, model_init_kwargs=None)
    g2 = pool.group(path, peft_config=tiny_lora_config(r=8), model_init_kwargs=None)
    full = pool.group(path, peft_config=None, model_init_kwargs=None)
    assert g1 is g2 and full is not g1
    assert sum(pool.loads.values()) == 2  # LoRA runs share one copy; full FT needs its own
    obj = build_model(build_tokenizer())
    g_obj = pool.group(obj, peft_config=lora, model_init_kwargs=None)
    g_obj_full = pool.group(obj, peft_config=None, model_init_kwargs=None)
    assert g_obj.base is obj and g_obj_full.base is not obj  # a copy: adapters went into obj


def test_adapters_are_initialised_as_a_fresh_peft_model_would_be():
    from peft import get_peft_model
    from transformers import set_seed

    pool = ModelPool()
    group = pool.group(build_model(build_tokenizer()), peft_config=tiny_lora_config(r=4),
                       model_init_kwargs=None)
    p0 = group.add_adapter(adapter_name(0), tiny_lora_config(r=4), seed=3)
    p1 = group.add_adapter(adapter_name(1), tiny_lora_config(r=8), seed=5)
    assert len(p0) == len(p1) == 8  # 2 layers x (q, v) x (A, B)
    for name, seed, r in (("rf0", 3, 4), ("rf1", 5, 8)):
        set_seed(seed)
        alone = get_peft_model(build_model(build_tokenizer()), tiny_lora_config(r=r))
        want = [p for n, p in alone.named_parameters() if "lora_" in n]
        got = adapter_params(group.model, name)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def _assert_same_flags(fast: Any, peft: Any) -> None:
    """Where both models hold a parameter its trainability is the same; what ``fast`` holds no
    longer (detached adapters) is frozen in ``peft`` too, and belongs to another adapter."""
    ours = {n: p.requires_grad for n, p in fast.model.named_parameters()}
    theirs = {n: p.requires_grad for n, p in peft.model.named_parameters()}
    assert ours.items() <= theirs.items()
    gone = [n for n in theirs if n not in ours]
    assert not any(theirs[n] for n in gone)
    assert all(set(n.split(".")) & set(peft.model.peft_config) for n in gone)
    assert any(ours.values())


def _two_groups_with(loras: list[Any]) -> list[Any]:
    """Two identical model groups, each with an adapter per config in ``loras``."""
    groups = []
    for _ in range(2):
        group = ModelPool().group(build_model(build_tokenizer()), peft_config=loras[0],
                                  model_init_kwargs=None)
        for i, lora in enumerate(loras):
            group.add_adapter(adapter_name(i), lora, seed=i)
        groups.append(group)
    return groups


def test_fast_activation_does_what_peft_set_adapter_does():
    from peft.tuners.tuners_utils import BaseTunerLayer

    loras = [tiny_lora_config(r=4), tiny_lora_config(r=8, target_modules=("q_proj", "k_proj")),
             tiny_lora_config(r=2, modules_to_save=["lm_head"])]
    groups = _two_groups_with(loras)
    fast, peft = groups
    for name in ["rf1", "rf0", "rf2", "rf1"]:
        fast.activate(name)
        peft.model.set_adapter(name)
        assert fast.model.active_adapter == peft.model.active_adapter == name
        # The other adapters left the module tree (rf2's copy of lm_head with rf2).
        assert fast.attached == {name}
        _assert_same_flags(fast, peft)
        layers = [[m.active_adapters for m in g.model.modules() if isinstance(m, BaseTunerLayer)]
                  for g in groups]
        assert layers[0] == layers[1] and layers[0] == [[name]] * len(layers[0])


def test_switching_between_known_adapters_toggles_what_set_adapter_would():
    from peft.tuners.tuners_utils import BaseTunerLayer

    loras = [tiny_lora_config(r=4), tiny_lora_config(r=8, target_modules=("q_proj", "k_proj")),
             tiny_lora_config(r=2, use_dora=True), tiny_lora_config(r=2)]
    groups = []
    for _ in range(2):
        group = ModelPool().group(build_model(build_tokenizer()), peft_config=loras[0],
                                  model_init_kwargs=None)
        for i, lora in enumerate(loras[:3]):
            group.add_adapter(adapter_name(i), lora, seed=i)
        groups.append(group)
    fast, peft = groups
    # The first activation after the model was built (or an adapter added) is PEFT's own;
    # every later one, an adapter's first included, toggles two adapters. An adapter added
    # meanwhile (a clone) and a detach / attach keep it right.
    steps = ["rf0", "rf1", "rf2", "rf0", "rf1", "add rf3", "rf3", "rf0", "detach rf1", "rf1",
             "rf2", "rf0"]
    for step in steps:
        verb, _, name = step.rpartition(" ")
        for g in groups:
            if verb == "add":
                g.add_adapter(name, loras[3], seed=3)
            elif verb == "detach":
                g.detach(name)
        if verb:
            continue
        fast.activate(name)
        peft.attach(name)
        peft.model.set_adapter(name)
        assert fast.attached == {name}, step
        _assert_same_flags(fast, peft)
        trainable = [n for n, p in fast.model.named_parameters() if p.requires_grad]
        assert len(trainable) == len(adapter_params(fast.model, name)) > 0, step
        layers = [[m.active_adapters for m in g.model.modules() if isinstance(m, BaseTunerLayer)]
                  for g in groups]
        assert layers[0] == layers[1] == [[name]] * len(layers[0]), step


def test_detached_adapters_leave_the_module_tree_and_come_back_as_they_were():
    loras = [tiny_lora_config(r=4), tiny_lora_config(r=8, target_modules=("q_proj", "k_proj")),
             tiny_lora_config(r=2, modules_to_save=["lm_head"])]
    group = ModelPool().group(build_model(build_tokenizer()), peft_config=loras[0],
                              model_init_kwargs=None)
    for i, lora in enumerate(loras):
        group.add_adapter(adapter_name(i), lora, seed=i)
    group.activate("rf0")
    assert group.attached == {"rf0"}  # rf1 and rf2 left the tree when rf0 became active
    group.attach("rf1")
    group.attach("rf2")
    model = group.model
    before = {n: id(p) for n, p in model.named_parameters()}
    modules = len(list(model.modules()))
    own = [id(p) for p in adapter_params(model, "rf1")]
    ids = torch.arange(12).reshape(2, 6)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert group.detach("rf0") is False  # the active adapter stays
    # Its copy of a module to save (lm_head) leaves with it, and the wrapper forgets it.
    assert group.detach("rf2") is True
    assert not any(".rf2." in n for n, _ in model.named_parameters())
    assert group.detach("rf1") is True and group.detach("rf1") is False
    assert not any(".rf1." in n for n, _ in model.named_parameters())
    assert len(list(model.modules())) < modules  # fewer modules for the Trainer to walk
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, logits)
    group.attach("rf1")
    group.attach("rf2")
    assert {n: id(p) for n, p in model.named_parameters()} == before
    assert [id(p) for p in adapter_params(model, "rf1")] == own
    # Activating a detached adapter attaches it first.
    group.detach("rf1")
    group.activate("rf1")
    assert model.active_adapter == "rf1"
    assert [id(p) for p in adapter_params(model, "rf1")] == own
    assert all(p.requires_grad for p in adapter_params(model, "rf1"))
    assert not any(p.requires_grad for p in adapter_params(model, "rf0"))


def test_the_fast_switch_is_used_only_with_a_checked_peft_version():
    from trl_rapidfire.runtime.foreign_internals import PEFT_CHECKED, peft_fast_switch

    (low_major, low_minor), (high_major, high_minor) = PEFT_CHECKED
    assert peft_fast_switch(f"{low_major}.{low_minor}.0")
    assert peft_fast_switch(f"{high_major}.{high_minor}.7.dev0")
    assert peft_fast_switch()  # the installed PEFT is the test suite's
    for newer in (f"{high_major}.{high_minor + 1}.0", f"{high_major + 1}.0.0", "main"):
        with pytest.warns(RuntimeWarning, match="set_adapter instead"):
            assert not peft_fast_switch(newer)


def test_with_an_unchecked_peft_switching_uses_set_adapter_and_ends_the_same(monkeypatch):
    """The fallback path (PEFT's own set_adapter at every switch) leaves the model as the fast
    path does: same active adapter, same trainable parameters, same attached adapters."""
    import trl_rapidfire.runtime.models as models

    loras = [tiny_lora_config(r=4), tiny_lora_config(r=8, target_modules=("q_proj", "k_proj")),
             tiny_lora_config(r=2)]
    groups = _two_groups_with(loras)
    fast, public = groups
    calls = []
    for name in ["rf0", "rf1", "rf2", "rf0", "rf2", "rf1"]:
        fast.activate(name)
        monkeypatch.setattr(models, "peft_fast_switch", lambda: calls.append(1) or False)
        public.activate(name)
        monkeypatch.undo()
        assert fast.model.active_adapter == public.model.active_adapter == name
        assert fast.attached == public.attached == {name}
        _assert_same_flags(fast, public)
    assert len(calls) >= 4  # every activation after the first asked, and took PEFT's path
