"""Re-running an experiment continues it: Ctrl-C at a boundary, stopped runs stay stopped,
completed runs are not retrained, and every run ends bitwise equal to an uninterrupted one.

In one process: each "session" is a new RFSFTTrainer on the same output_dir, as a re-run of
the script builds one. The multi-process and kill -9 cases are in test_workers_and_crashes.py.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
            num_chunks=3, warmup_steps=2, seed=5)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class _CtrlC(TrainerCallback):
    """Presses Ctrl-C (SIGINT to this process) when the run with ``lr`` begins ``step``."""

    def __init__(self, lr: float, step: int) -> None:
        self.lr, self.step = lr, step

    def on_step_begin(self, args, state, control, **kwargs):
        if args.learning_rate == self.lr and state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(scope="module")
def warm_clone_reference(tmp_path_factory):
    """run-0 stopped by Ctrl-C after its second chunk (step 8), then warm-cloned with
    learning rate 2e-3 while its state is live, and everything trained to the end in one
    session: the reference of both warm-clone tests below."""
    out = tmp_path_factory.mktemp("warm-clone") / "ref"
    ref = _session(out, callbacks=[_CtrlC(1e-3, 6)])
    with pytest.raises(KeyboardInterrupt):
        ref.train()
    ref.clone("run-0", {"learning_rate": 2e-3}, warm=True)
    ref.train()
    assert {r.name: r.status for r in ref.runs}["run-2"] == RunStatus.COMPLETED
    return out


def _session(out, callbacks=None, **overrides):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]),
                         **{**BASE, **overrides}),
        train_dataset=make_sft_dataset(48, seed=2),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
        callbacks=callbacks,
    )


def _adapter(out, run):
    return load_file(out / "runs" / run / "final" / "adapter_model.safetensors")


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_ctrl_c_stop_and_resume_across_sessions_end_bitwise_equal(tmp_path):
    ref = _session(tmp_path / "ref")
    ref.train()

    out = tmp_path / "exp"
    # 3 epochs of 12 steps, 3 chunks each: 9 chunks of 4 steps per run.
    # Session 1: Ctrl-C in the middle of run-0's third chunk (steps 8-12): it stops at the
    # end of the first epoch, so session 2 continues it across an epoch boundary from disk.
    first = _session(out, callbacks=[_CtrlC(1e-3, 10)])
    with pytest.raises(KeyboardInterrupt, match="chunk boundary"):
        first.train()
    done = {(r.run, r.number) for r in read_schedule_csv(out / "schedule.csv")}
    assert ("run-0", 2) in done, "the chunk in progress finishes before stopping"
    assert len(done) < 18
    assert (out / ".rapidfire" / "checkpoints" / "run-0" / "checkpoint-12").is_dir()
    with open(out / "schedule.csv", "a", encoding="utf-8") as fh:
        fh.write("run-1,0,2,2,0,1796")  # a row a crash cut short: later rows must survive it

    # Session 2: a re-run; run-1 is stopped before anything trains, run-0 finishes.
    second = _session(out)
    second.stop("run-1")
    second.train()
    status = {r.name: r.status for r in second.runs}
    assert status == {"run-0": RunStatus.COMPLETED, "run-1": RunStatus.STOPPED}
    stopped_at = {r.name: r.global_step for r in second.runs}["run-1"]
    assert 0 < stopped_at < 36

    # Session 3: stopped stays stopped, completed is not retrained...
    third = _session(out)
    rows_before = read_schedule_csv(out / "schedule.csv")
    third.train()
    assert read_schedule_csv(out / "schedule.csv") == rows_before
    assert {r.name: r.status for r in third.runs} == status
    # ...and a resumed run continues from its checkpoint.
    third.resume("run-1")
    third.train()
    assert [r.status for r in third.runs] == [RunStatus.COMPLETED] * 2
    assert [r.global_step for r in third.runs] == [36, 36]
    counts = Counter((r.run, r.number) for r in read_schedule_csv(out / "schedule.csv"))
    assert counts == {(run, n): 1 for run in ("run-0", "run-1") for n in range(9)}

    for run in ("run-0", "run-1"):
        _assert_same(_adapter(tmp_path / "ref", run), _adapter(out, run))
    # The best run's weights are live in the trainer even if this session did not train it.
    third.save_model(str(tmp_path / "best"))
    _assert_same(load_file(tmp_path / "best" / "adapter_model.safetensors"),
                 _adapter(out, third.best_run.name))
    # And the logs: every step logged once, as in the reference.
    losses = [(e["step"], e["loss"]) for e in third.run_trainer("run-1").state.log_history
              if "loss" in e]
    ref_losses = [(e["step"], e["loss"]) for e in ref.run_trainer("run-1").state.log_history
                  if "loss" in e]
    assert losses == ref_losses


def test_rerun_with_other_configs_moves_the_old_experiment_aside_and_starts_afresh(tmp_path):
    first = _session(tmp_path / "exp", max_steps=2)
    first.train()
    kept = {run: _adapter(tmp_path / "exp", run) for run in ("run-0", "run-1")}
    with pytest.warns(UserWarning, match=r"held another experiment.*moved, whole, to"):
        second = _session(tmp_path / "exp", max_steps=3)
    second.train()
    (old,) = (tmp_path / "exp" / "previous").iterdir()
    for run in ("run-0", "run-1"):  # nothing of the old experiment was lost
        _assert_same(kept[run], _adapter(old, run))
    assert [r.global_step for r in second.runs] == [3, 3]  # not continued from step 2
    fresh = _session(tmp_path / "fresh", max_steps=3)
    fresh.train()
    for run in ("run-0", "run-1"):
        _assert_same(_adapter(tmp_path / "fresh", run), _adapter(tmp_path / "exp", run))


def test_a_warm_clone_survives_an_interrupted_session_and_ends_as_if_uninterrupted(
    tmp_path, warm_clone_reference
):
    stop_parent = _CtrlC(1e-3, 6)  # run-0 stops after its second chunk (step 8)

    def clone_then_train(trainer):
        trainer.clone("run-0", {"learning_rate": 2e-3}, warm=True)
        trainer.train()

    # Reference (the fixture): the clone made at the same point and trained to the end in
    # one session. The same, but the session is interrupted in the clone's second chunk...
    out = tmp_path / "exp"
    first = _session(out, callbacks=[stop_parent, _CtrlC(2e-3, 6)])
    with pytest.raises(KeyboardInterrupt):
        first.train()
    with pytest.raises(KeyboardInterrupt):
        clone_then_train(first)
    assert (out / ".rapidfire" / "warm" / "run-2").is_dir()
    # ...and a re-run builds the clone from its recipe and continues it from disk.
    second = _session(out)
    second.train()
    runs = {r.name: r for r in second.runs}
    assert runs["run-2"].status == RunStatus.COMPLETED
    assert runs["run-2"].knobs["learning_rate"] == 2e-3
    for run in ("run-0", "run-1", "run-2"):
        _assert_same(_adapter(warm_clone_reference, run), _adapter(out, run))


def test_a_warm_clone_of_a_run_trained_in_an_earlier_session_starts_from_its_checkpoint(
    tmp_path, warm_clone_reference
):
    stop_parent = _CtrlC(1e-3, 6)
    # Reference (the fixture): the parent's state is live when the clone is made.
    # Here the parent was trained by the session before: its state is read from its
    # checkpoint (weights and Adam moments), which must give the same clone.
    out = tmp_path / "exp"
    with pytest.raises(KeyboardInterrupt):
        _session(out, callbacks=[stop_parent]).train()
    second = _session(out)
    second.clone("run-0", {"learning_rate": 2e-3}, warm=True)
    second.train()
    assert "ok: created run-2 warm-started from run-0" in [o.result for o in second.op_log]
    for run in ("run-0", "run-1", "run-2"):
        _assert_same(_adapter(warm_clone_reference, run), _adapter(out, run))


def test_a_run_whose_checkpoint_is_gone_fails_alone_with_the_reason(tmp_path):
    out = tmp_path / "exp"
    with pytest.raises(KeyboardInterrupt):
        _session(out, callbacks=[_CtrlC(1e-3, 6)]).train()
    shutil.rmtree(out / ".rapidfire" / "checkpoints" / "run-1")
    second = _session(out)
    with pytest.warns(RuntimeWarning, match="run-1 failed: .*no checkpoint at step"):
        second.train()
    runs = {r.name: r for r in second.runs}
    assert runs["run-0"].status == RunStatus.COMPLETED
    assert runs["run-1"].status == RunStatus.FAILED and "no checkpoint" in runs["run-1"].error


def test_a_rerun_says_what_it_continues_and_a_first_run_does_not(tmp_path, capsys):
    """A re-run's bar would just jump to the chunks done: one line says the call continues."""
    out = tmp_path / "exp"
    # 1 epoch of 12 steps in 3 chunks, 2 runs: 6 chunks. Ctrl-C in run-0's second chunk.
    quick = dict(num_train_epochs=1, disable_tqdm=False)
    first = _session(out, callbacks=[_CtrlC(1e-3, 6)], **quick)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    printed = capsys.readouterr()
    assert "continuing" not in printed.out + printed.err
    done = len(read_schedule_csv(out / "schedule.csv"))
    assert 0 < done < 6

    _session(out, **quick).train()
    printed = capsys.readouterr().out
    assert printed.count(f"continuing: {done} of 6 chunks done; {6 - done} left\n") == 1, printed
    assert "nothing left" not in printed

    rows = read_schedule_csv(out / "schedule.csv")
    _session(out, **quick).train()  # finished: nothing is trained, and it says so
    assert "continuing: 6 of 6 chunks done; nothing left to train\n" in capsys.readouterr().out
    assert read_schedule_csv(out / "schedule.csv") == rows


