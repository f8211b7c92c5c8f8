"""KTO, Reward, RLOO and Distillation: a warm clone starts from its parent's whole state (a
reward model's score head included), whether the parent's state is live or read back from its
checkpoint by a re-run, and ends the same either way."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file
from trainer_kinds import KINDS
from transformers import TrainerCallback

from trl_rapidfire import List
from trl_rapidfire.shared_state.runs import RunStatus


class _CtrlC(TrainerCallback):
    """Ctrl-C (SIGINT to this process) when the run with learning rate ``lr`` begins step 1:
    the experiment stops at that run's next chunk boundary."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def on_step_begin(self, args, state, control, **kwargs):
        if args.learning_rate == self.lr and state.global_step == 1:
            os.kill(os.getpid(), signal.SIGINT)


def _session(kind, out, callbacks=()):
    return KINDS[kind].experiment(out, trainer={"callbacks": list(callbacks)}, num_chunks=3,
                                  learning_rate=List([1e-3, 3e-3]))


def _final(out, run):
    return load_file(out / "runs" / run / "final" / "adapter_model.safetensors")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_warm_clone_from_a_checkpoint_ends_as_one_from_the_live_parent(kind, tmp_path):
    live = tmp_path / "live"
    first = _session(kind, live, [_CtrlC(1e-3)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    first.clone("run-0", {"learning_rate": 2e-3}, warm=True)  # run-0's state is in memory
    first.train()

    read = tmp_path / "read"
    with pytest.raises(KeyboardInterrupt):
        _session(kind, read, [_CtrlC(1e-3)]).train()
    again = _session(kind, read)  # a re-run: run-0's state is its checkpoint on disk
    again.clone("run-0", {"learning_rate": 2e-3}, warm=True)
    again.train()
    assert any(o.result.startswith("ok: created run-2 warm-started from run-0")
               for o in again.op_log)
    assert {r.name: r.status for r in again.runs}["run-2"] == RunStatus.COMPLETED
    for run in ("run-0", "run-1", "run-2"):
        a, b = _final(live, run), _final(read, run)
        assert a.keys() == b.keys(), run
        assert all(torch.equal(a[k], b[k]) for k in a), run
    if kind != "reward":
        return
    # The score head is the run's own and travels with the warm start: a cold clone (its
    # head as the load drew it) ends elsewhere, its head included.
    cold = tmp_path / "cold"
    with pytest.raises(KeyboardInterrupt):
        _session(kind, cold, [_CtrlC(1e-3)]).train()
    third = _session(kind, cold)
    third.clone("run-0", {"learning_rate": 2e-3})
    third.train()
    a, c = _final(live, "run-2"), _final(cold, "run-2")
    head = next(k for k in a if "score" in k)
    assert not torch.equal(a[head], c[head])
