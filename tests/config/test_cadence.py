"""checkpoint_every: how it is written, and what the shared state does with volatile chunks
(only their owner continues them; a gone owner's are lost and trained again)."""

from __future__ import annotations

import pytest

from trl_rapidfire import RFSFTConfig
from trl_rapidfire.config.cadence import parse_cadence
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.shared_state.runs import RunState
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.shared_state.store import ExperimentState, claim_next, finish_chunk, mark_durable
from trl_rapidfire.storage.checkpoints import CheckpointCadence

LEASE = 30.0


@pytest.mark.parametrize("text, seconds, chunks", [
    (60, 60.0, None), (2.5, 2.5, None), ("60s", 60.0, None), ("5m", 300.0, None),
    ("1.5 h", 5400.0, None), ("90", 90.0, None), ("4 chunks", None, 4), ("chunk", None, 1),
    ("every 2 chunks", None, 2), (0, None, 1), ("0s", None, 1),
])
def test_checkpoint_every_reads_times_and_chunk_counts(text, seconds, chunks):
    assert parse_cadence(text) == CheckpointCadence(seconds=seconds, chunks=chunks)


@pytest.mark.parametrize("bad", ["soon", "5 weeks", "2.5 chunks", "0 chunks", "-1", -1,
                                 float("inf"), True, None, "", "9" * 100])
def test_a_wrong_checkpoint_every_is_an_error_naming_the_field_and_the_fix(bad, tmp_path):
    with pytest.raises(RFConfigError, match=r"checkpoint_every.*Use e\.g\."):
        parse_cadence(bad)
    if isinstance(bad, str):
        with pytest.raises(RFConfigError, match="checkpoint_every"):
            RFSFTConfig(output_dir=str(tmp_path), checkpoint_every=bad)


def test_the_cadence_is_due_by_chunks_or_by_the_runs_training_time():
    assert CheckpointCadence(chunks=1).due(1, 0.0)
    assert not CheckpointCadence(chunks=3).due(2, 1e9) and CheckpointCadence(chunks=3).due(3, 0)
    assert not CheckpointCadence(seconds=60).due(100, 59.9)
    assert CheckpointCadence(seconds=60).due(1, 60.0)


def _state(runs: int = 2, chunks: int = 4) -> ExperimentState:
    state = ExperimentState(fingerprint="fp")
    for i in range(runs):
        state.add_run(f"run-{i}", chunks)
    return state


def _train(state: ExperimentState, worker: str, run: str, *, durable: bool, now: float = 0):
    claimed = claim_next(state, worker, now=now, lease_seconds=LEASE,
                         alive=lambda w: True)
    assert claimed is not None and claimed[0] == run, claimed
    assert finish_chunk(state, run, worker, claimed[1], global_step=4 * (claimed[1] + 1),
                        durable=durable)


def test_volatile_chunks_are_claimed_only_by_their_owner():
    state = _state(runs=1)
    _train(state, "w0", "run-0", durable=True)
    _train(state, "w0", "run-0", durable=False)
    record = state.runs["run-0"]
    assert (record.chunks_done, record.durable_chunks, record.durable_step) == (2, 1, 4)
    assert record.volatile
    # Another worker cannot continue from state that lives in w0 only.
    assert claim_next(state, "w1", now=1, lease_seconds=LEASE, alive=lambda w: True) is None
    assert claim_next(state, "w0", now=1, lease_seconds=LEASE,
                      alive=lambda w: True) == ("run-0", 2)


def test_a_gone_owners_volatile_chunks_are_lost_and_the_run_continues_from_its_durable_point():
    state = _state(runs=2)
    _train(state, "w0", "run-0", durable=True)
    _train(state, "w0", "run-1", durable=False)
    _train(state, "w0", "run-1", durable=False)
    assert [(r.chunks_done, r.durable_chunks) for r in state.runs.values()] == [(1, 1), (2, 0)]
    # w0 is gone (its process died): w1 takes both runs from their last durable points.
    claimed = claim_next(state, "w1", now=1, lease_seconds=LEASE,
                         alive=lambda w: w != "w0")
    assert claimed == ("run-1", 0)
    assert (state.runs["run-0"].chunks_done, state.runs["run-0"].global_step) == (1, 4)
    assert (state.runs["run-1"].chunks_done, state.runs["run-1"].global_step) == (0, 0)
    assert "w0" not in state.seen and "w1" in state.seen


