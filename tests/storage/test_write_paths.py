"""Nothing the experiment writes leaves ``output_dir``: each folder it writes (the runs' own,
their ``final/``, ``generations/`` and TensorBoard logs, ``.rapidfire/`` and its folders,
``previous/``) made a link to a folder outside before training is one clear error before
anything trains, and the folder outside stays empty; ``generations/`` made a link while a run
trains fails that run alone, writing nothing through it; and the one write path below a run's
folder (``write_under``) never follows a link."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from transformers import GenerationConfig, TrainerCallback

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.config.configs import RFConfigError
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.names import UntrustedValue
from trl_rapidfire.storage.own_files import LinkRefused, write_under
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

# Every folder the experiment writes, relative to output_dir.
FOLDERS = [
    "runs",
    "runs/run-0",
    "runs/run-0/final",
    "runs/run-0/generations",
    "runs/run-0/runs",  # TensorBoard's logs (transformers' default logging_dir)
    "generations",  # a one-config experiment's run writes in output_dir itself
    ".rapidfire",
    ".rapidfire/checkpoints",
    ".rapidfire/checkpoints/run-0",
    ".rapidfire/warm",
    ".rapidfire/warm/run-0",
    ".rapidfire/cache",
    ".rapidfire/inbox",
    "previous",
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _experiment(out: Path, callbacks=None) -> RFSFTTrainer:
    """Two runs judged by what they generate at each of their 2 chunk ends."""
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), num_chunks=2, max_steps=4,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         per_device_eval_batch_size=4, eval_strategy="chunk",
                         generation_config=GenerationConfig(max_new_tokens=3, do_sample=False),
                         generation_eval_rows=4, **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(16),
        eval_dataset=make_sft_dataset(4, seed=1, kind="prompt_completion"),
        peft_config=tiny_lora_config(r=4), callbacks=callbacks,
    )


def _link(out: Path, folder: str, outside: Path) -> Path:
    """Replace ``out/folder`` (its parents made as real folders) by a link to ``outside``."""
    path = out / folder
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.symlink_to(outside, target_is_directory=True)
    return path


def _everything_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_link_out_of_any_folder_the_experiment_writes_is_refused_before_training(
        tmp_path, folder):
    out, outside = tmp_path / "out", tmp_path / "elsewhere"
    outside.mkdir()
    trainer = _experiment(out)
    link = _link(out, folder, outside)
    with pytest.raises(RFConfigError, match="leads out of") as raised:
        trainer.train()
    assert str(link) in str(raised.value) and "Remove the link" in str(raised.value)
    assert not trainer.schedule  # refused before any chunk trained
    assert _everything_in(outside) == []


def test_a_generations_link_made_while_training_fails_its_run_and_writes_nothing_out(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "elsewhere"
    outside.mkdir()

    class PlantLink(TrainerCallback):
        """Once run-0 trained its first step (before its first evaluation), its
        generations folder becomes a link out of the experiment."""

        def on_step_end(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / "generations"
            if Path(args.output_dir).name == "run-0" and not folder.is_symlink():
                shutil.rmtree(folder, ignore_errors=True)
                folder.symlink_to(outside, target_is_directory=True)

    trainer = _experiment(out, callbacks=[PlantLink()])
    with pytest.warns(RuntimeWarning, match="run-0"):
        trainer.train()
    runs = {r.name: r for r in trainer.runs}
    assert runs["run-0"].status == RunStatus.FAILED
    assert "is a symbolic link" in runs["run-0"].error and "generations" in runs["run-0"].error
    assert runs["run-1"].status == RunStatus.COMPLETED
    assert sorted(os.listdir(out / "runs/run-1/generations")) == ["eval-step-00000002.jsonl",
                                                                  "eval-step-00000004.jsonl"]
    assert _everything_in(outside) == []


def test_write_under_never_follows_a_link(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    write_under(root, root / "generations" / "a.jsonl", "one\n")
    assert (root / "generations" / "a.jsonl").read_text() == "one\n"
    # A folder below the root that is a link: refused, naming it.
    (root / "nested").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LinkRefused, match="nested is a symbolic link"):
        write_under(root, root / "nested" / "deeper" / "b.jsonl", "two\n")
    # A link at the file itself is replaced by the file, its target untouched.
    target = outside / "victim.txt"
    target.write_text("keep")
    (root / "generations" / "c.jsonl").symlink_to(target)
    write_under(root, root / "generations" / "c.jsonl", "three\n")
    assert target.read_text() == "keep"
    assert not (root / "generations" / "c.jsonl").is_symlink()
    # A file where a folder must be, and paths that are not below the root.
    (root / "plain").write_text("")
    with pytest.raises(LinkRefused, match="not a folder"):
        write_under(root, root / "plain" / "d.jsonl", "")
    for path in (outside / "e.jsonl", root / ".." / "elsewhere" / "f.jsonl"):
        with pytest.raises(UntrustedValue):
            write_under(root, path, "")
    assert _everything_in(outside) == ["victim.txt"]
    assert not list(root.rglob(".*.tmp-*"))  # no temporary file left behind
