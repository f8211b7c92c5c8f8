"""``trl-rapidfire status``: the folder given positionally (as ``report`` takes it), and a
knob whose values are LoRA configs shown by the field that differs, from a real experiment
tracked in a real MLflow store (sqlite) and from its folder alone."""

from __future__ import annotations

import pytest

from trl_rapidfire.cli import main


@pytest.fixture(scope="module")
def lora_experiment(tmp_path_factory):
    """Two runs whose one knob is ``peft_config``: two LoRA configs that differ in alpha."""
    import torch

    from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
    from trl_rapidfire.testing import (
        cpu_training_kwargs,
        make_sft_dataset,
        tiny_lora_config,
        tiny_model_path,
    )

    root = tmp_path_factory.mktemp("status")
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        config = RFSFTConfig(output_dir=str(root / "exp"), max_steps=2, num_chunks=1,
                             per_device_train_batch_size=4, logging_steps=1,
                             **{**cpu_training_kwargs(), "report_to": "mlflow"})
        RFSFTTrainer(model=tiny_model_path(), args=config,
                     train_dataset=make_sft_dataset(16, seed=3),
                     peft_config=List([tiny_lora_config(r=8, lora_alpha=a) for a in (16, 32)]),
                     ).train()
    return root


def _table(out: str) -> tuple[str, dict[str, str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    rows = {line.split()[0]: line for line in lines[start + 2:] if line.startswith("run-")}
    return lines[start], rows


@pytest.mark.slow  # the experiment it reads: ~10 s on a busy 2-core machine
@pytest.mark.parametrize("how", ["positional", "--output-dir", "untracked"])
def test_status_takes_the_folder_and_shows_lora_alpha_as_a_column(lora_experiment, how,
                                                                   monkeypatch, capsys):
    exp = str(lora_experiment / "exp")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{lora_experiment / 'mlflow.db'}")
    if how == "untracked":  # the folder alone (its state file): no store to read
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{lora_experiment / 'none.db'}")
        (lora_experiment / "exp" / ".rapidfire" / "experiment.json").rename(
            lora_experiment / "experiment.json")
    try:
        argv = ["status", exp] if how != "--output-dir" else ["status", "--output-dir", exp]
        assert main(argv) == 0, capsys.readouterr()
    finally:
        if how == "untracked":
            (lora_experiment / "experiment.json").rename(
                lora_experiment / "exp" / ".rapidfire" / "experiment.json")
    out = capsys.readouterr().out
    assert ("not tracked in MLflow" in out) == (how == "untracked"), out
    header, rows = _table(out)
    # The field that differs is a column of its own, whole; nothing cut in the middle.
    assert "peft_config.lora_alpha" in header.split(), header
    assert "peft_config" not in header.split() and "…" not in "".join(rows.values())
    at = header.index("peft_config.lora_alpha")  # the table is left-aligned: its column
    assert [rows[r][at:].split()[0] for r in ("run-0", "run-1")] == ["16", "32"], rows


def test_two_folders_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["status", str(tmp_path / "a"), "--output-dir", str(tmp_path / "b")])
    assert "two folders given" in capsys.readouterr().err
