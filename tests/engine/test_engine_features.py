"""The engine's other promises: chunk-time evaluation and checkpoints, per-run callbacks, the
schedule, results and the best run, progress output."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.schedule import read_schedule_csv
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def model_path():
    return tiny_model_path()


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(Path(folder) / "adapter_model.safetensors")


def test_chunk_eval_evaluates_every_run_at_each_boundary_without_moving_its_rng(
    model_path, tmp_path
):
    data = make_sft_dataset(32, seed=11)
    evals = make_sft_dataset(8, seed=12)
    lora = tiny_lora_config(r=4, lora_dropout=0.2)  # dropout: any RNG drift would show
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path / "rf"), num_chunks=4, eval_strategy="chunk",
                         num_train_epochs=1, learning_rate=List([1e-3, 3e-3]),
                         **{**BASE, "save_strategy": "chunk"}),
        train_dataset=data,
        eval_dataset=evals,
        peft_config=lora,
    )
    rf.train()
    for i, lr in enumerate([1e-3, 3e-3]):
        trainer = rf.run_trainer(f"run-{i}")
        eval_steps = [e["step"] for e in trainer.state.log_history if "eval_loss" in e]
        assert eval_steps == [2, 4, 6, 8]
        run_dir = tmp_path / "rf" / "runs" / f"run-{i}"
        assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == [
            f"checkpoint-{s}" for s in (2, 4, 6, 8)
        ]
        ref = SFTTrainer(model=model_path, train_dataset=data, peft_config=lora,
                         args=SFTConfig(output_dir=str(tmp_path / f"ref{i}"), learning_rate=lr,
                                        num_train_epochs=1,
                                        **BASE))
        ref.train()
        ref.save_model()
        got, want = _adapter(run_dir / "final"), _adapter(tmp_path / f"ref{i}")
        assert all(torch.equal(got[k], want[k]) for k in want)
        train_logs = [e for e in trainer.state.log_history if "loss" in e]
        ref_logs = [e for e in ref.state.log_history if "loss" in e]
        assert train_logs == ref_logs
        # The checkpoint at the last boundary holds the final weights.
        final_ckpt = _adapter(run_dir / "checkpoint-8")
        assert all(torch.equal(final_ckpt[k], want[k]) for k in want)
    assert all("eval_loss" in r.metrics for r in rf.runs)
    best = min(rf.runs, key=lambda r: r.metrics["eval_loss"])
    assert rf.best_run.name == best.name


def test_chunk_eval_without_eval_dataset_is_a_clear_error_before_loading(model_path, tmp_path):
    with pytest.raises(RFConfigError, match="eval_dataset"):
        RFSFTTrainer(model="/nonexistent/model", train_dataset=make_sft_dataset(8),
                     args=RFSFTConfig(output_dir=str(tmp_path), eval_strategy="chunk", **BASE))


class _Counter(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


class _Uncopyable(TrainerCallback):
    def __init__(self):
        self.lock = threading.Lock()

    def __deepcopy__(self, memo):
        raise TypeError("cannot copy a lock")


def test_user_callbacks_are_copied_per_run(model_path, tmp_path):
    counter = _Counter()
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path), num_chunks=2, max_steps=4,
                         learning_rate=List([1e-3, 2e-3]), **BASE),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4),
        callbacks=[counter],
    )
    rf.train()
    copies = [
        next(cb for cb in rf.run_trainer(f"run-{i}").callback_handler.callbacks
             if isinstance(cb, _Counter))
        for i in range(2)
    ]
    assert copies[0] is not copies[1] and counter not in copies
    assert [c.steps for c in copies] == [4, 4] and counter.steps == 0


def test_a_callback_that_cannot_be_copied_is_a_clear_error(model_path, tmp_path):
    with pytest.raises(TypeError, match="cannot be copied.*pass its class"):
        RFSFTTrainer(model=model_path, train_dataset=make_sft_dataset(8),
                     args=RFSFTConfig(output_dir=str(tmp_path), **BASE),
                     callbacks=[_Uncopyable()])


def test_optimizers_instance_with_several_runs_is_a_clear_error(model_path, tmp_path):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="optimizer_cls_and_kwargs"):
        RFSFTTrainer(model=model_path, train_dataset=make_sft_dataset(8),
                     args=RFSFTConfig(output_dir=str(tmp_path),
                                      learning_rate=List([1e-3, 2e-3]), **BASE),
                     optimizers=(opt, None))


def test_schedule_results_best_run_and_save_model(model_path, tmp_path):
    out = tmp_path / "exp"
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(out), num_chunks=3, num_train_epochs=2,
                         learning_rate=List([3e-3, 1e-5]), **BASE),
        train_dataset=make_sft_dataset(24),
        peft_config=tiny_lora_config(r=4),
    )
    assert [r.status for r in rf.runs] == [RunStatus.PENDING] * 2
    output = rf.train()

    # 6 steps per epoch, 3 chunks each, 2 epochs: 6 chunks per run. Least progress goes
    # first and a tie goes to the run already resident, so after the first round the runs
    # take two turns each: 0 1 1 0 0 1 1 ...; no run is ever more than one chunk ahead.
    sched = rf.schedule
    assert [c.run for c in sched] == ["run-0"] + ["run-1", "run-1", "run-0", "run-0"] * 2 + [
        "run-1", "run-1", "run-0"
    ]
    done = {"run-0": 0, "run-1": 0}
    for c in sched:
        done[c.run] += 1
        assert abs(done["run-0"] - done["run-1"]) <= 1
    assert [(c.epoch, c.chunk, c.start_step, c.end_step) for c in sched if c.run == "run-0"] == [
        (0, 0, 0, 2), (0, 1, 2, 4), (0, 2, 4, 6), (1, 0, 6, 8), (1, 1, 8, 10), (1, 2, 10, 12)
    ]
    assert all(c.end_time >= c.start_time for c in sched)
    assert read_schedule_csv(out / "schedule.csv") == sched

    runs = {r.name: r for r in rf.runs}
    assert all(r.status == RunStatus.COMPLETED and r.global_step == 12 for r in runs.values())
    assert runs["run-0"].knobs == {"learning_rate": 3e-3}
    assert Path(runs["run-0"].output_dir) == out / "runs" / "run-0"
    # Default metric: training loss; the high learning rate learns faster here.
    best = rf.best_run
    assert best.metrics["loss"] == min(r.metrics["loss"] for r in runs.values())
    assert output.global_step == 12
    assert output.training_loss == best.metrics["train_loss"]

    # trainer.model is the best run's, with its adapter active; save_model() saves it alone.
    assert rf.model.active_adapter == rf.run_trainer(best.name)._rf_adapter
    rf.save_model(str(tmp_path / "best"))
    saved = _adapter(tmp_path / "best")
    final = _adapter(Path(best.output_dir) / "final")
    assert saved.keys() == final.keys()
    assert all(torch.equal(saved[k], final[k]) for k in saved)
    assert not any(p.is_dir() for p in (tmp_path / "best").iterdir())  # no per-adapter folders

    # The saved adapter loads as a plain PEFT adapter.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_path),
                                      str(Path(best.output_dir) / "final"))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(final)


def test_metric_for_best_model_and_direction(model_path, tmp_path):
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path), num_chunks=2, max_steps=4,
                         metric_for_best_model="loss", greater_is_better=True,
                         learning_rate=List([3e-3, 1e-5]), **BASE),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4),
    )
    rf.train()
    assert rf.best_run.metrics["loss"] == max(r.metrics["loss"] for r in rf.runs)


def test_progress_bar_and_runs_table(model_path, tmp_path, capsys):
    kwargs = dict(BASE, disable_tqdm=False)
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path), num_chunks=2, max_steps=2,
                         learning_rate=List([1e-3, 2e-3]), **kwargs),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )
    rf.train()
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "chunks" in text and "4/4" in text  # max_steps=2 in 2 chunks, 2 runs
    assert "run-0" in text and "run-1" in text and "completed" in text
    assert "learning_rate=0.002" in text


def test_a_tables_chunk_count_agrees_with_its_rows_while_checkpoints_are_written(
        model_path, tmp_path, capsys, monkeypatch):
    """A chunk is recorded once its checkpoint is on disk, in the background, while the next
    run trains: the header counted recorded chunks only, and read ``chunks 1/6`` above two runs
    at step 1 of 1-step chunks. It counts what the rows show."""
    import re
    import time

    import trl_rapidfire.engine.turns as turns

    written = turns.prune_checkpoints

    def slow(*args, **kwargs):  # a slow disk: the write outlasts the next run's chunk
        time.sleep(0.5)
        return written(*args, **kwargs)

    monkeypatch.setattr(turns, "prune_checkpoints", slow)
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path), num_chunks=2, max_steps=2,
                         checkpoint_every="chunk", learning_rate=List([1e-3, 2e-3, 3e-3]),
                         **dict(BASE, disable_tqdm=False)),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(r=4),
    )
    rf.train()
    tables = capsys.readouterr().out.split("chunks ")[1:]
    assert tables and tables[-1].startswith("6/6 (all runs)\n")
    for table in tables:  # 1 step a chunk: the chunks done are the rows' steps
        done = int(re.match(r"(\d+)/6 \(all runs\)\n", table).group(1))
        steps = [int(line.split()[2]) for line in table.splitlines() if line.startswith("run-")]
        assert done == sum(steps), table


def test_resume_from_a_checkpoint_path_is_a_clear_error_and_train_again_is_a_no_op(model_path,
                                                                                  tmp_path):
    rf = RFSFTTrainer(model=model_path, train_dataset=make_sft_dataset(8), peft_config=
                      tiny_lora_config(r=4),
                      args=RFSFTConfig(output_dir=str(tmp_path), max_steps=1, **BASE))
    with pytest.raises(ValueError, match="resume_from_checkpoint=True"):
        rf.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    first = rf.train(resume_from_checkpoint=True)
    again = rf.train()  # nothing left to train: the same best run's output
    assert again is first and len(rf.schedule) == 1


def test_plain_sft_config_is_one_run_in_one_chunk(model_path, tmp_path):
    args = SFTConfig(output_dir=str(tmp_path), max_steps=3, **BASE)
    rf = RFSFTTrainer(model=model_path, args=copy.deepcopy(args),
                      train_dataset=make_sft_dataset(16), peft_config=tiny_lora_config(r=4))
    rf.train()
    assert [(c.start_step, c.end_step) for c in rf.schedule] == [(0, 3)]
    assert rf.state.global_step == 3


class _Interrupt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate == 2e-3 and state.global_step == 3:
            raise KeyboardInterrupt


def test_keyboard_interrupt_stops_the_experiment_and_unwinds_every_run(model_path, tmp_path):
    rf = RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(tmp_path), num_chunks=4, max_steps=8,
                         learning_rate=List([1e-3, 2e-3]), **BASE),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4),
        callbacks=[_Interrupt()],
    )
    with pytest.raises(KeyboardInterrupt):
        rf.train()
    slots = rf.engine.slots.values()
    assert all(s.turn.coroutine.finished for s in slots)  # nothing left suspended
    assert not any(s.state.status == RunStatus.FAILED for s in slots)  # not the run's fault


def test_runs_sharing_a_model_must_agree_on_settings_applied_to_it(model_path, tmp_path):
    with pytest.raises(RFConfigError, match="pad_token.*shares its base model"):
        RFSFTTrainer(
            model=model_path, train_dataset=make_sft_dataset(8),
            peft_config=tiny_lora_config(r=4),
            args=RFSFTConfig(output_dir=str(tmp_path), pad_token=List(["<pad>", "<s>"]),
                             **BASE),
        )
