"""A train() call leaves no thread of its own behind: the checkpoint writer, the lease keeper
and the MLflow thread end with it (and start again with the next call). A notebook that trains
many experiments, or this test suite, would otherwise pile them up, each holding what its
experiment held."""

from __future__ import annotations

import threading

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def _ours() -> set[threading.Thread]:
    return {t for t in threading.enumerate()
            if t.name.startswith("rapidfire") and t.is_alive()}


def test_train_leaves_no_thread_of_its_own_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    before = _ours()
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), num_chunks=2,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         **{**cpu_training_kwargs(), "report_to": "mlflow"}),
        train_dataset=make_sft_dataset(16),
        peft_config=tiny_lora_config(),
    )
    for _ in range(2):  # a second train() starts them again and ends them again
        trainer.train()
        left = _ours() - before
        assert not left, sorted(t.name for t in left)
    assert {r.status for r in trainer.runs} == {"completed"}
