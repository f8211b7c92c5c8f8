"""StateCache: what comes out is bitwise what went in, in memory, spilled, and after a restart."""

from __future__ import annotations

import math
import random
import struct
from collections import OrderedDict

import numpy as np
import pytest
import torch

from trl_rapidfire.runtime.cache import TENSORS_FILE, TREE_FILE, StateCache, load_tree, save_tree


def assert_tree_equal(a, b, path="tree"):
    """Exact equality: container types, key types and order, tensor dtype/shape/bits."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        # Bitwise, so nan payloads and -0.0 count too (torch.equal says nan != nan).
        bits_a = a.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        bits_b = b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(bits_a, bits_b), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), path
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], path
        for k in a:
            assert_tree_equal(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _train(model, optimizer, scheduler, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, model.in_features, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def _training_objects():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    return model, optimizer, scheduler


def realistic_tree():
    model, optimizer, scheduler = _training_objects()
    _train(model, optimizer, scheduler, steps=2, seed=1)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return {
        "adapter": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),  # int keys, 0-dim "step" tensors
        "scheduler": scheduler.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),  # (3, (625 ints), None)
            "numpy": np.random.get_state(),  # ("MT19937", uint32 array, int, int, float)
        },
        "tensors": {
            "bf16": torch.randn(5, 2).to(torch.bfloat16),
            "fp16": torch.tensor([1.5, -0.0, float("nan")], dtype=torch.float16),
            "zero_dim": torch.tensor(3.25, dtype=torch.float64),
            "int64": torch.tensor([2**62, -1]),
            "bool": torch.tensor([[True, False]]),
            "empty": torch.zeros(0, 3),
            "transposed": base.t(),
            "shared_whole": base,
            "shared_row": base[1],
            "complex128": torch.tensor([1 + 2j, -3j], dtype=torch.complex128),
        },
        "floats": [math.nan, math.inf, -math.inf, -0.0, 0.1, 1e308, 5e-324],
        "int_keys": {0: "zero", 7: {2: None, "2": True}},
        "trainer_state": {"global_step": 7, "log_history": [{"loss": 1.25, "step": 1}]},
        "nested": (1, (2, (3,)), [4, (5,)], ()),
        "odict": OrderedDict([("z", 1), ("a", 2)]),
        "numpy": {"scalar": np.float32(1.5), "fortran": np.asfortranarray(np.ones((2, 3)))},
        "big_int": 2**80,
    }


@pytest.fixture
def tree():
    return realistic_tree()


def test_round_trip_in_memory(tmp_path, tree):
    cache = StateCache(10**9, tmp_path)
    cache.put("run", tree)
    assert cache.location("run") == "memory"
    assert_tree_equal(cache.get("run"), tree)
    assert not any(tmp_path.iterdir())


def test_round_trip_spilled(tmp_path, tree):
    cache = StateCache(0, tmp_path)
    cache.put("run", tree)
    assert cache.location("run") == "disk"
    assert cache.bytes_in_memory == 0
    folder = cache.folder("run")
    assert sorted(p.name for p in folder.iterdir()) == [TENSORS_FILE, TREE_FILE]
    assert_tree_equal(load_tree(folder), tree)
    assert_tree_equal(cache.get("run"), tree)


def test_save_tree_replaces_existing_folder(tmp_path, tree):
    save_tree({"old": torch.ones(3)}, tmp_path / "entry")
    save_tree(tree, tmp_path / "entry")
    assert_tree_equal(load_tree(tmp_path / "entry"), tree)
    assert [p.name for p in tmp_path.iterdir()] == ["entry"]


@pytest.mark.parametrize("budget", [0, 10**6])
def test_put_stores_a_copy(tmp_path, budget):
    original = {"w": torch.zeros(4), "arr": np.zeros(2), "items": [1, 2]}
    cache = StateCache(budget, tmp_path)
    cache.put("run", original)
    original["w"].add_(1)
    original["arr"] += 1
    original["items"].append(3)
    got = cache.get("run")
    assert torch.equal(got["w"], torch.zeros(4))
    assert np.array_equal(got["arr"], np.zeros(2))
    assert got["items"] == [1, 2]


def test_get_aliases_copy_and_pop_do_not(tmp_path):
    cache = StateCache(10**6, tmp_path)
    cache.put("run", {"w": torch.zeros(3)})
    # get() hands out the cache's own tensors: changing them changes the entry.
    assert cache.get("run")["w"] is cache.get("run")["w"]
    cache.get("run", copy=True)["w"].add_(5)
    assert torch.equal(cache.get("run")["w"], torch.zeros(3))
    popped = cache.pop("run")
    assert "run" not in cache and cache.bytes_in_memory == 0
    assert torch.equal(popped["w"], torch.zeros(3))


def test_lru_spill_order(tmp_path):
    one = {"t": torch.zeros(100)}  # 400 bytes
    cache = StateCache(800, tmp_path)
    for key in "ABC":
        cache.put(key, one)
    assert [cache.location(k) for k in "ABC"] == ["disk", "memory", "memory"]
    assert cache.bytes_in_memory == 800 and cache.nbytes("A") == 400
    cache.get("A")
    assert [cache.location(k) for k in "ABC"] == ["memory", "disk", "memory"]
    assert cache.keys() == ["B", "C", "A"]
    assert cache.bytes_in_memory == 800


def test_entry_over_budget_alone_is_spilled(tmp_path):
    cache = StateCache(100, tmp_path)
    cache.put("small", {"t": torch.zeros(10)})
    cache.put("big", {"t": torch.zeros(1000)})
    assert cache.location("big") == "disk" and cache.location("small") == "memory"
    assert torch.equal(cache.get("big")["t"], torch.zeros(1000))  # still readable
    assert cache.location("big") == "disk" and cache.bytes_in_memory == 40


def test_new_cache_picks_up_spilled_entries(tmp_path, tree):
    first = StateCache(0, tmp_path)
    first.put("run a/β", tree)
    first.put("run-b", {"x": torch.ones(2, dtype=torch.int64)})
    second = StateCache(10**9, tmp_path)
    assert sorted(second.keys()) == ["run a/β", "run-b"]
    assert second.location("run a/β") == "disk"
    assert second.nbytes("run a/β") == first.nbytes("run a/β")
    assert_tree_equal(second.get("run a/β"), tree)
    assert second.location("run a/β") == "memory"


def test_interrupted_writes_are_ignored(tmp_path):
    cache = StateCache(0, tmp_path)
    cache.put("run", {"t": torch.ones(3)})
    # A crash mid-write leaves a temporary folder; a hand-made folder lacks its tree.
    tmp = tmp_path / ".tmp-run-0123456789abcdef-deadbeef"
    tmp.mkdir()
    (tmp / TENSORS_FILE).write_bytes((cache.folder("run") / TENSORS_FILE).read_bytes()[:10])
    (tmp_path / "stray").mkdir()
    with pytest.warns(UserWarning, match="stray"):
        reopened = StateCache(0, tmp_path)
    assert reopened.keys() == ["run"]
    assert not tmp.exists()
    assert torch.equal(reopened.get("run")["t"], torch.ones(3))


def test_delete_and_reput_remove_disk_copy(tmp_path):
    cache = StateCache(0, tmp_path)
    cache.put("run", {"t": torch.ones(3)})
    folder = cache.folder("run")
    assert folder.is_dir()
    cache.put("run", {"t": torch.full((2,), 7)})
    assert torch.equal(load_tree(folder)["t"], torch.full((2,), 7))
    cache.delete("run")
    assert "run" not in cache and not folder.exists()
    assert not any(tmp_path.iterdir())


def test_missing_key(tmp_path):
    cache = StateCache(10, tmp_path)
    for op in (cache.get, cache.pop, cache.delete, cache.location, cache.nbytes):
        with pytest.raises(KeyError, match="nope"):
            op("nope")


def test_unstorable_tree_is_rejected_whole(tmp_path):
    cache = StateCache(0, tmp_path)
    cache.put("run", {"t": torch.ones(1)})
    for bad in ({"f": object()}, {(1, 2): 3}, [np.array([object()])]):
        with pytest.raises(TypeError):
            cache.put("run", bad)
    assert torch.equal(cache.get("run")["t"], torch.ones(1))


@pytest.mark.parametrize("budget", [0, 10**9])
def test_restored_optimizer_steps_like_one_never_swapped(tmp_path, budget):
    model, optimizer, scheduler = _training_objects()
    _train(model, optimizer, scheduler, steps=3, seed=1)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    model, optimizer, scheduler = _training_objects()
    # The same stream of batches: two steps, a swap, then the third.
    gen_steps = 2
    _train(model, optimizer, scheduler, steps=gen_steps, seed=1)
    cache = StateCache(budget, tmp_path)
    cache.put(
        "run",
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        },
    )
    model, optimizer, scheduler = _training_objects()  # fresh objects, as after a swap
    state = cache.pop("run")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    gen = torch.Generator().manual_seed(1)
    for _ in range(gen_steps):
        torch.randn(8, model.in_features, generator=gen)  # skip the batches already seen
    x = torch.randn(8, model.in_features, generator=gen)
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    assert_tree_equal(dict(model.state_dict()), reference)
