"""The cooperative switch's parts: run coroutines, RNG capture/restore, parking tensors."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from trl_rapidfire.runtime.cache import StateCache
from trl_rapidfire.runtime.residency import Residency
from trl_rapidfire.runtime.switch import Aborted, RngState, RunCoroutine


def test_coroutines_take_turns_in_the_order_the_scheduler_gives():
    log: list[str] = []
    runs: dict[str, RunCoroutine] = {}

    def body(name: str, turns: int) -> None:
        for t in range(turns):
            log.append(f"{name}{t}")
            if t < turns - 1:
                runs[name].suspend()

    for name in "ab":
        runs[name] = RunCoroutine(lambda name=name: body(name, 2), name=name)
    assert not runs["a"].started
    for name in ["a", "b", "b", "a"]:
        runs[name].resume()
    assert log == ["a0", "b0", "b1", "a1"]
    assert all(r.finished for r in runs.values())
    # Everything ran on this thread: one OpenMP team, one set of thread-local torch state.
    with pytest.raises(RuntimeError, match="already finished"):
        runs["a"].resume()


def test_abort_unwinds_a_suspended_run_and_exceptions_reach_the_scheduler():
    cleaned: list[str] = []

    def body() -> None:
        try:
            run.suspend()
        finally:
            cleaned.append("unwound")

    run = RunCoroutine(body, name="r")
    run.resume()
    with pytest.raises(Aborted):
        run.abort()  # not caught by the body: comes out where the scheduler called abort
    assert cleaned == ["unwound"] and run.finished

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RunCoroutine(interrupted).resume()


def test_suspend_outside_the_coroutine_is_an_error():
    run = RunCoroutine(lambda: None, name="r")
    with pytest.raises(RuntimeError, match="outside"):
        run.suspend()


def test_rng_state_round_trips_every_stream():
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    saved = RngState.capture()
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    saved.restore()
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def _numpy_ops(seed: int, length: int = 400) -> list[tuple[str, int]]:
    """A random program over 3 runs' saved streams: switches, and draws of every kind that
    moves NumPy's legacy generator differently (uniforms; Gaussians, which leave one cached
    for an odd count; reseeding; nothing at all between switches)."""
    rng = random.Random(seed)
    kinds = ["capture", "restore", "restore", "rand", "randn", "seed", "none", "none"]
    return [(rng.choice(kinds), rng.randrange(3)) for _ in range(length)]


def _run_numpy_program(ops, capture, restore) -> list:
    """Run ``ops`` with the given capture/restore; return everything a run could observe."""
    np.random.seed(0)
    saved = {i: capture() for i in range(3)}
    seen: list = []
    for op, arg in ops:
        if op == "capture":
            saved[arg] = capture()
        elif op == "restore":
            restore(saved[arg])
        elif op == "rand":
            # 2 uniforms take what one Gaussian's pair takes (without caching one), 700
            # reach past a refill of the key
            seen.append(np.random.rand((2, 301, 700)[arg]).tolist())
        elif op == "randn":
            seen.append(np.random.randn(arg + 1).tolist())
        elif op == "seed":
            np.random.seed(arg % 2)  # a seed seen before: the raw bytes repeat
        state = np.random.get_state()
        seen.append((state[1].tobytes(), state[2], state[3], state[4]))
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_rng_state_skips_numpy_only_when_nothing_observable_differs(seed):
    # The whole NumPy state is read or written only when its raw bytes may have moved: every
    # draw, every state and every value a run sees must be what plain get/set_state give.
    ops = _numpy_ops(seed)
    reference = _run_numpy_program(ops, np.random.get_state, np.random.set_state)
    got = _run_numpy_program(ops, RngState.capture, RngState.restore)
    assert got == reference


def test_rng_state_keeps_a_cached_gaussian_apart_from_a_state_with_the_same_raw_bytes():
    # One Gaussian draw takes two uniforms and caches the pair's second value; two uniform
    # draws take the same two: the generators' raw bytes agree, the states do not. Run B must
    # not inherit run A's cached Gaussian.
    seed = next(s for s in range(100) if _same_raw_after_pair(s))
    np.random.seed(seed)
    a, b = RngState.capture(), RngState.capture()
    b.restore()
    np.random.rand(2)
    b = RngState.capture()
    a.restore()
    np.random.randn(1)
    a = RngState.capture()
    assert a.numpy_raw == b.numpy_raw and a.numpy[3] == 1 and b.numpy[3] == 0
    b.restore()
    got = np.random.randn(2).tolist()
    np.random.seed(seed)
    np.random.rand(2)
    assert got == np.random.randn(2).tolist()


def _same_raw_after_pair(seed: int) -> bool:
    """Whether a Gaussian from ``seed`` is made from the first pair of uniforms."""
    np.random.seed(seed)
    np.random.rand(2)
    pos = np.random.get_state()[2]
    np.random.seed(seed)
    np.random.randn(1)
    return np.random.get_state()[2] == pos


def test_rng_state_switches_without_touching_numpy_when_no_run_drew_from_it(monkeypatch):
    np.random.seed(42)
    runs = [RngState.capture() for _ in range(4)]  # runs seeded alike, as a sweep's are
    calls = {"get": 0, "set": 0}
    real_get, real_set = np.random.get_state, np.random.set_state

    def counted_get(*args, **kwargs):
        calls["get"] += 1
        return real_get(*args, **kwargs)

    def counted_set(*args, **kwargs):
        calls["set"] += 1
        return real_set(*args, **kwargs)

    monkeypatch.setattr(np.random, "get_state", counted_get)
    monkeypatch.setattr(np.random, "set_state", counted_set)
    for turn in range(20):  # turns that draw from torch only
        runs[turn % 4].restore()
        torch.rand(2)
        runs[turn % 4] = RngState.capture()
    assert calls == {"get": 0, "set": 0}
    np.random.rand()  # a run that draws: its state is read whole, the next run's written
    runs[0] = RngState.capture()
    runs[1].restore()
    assert calls == {"get": 1, "set": 1}


@pytest.mark.parametrize("budget", [0, 1 << 30])
def test_park_and_unpark_keep_parameter_and_optimizer_identity_and_values(tmp_path, budget):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.randn(2, 4)).sum().backward()
    opt.step()
    params = list(layer.parameters())
    before = [p.detach().clone() for p in params]
    state_before = {k: v.clone() for k, v in opt.state[params[0]].items()}
    cache = StateCache(budget, tmp_path)
    res = Residency("run-0", params)

    res.park(cache, opt)
    assert not res.resident and all(p.numel() == 0 for p in params)
    assert params[0] not in opt.state
    assert cache.location("run-0") == ("disk" if budget == 0 else "memory")

    res.unpark(cache, opt)
    assert res.resident and "run-0" not in cache
    assert list(layer.parameters())[0] is params[0]
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert all(torch.equal(opt.state[params[0]][k], v) for k, v in state_before.items())
    # Training continues from exactly the same state as a never-parked twin.
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict(dict(zip(["weight", "bias"], before)))
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=0.1)
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict aliases
    x = torch.randn(2, 4)
    for model, o in ((layer, opt), (twin, twin_opt)):
        o.zero_grad()
        model(x).sum().backward()
        o.step()
    assert torch.equal(layer.weight, twin.weight)
