"""TRL's own ``trl/scripts/sft.py``, with ``SFTTrainer``/``SFTConfig`` swapped for the RF
classes, runs unchanged and trains a config group read from YAML."""

from __future__ import annotations

import json

import trl
import yaml

from trl_rapidfire import RFSFTConfig, RFSFTTrainer
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.testing import make_sft_dataset, tiny_model_path


def test_trl_sft_script_with_the_two_names_swapped(tmp_path, monkeypatch):
    from trl.scripts import sft

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for split, n, seed in (("train", 32, 0), ("test", 8, 1)):
        rows = make_sft_dataset(n, seed=seed)
        (data_dir / f"{split}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
        )
    config = {
        "model_name_or_path": tiny_model_path(),
        "dataset_name": str(data_dir),
        "output_dir": str(tmp_path / "out"),
        "learning_rate": {"List": [1e-3, 3e-3]},
        "num_chunks": 2,
        "max_steps": 4,
        "per_device_train_batch_size": 4,
        "use_peft": True,
        "lora_r": 4,
        "lora_target_modules": ["q_proj", "v_proj"],
        "bf16": False,
        "report_to": "none",
        "disable_tqdm": True,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")

    # The only change to the script: the two class names.
    monkeypatch.setattr(trl, "SFTTrainer", RFSFTTrainer)
    monkeypatch.setattr(trl, "SFTConfig", RFSFTConfig)
    created = []
    monkeypatch.setattr(RFSFTTrainer, "train", _recording(RFSFTTrainer.train, created))
    monkeypatch.setattr("sys.argv", ["sft.py", "--config", str(tmp_path / "config.yaml")])
    parser = sft.make_parser()
    sft.main(*parser.parse_args_and_config(fail_with_unknown_args=False))

    # A method patched on the RF class reaches the runs' trainers too (their class has it in
    # its MRO): the script's trainer is the one that is not a run's.
    from trl_rapidfire.trainers.run_trainer import RunTrainerMixin

    (trainer,) = [t for t in created if not isinstance(t, RunTrainerMixin)]
    assert len(created) > 1
    assert [r.status for r in trainer.runs] == [RunStatus.COMPLETED] * 2
    assert [r.knobs for r in trainer.runs] == [{"learning_rate": 1e-3}, {"learning_rate": 3e-3}]
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()  # save_model(): best run
    for run in trainer.runs:
        assert (tmp_path / "out" / "runs" / run.name / "final" / "adapter_config.json").is_file()


def _recording(train, created):
    def train_and_record(self, *args, **kwargs):
        created.append(self)
        return train(self, *args, **kwargs)

    return train_and_record