def test_a_worker_on_another_machine_is_gone_once_it_has_not_been_seen_for_a_lease():
    state = _state(runs=1)
    _train(state, "m2:1:t", "run-0", durable=False, now=0)
    unknown = lambda w: None  # noqa: E731 - another machine: its process cannot be asked
    assert claim_next(state, "w1", now=LEASE - 1, lease_seconds=LEASE, alive=unknown) is None
    assert state.runs["run-0"].chunks_done == 1
    assert claim_next(state, "w1", now=LEASE + 1, lease_seconds=LEASE,
                      alive=unknown) == ("run-0", 0)


def test_mark_durable_only_records_the_owners_checkpoint_of_the_last_chunk():
    state = _state(runs=1)
    _train(state, "w0", "run-0", durable=False)
    assert not mark_durable(state, "run-0", "w1", 1, 4)
    assert not mark_durable(state, "run-0", "w0", 2, 8)
    assert mark_durable(state, "run-0", "w0", 1, 4)
    assert not state.runs["run-0"].volatile and state.runs["run-0"].durable_step == 4


def test_a_completed_chunk_is_durable_and_old_states_read_as_all_durable(tmp_path):
    state = _state(runs=1, chunks=1)
    claim_next(state, "w0", now=0, lease_seconds=LEASE, alive=lambda w: True)
    assert finish_chunk(state, "run-0", "w0", 0, global_step=4, durable=False, complete=True)
    assert not state.runs["run-0"].volatile
    old = {"name": "run-0", "status": "running", "chunks_done": 3, "global_step": 12}
    record = RunState.from_json(old)
    assert (record.durable_chunks, record.durable_step) == (3, 12) and not record.volatile
    # The store keeps the new fields across a reload (snapshot and journal).
    store = FileStore(tmp_path / ".rapidfire", "fp")
    with store.transaction() as st:
        st.add_run("run-0", 4)
        claim_next(st, "w0", now=0, lease_seconds=LEASE, alive=lambda w: True)
        finish_chunk(st, "run-0", "w0", 0, global_step=4, durable=False)
    again = FileStore(tmp_path / ".rapidfire", "fp").read()
    assert again.runs["run-0"].volatile and again.seen == {"w0": 0}


def _experiment(out, **overrides):
    from trl_rapidfire import List, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    kwargs = dict(cpu_training_kwargs(), per_device_train_batch_size=4, num_chunks=4,
                  num_train_epochs=1,
                  logging_steps=1, seed=3, learning_rate=List([1e-3, 3e-3]))
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), **{**kwargs, **overrides}),
        train_dataset=make_sft_dataset(64, seed=1),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
    )


def _final(out, run):
    from safetensors.torch import load_file

    return load_file(out / "runs" / run / "final" / "adapter_model.safetensors")


def test_only_due_boundaries_are_written_and_the_runs_end_as_with_every_boundary(tmp_path):
    import torch

    every = _experiment(tmp_path / "every", checkpoint_every="chunk")
    every.train()
    # 16 steps a run in 4 chunks: boundaries at steps 4, 8 and 12 (16 is the run's end).
    assert (every.engine.stats.checkpoints, every.engine.stats.volatile_boundaries) == (6, 0)
    second = _experiment(tmp_path / "second", checkpoint_every="2 chunks")
    second.train()
    assert (second.engine.stats.checkpoints, second.engine.stats.volatile_boundaries) == (2, 4)
    never = _experiment(tmp_path / "never", checkpoint_every="1h")
    never.train()
    assert (never.engine.stats.checkpoints, never.engine.stats.volatile_boundaries) == (0, 6)
    for run in ("run-0", "run-1"):
        want = _final(tmp_path / "every", run)
        for other in ("second", "never"):
            got = _final(tmp_path / other, run)
            assert all(torch.equal(want[k], got[k]) for k in want), (other, run)


