"""A sweep over LoRA configs that differ in one field shows that field as a column in MLflow's
runs table: each run logs its config's shown fields as params of their own
(``peft_config.lora_alpha``), and the saved view the dashboard writes puts that column first,
not the long description in which the difference hides. Real training, real sqlite store."""

from __future__ import annotations

import json

from mlflow import MlflowClient

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.dashboard import VIEW_ID, ensure_runs_view
from trl_rapidfire.reports.knob_fields import dotted_params
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)


def test_a_lora_field_that_differs_is_its_own_param_and_the_views_first_column(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    trainer = RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(tmp_path / "exp"), max_steps=2, num_chunks=1,
                         per_device_train_batch_size=4,
                         **dict(cpu_training_kwargs(), report_to="mlflow")),
        train_dataset=make_sft_dataset(8),
        peft_config=List([tiny_lora_config(r=4, lora_alpha=8),
                          tiny_lora_config(r=4, lora_alpha=16, lora_dropout=0.1)]),
    )
    trainer.train()
    trainer.engine.tracker.flush()
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "exp"]
    runs = {r.data.tags["rapidfire.run"]: r.data.params
            for r in client.search_runs([exp.experiment_id], "tags.`rapidfire.role` = 'run'")}
    assert runs["run-0"]["peft_config.lora_alpha"] == "8"
    assert runs["run-1"]["peft_config.lora_alpha"] == "16"
    assert runs["run-0"]["peft_config.r"] == runs["run-1"]["peft_config.r"] == "4"
    assert json.loads(runs["run-0"]["peft_config.target_modules"]) == ["q_proj", "v_proj"]
    # A non-default field is shown, so it is a param: on run-1 only.
    assert runs["run-1"]["peft_config.lora_dropout"] == "0.1"
    assert "peft_config.lora_dropout" not in runs["run-0"]
    assert "LoraConfig(" in runs["run-0"]["peft_config"]  # the whole description stays

    ensure_runs_view(client, exp.experiment_id)
    view = json.loads(client.get_experiment(exp.experiment_id).tags[
        f"mlflow.sharedViewState.{VIEW_ID}"])
    columns = json.loads(view["state"])["columnOrder"]
    knobs = [c for c in columns if c.startswith("params.")]
    assert knobs == ["params.`peft_config.lora_alpha`", "params.`peft_config.lora_dropout`"]


def test_a_knob_that_is_no_object_gives_no_dotted_params():
    assert dotted_params({"lr_scheduler_type": "cosine", "learning_rate": "0.001"}) == {}
    assert dotted_params({"peft_config": "None"}) == {}
