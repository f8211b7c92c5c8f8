"""A disk fault is the experiment's, not a run's: it stops at the boundary with one message
naming the path, fails no run, and a re-run once it is fixed ends bitwise equal to an
uninterrupted experiment.

The checkpoints folder is a real tmpfs mount (root, as on the developers' machines and CI),
filled up or remounted read-only in the middle of a run's training.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from trl_rapidfire import ExperimentFault, List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.state_file import FileStore
from trl_rapidfire.storage.faults import disk_fault
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# A checkpoint at every boundary: the faults met writing them are what is tested here.
BASE = dict(cpu_training_kwargs(), per_device_train_batch_size=4, logging_steps=1,
            report_to="none", checkpoint_every="chunk")


@pytest.fixture(scope="module")
def model_path():
    return tiny_model_path()


def _trainer(model_path, out, callbacks=None):
    return RFSFTTrainer(
        model=model_path,
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=4,
                         max_steps=8, **BASE),
        train_dataset=make_sft_dataset(32),
        peft_config=tiny_lora_config(r=4, lora_dropout=0.1),
        callbacks=callbacks,
    )


def _mount(path: Path, *options: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=4m", *options)), "tmpfs",
                    str(path)], check=True, capture_output=True)


@pytest.fixture
def checkpoints_mount(tmp_path, mode):
    """``<exp>/.rapidfire/checkpoints`` (or the whole ``<exp>`` folder, for ``folder-full``)
    on a 4 MB tmpfs of its own."""
    mnt = tmp_path / "exp"
    if mode != "folder-full":
        mnt = mnt / ".rapidfire" / "checkpoints"
    mnt.mkdir(parents=True)
    try:
        _mount(mnt)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


class _BreakTheDisk(TrainerCallback):
    """At step 4 of the run with learning rate 3e-3, the checkpoints' disk fills up or turns
    read-only; its next boundary (step 4) cannot be written."""

    def __init__(self, mnt: Path, mode: str):
        self.mnt, self.mode = str(mnt), mode

    def on_step_end(self, args, state, control, **kwargs):
        if args.learning_rate != 3e-3 or state.global_step != 4:
            return
        if self.mode == "readonly":
            subprocess.run(["mount", "-o", "remount,ro", self.mnt], check=True)
            return
        with open(os.path.join(self.mnt, "ballast"), "wb") as fh:
            block = b"\0" * 65536
            try:
                while True:
                    fh.write(block)
                    fh.flush()
            except OSError as err:
                assert err.errno == errno.ENOSPC


def _adapters(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {run: load_file(out / "runs" / run / "final" / "adapter_model.safetensors")
            for run in ("run-0", "run-1")}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "readonly", "folder-full"])
def test_a_disk_fault_stops_the_experiment_and_a_rerun_ends_bitwise_equal(
    model_path, tmp_path, checkpoints_mount, mode
):
    ref = _trainer(model_path, tmp_path / "ref")
    ref.train()
    want = _adapters(tmp_path / "ref")

    out = tmp_path / "exp"
    broken = _trainer(model_path, out, callbacks=[_BreakTheDisk(checkpoints_mount, mode)])
    with pytest.raises(ExperimentFault) as info:
        broken.train()
    message = str(info.value)
    assert "cannot write the " in message and "\n" not in message
    assert str(checkpoints_mount) in message
    words = {"full": ("No space left on device", "file write failed"),
             "folder-full": ("No space left on device", "file write failed"),
             "readonly": ("Read-only file system",)}[mode]
    assert any(w in message for w in words), message
    assert "run the script again" in message
    # Nothing failed: every run can continue from its last recorded boundary.
    state = FileStore(out / ".rapidfire", "", create=False).peek().to_json()
    assert {r["status"] for r in state["runs"].values()} <= {"pending", "running"}
    if mode != "folder-full":  # else releasing the claim could not be written either
        assert not state["claims"]
    assert state["runs"]["run-1"]["chunks_done"] >= 1
    # This trainer trains no more; a new one (a re-run) does.
    with pytest.raises(ExperimentFault):
        broken.train()

    if mode == "readonly":
        subprocess.run(["mount", "-o", "remount,rw", str(checkpoints_mount)], check=True)
    else:
        (checkpoints_mount / "ballast").unlink()
    again = _trainer(model_path, out)
    again.train()
    assert {r.name: r.status.value for r in again.runs} == {"run-0": "completed",
                                                           "run-1": "completed"}
    got = _adapters(out)
    for run in want:
        assert want[run].keys() == got[run].keys()
        assert all(torch.equal(want[run][k], got[run][k]) for k in want[run]), run


@pytest.mark.slow
def test_a_nearly_full_output_dir_is_a_fault_and_a_rerun_ends_bitwise_equal(model_path,
                                                                          tmp_path):
    """The whole output_dir on a 3 MB tmpfs, nearly full: torch.save meets it as a
    RuntimeError ("basic_ios::clear: iostream error", "unexpected pos 64 vs 0"), which must
    stop the experiment, not fail every run for good."""
    ref = _trainer(model_path, tmp_path / "ref")
    ref.train()
    want = _adapters(tmp_path / "ref")

    out = tmp_path / "exp"
    out.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(out)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    try:
        # Room for the state and a little more, not for a chunk's checkpoints.
        free = os.statvfs(out).f_bavail * os.statvfs(out).f_frsize
        (out / "ballast").write_bytes(b"\0" * (free - 100 * 1024))
        broken = _trainer(model_path, out)
        with pytest.raises(ExperimentFault, match="cannot write the .*(torch could not write "
                                                  "a file|No space left on device)"):
            broken.train()
        state = FileStore(out / ".rapidfire", "", create=False).peek().to_json()
        assert {r["status"] for r in state["runs"].values()} <= {"pending", "running"}
        (out / "ballast").unlink()  # space freed
        again = _trainer(model_path, out)
        again.train()
        assert {r.status.value for r in again.runs} == {"completed"}
        got = _adapters(out)
        for run in want:
            assert all(torch.equal(want[run][k], got[run][k]) for k in want[run]), run
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False, capture_output=True)


def test_an_unwritable_state_folder_is_one_clear_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    try:
        _mount(folder, "ro")
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    try:
        with pytest.raises(ExperimentFault) as info:
            FileStore(folder / ".rapidfire", fingerprint="x")
        message = str(info.value)
        assert "Read-only file system" in message and str(folder) in message
        assert "Traceback" not in message and "\n" not in message
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False, capture_output=True)


def test_what_counts_as_a_disk_fault():
    assert disk_fault(OSError(errno.ENOSPC, "No space left on device", "/x/y"))
    assert "Read-only" in disk_fault(OSError(errno.EROFS, "Read-only file system"))
    # torch's zip writer hides the OSError behind its own words.
    wrapped = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0:"
                           " PytorchStreamWriter failed writing file data/0: file write failed")
    assert disk_fault(wrapped)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise ValueError("saving failed") from inner
    except ValueError as outer:
        assert disk_fault(outer)
    # A run's own code meeting a permission error is that run's failure...
    denied = PermissionError(errno.EACCES, "Permission denied", "/data/train.json")
    assert disk_fault(denied) is None
    # ...while our own writes meeting one are a fault.
    assert disk_fault(denied, ours=True)
    assert disk_fault(ValueError("learning rate is NaN")) is None
    assert disk_fault(KeyError(str(uuid.uuid4()))) is None
    # torch.save on a nearly full disk: only its C++ stream's words say so.
    for words in ("basic_ios::clear: iostream error",
                  "[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"):
        assert "disk is most likely full" in disk_fault(RuntimeError(words), ours=True)
    assert disk_fault(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