def test_a_stopped_run_and_the_end_of_train_write_the_volatile_boundaries(tmp_path):
    from transformers import TrainerCallback

    from trl_rapidfire.storage.checkpoints import checkpoint_at

    out = tmp_path / "exp"
    trainer = _experiment(out, checkpoint_every="1h")

    class StopRun0(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-1") and state.global_step == 6:
                trainer.stop("run-0")  # applied at the next boundary

    trainer.run_trainer("run-1").add_callback(StopRun0())
    trainer.train()
    state = FileStore(out / ".rapidfire", "", create=False).read()
    run0 = state.runs["run-0"]
    assert run0.status == "stopped" and 0 < run0.chunks_done < 4
    assert not run0.volatile and run0.durable_step == run0.global_step
    assert checkpoint_at(out / ".rapidfire" / "checkpoints" / "run-0", run0.global_step)
    assert trainer.engine.stats.checkpoints == 1  # the stop's, and nothing else


def test_a_new_trainer_in_the_same_process_retrains_what_the_last_one_left_volatile(tmp_path):
    import torch
    from transformers import TrainerCallback

    reference = _experiment(tmp_path / "ref", checkpoint_every="1h")
    reference.train()

    class HardInterrupt(TrainerCallback):
        """A second Ctrl-C: KeyboardInterrupt in the middle of run-1's third chunk."""

        def on_step_begin(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-1") and state.global_step == 10:
                raise KeyboardInterrupt

    out = tmp_path / "exp"
    first = _experiment(out, checkpoint_every="1h")
    first.run_trainer("run-1").add_callback(HardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        first.train()
    state = FileStore(out / ".rapidfire", "", create=False).read()
    # run-0 waited at a boundary: written as the worker left it; run-1 was mid-chunk: its
    # two chunks done since its start are volatile, with no checkpoint to continue from.
    assert not state.runs["run-0"].volatile and state.runs["run-0"].chunks_done >= 2
    assert state.runs["run-1"].volatile and state.runs["run-1"].durable_chunks == 0
    second = _experiment(out, checkpoint_every="1h")
    second.train()
    assert [r.status for r in second.runs] == ["completed", "completed"]
    for run in ("run-0", "run-1"):
        want, got = _final(tmp_path / "ref", run), _final(out, run)
        assert all(torch.equal(want[k], got[k]) for k in want), run


def test_a_stops_write_goes_on_while_the_next_chunks_train_and_is_recorded_once_done(tmp_path):
    # A stop's checkpoint is written on the writer thread while training goes on (it cost a
    # wait and an fsync'd record in the loop, at every stop), and recorded as durable at a
    # later boundary once it is on disk, long before train() ends.
    import time

    from transformers import TrainerCallback

    out = tmp_path / "exp"
    trainer = _experiment(out, checkpoint_every="1h")
    seen, written = [], out / ".rapidfire" / "checkpoints" / "run-0" / "checkpoint-4"

    class StopRun0ThenLook(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if not args.output_dir.endswith("run-1"):
                return
            if state.global_step == 2:
                trainer.stop("run-0")  # applied at the next boundary (step 4)
            if state.global_step == 6:
                # run-1 trains on while run-0's write goes on; on a loaded machine the
                # writer may lag several chunks, so wait here until its folder is in
                # place (renamed in whole): the boundary at step 8 must then record it.
                deadline = time.monotonic() + 120
                while not written.is_dir() and time.monotonic() < deadline:
                    time.sleep(0.05)
                seen.append(FileStore(out / ".rapidfire", "", create=False).read()
                            .runs["run-0"])
            if state.global_step >= 9:
                seen.append(FileStore(out / ".rapidfire", "", create=False).read()
                            .runs["run-0"])

    trainer.run_trainer("run-1").add_callback(StopRun0ThenLook())
    trainer.train()
    assert written.is_dir() and seen[0].status == "stopped" and len(seen) > 1
    stopped = seen[-1]  # read after the boundary at step 8 or 12, before train() ended
    assert stopped.status == "stopped" and not stopped.volatile
    assert stopped.durable_step == stopped.global_step > 0
