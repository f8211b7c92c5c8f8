"""The cooperative switch's parts: run coroutines, RNG capture/restore, parking tensors."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from trl_rapidfire.cache import StateCache
from trl_rapidfire.residency import Residency
from trl_rapidfire.switch import Aborted, RngState, RunCoroutine


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