def test_a_rerun_after_a_policy_stopped_runs_says_nothing_is_left(tmp_path, capsys):
    """The stopped runs' untrained chunks are not work left: the count is of what trains."""
    from trl_rapidfire import SuccessiveHalving

    out = tmp_path / "exp"

    def session():
        return RFSFTTrainer(
            model=tiny_model_path(),
            args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-4, 1e-3, 3e-3, 1e-2]),
                             **{**BASE, "num_train_epochs": 1, "disable_tqdm": False,
                                "eval_strategy": "chunk"}),
            train_dataset=make_sft_dataset(48, seed=2), eval_dataset=make_sft_dataset(8, seed=3),
            peft_config=tiny_lora_config(r=4), policy=SuccessiveHalving("eval_loss", eta=2),
        )

    first = session()
    first.train()
    trained = len(read_schedule_csv(out / "schedule.csv"))
    stopped = [r for r in first.runs if r.status == RunStatus.STOPPED]
    assert stopped and trained < 4 * 3  # the policy stopped runs before their last chunk
    # The bar ended full: its count is what the experiment trained.
    assert first.engine.total_chunks == trained
    capsys.readouterr()
    second = session()
    second.train()
    printed = capsys.readouterr().out
    assert f"continuing: {trained} of {trained} chunks done; nothing left to train\n" in printed
    # The re-run's op log goes on from the first's (the policy's stops are in ops.csv).
    def handled(rf):
        return [(o.source, o.run, o.op, o.result) for o in rf.op_log]
    assert handled(second) == handled(first) and len(handled(first)) >= len(stopped)


def test_a_continued_bars_rate_counts_only_the_chunks_trained_now(capsys):
    import io
    import time

    from trl_rapidfire.reports.progress import ExperimentProgress

    progress = ExperimentProgress(100, stream=io.StringIO())
    assert progress.mode == "log"
    progress.begin(90)  # 90 chunks were done by an earlier process
    time.sleep(0.5)
    progress.chunk_done([], 91)
    progress.close()
    bar = capsys.readouterr().err.rsplit("\r", 1)[-1]
    assert "91/100" in bar
    rate = float(bar.split(", ")[-1].split("chunk/s")[0])
    assert rate < 10, bar  # one chunk in ~0.5 s, not 91
