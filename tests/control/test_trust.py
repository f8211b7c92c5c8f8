"""Tags and state files are data, never code or paths (issue: trust and faults, S1-S3).

A model folder with remote code writes a marker file when its code is imported: a clone from a
tag, the CLI or a crafted state file must never import it (the marker stays absent), while the
script's own Python call, the author's, still can (which shows the marker is live). A crafted
run name never leads to a write or removal outside ``output_dir``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from mlflow import MlflowClient
from state_files import add_run, read_state

from trl_rapidfire import List, RFConfigError, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.client.cli import main as cli_main
from trl_rapidfire.control.ops import OpError, resolve_overrides
from trl_rapidfire.control.trust import check_tag_override, refused_by_name
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.names import UntrustedValue, check_run_name, inside
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

BASE = {k: v for k, v in cpu_training_kwargs().items() if k != "report_to"}
BASE.update(per_device_train_batch_size=4, logging_steps=1)

_EVIL = '''
import pathlib
pathlib.Path({marker!r}).write_text("remote code ran")
from transformers import LlamaConfig, LlamaForCausalLM


class EvilConfig(LlamaConfig):
    model_type = "llama"


class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
'''


@pytest.fixture
def evil_model(tmp_path):
    """A copy of the tiny model whose config points at remote code that leaves a marker."""
    folder = tmp_path / "evil-model"
    shutil.copytree(tiny_model_path(), folder)
    marker = tmp_path / "MARKER"
    (folder / "evil_code.py").write_text(_EVIL.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil_code.EvilConfig",
                          "AutoModelForCausalLM": "evil_code.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def _trainer(out, *, report_to="none", **kw):
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), learning_rate=List([1e-3, 3e-3]), num_chunks=2,
                         max_steps=2, report_to=report_to, **BASE, **kw),
        train_dataset=make_sft_dataset(16),
        peft_config=List([tiny_lora_config(r=4), tiny_lora_config(r=8)]),
    )


def _evil_op(folder: Path) -> str:
    return f'clone {json.dumps({"model": str(folder), "trust_remote_code": True})}'


def test_a_clone_from_a_tag_or_the_cli_cannot_load_code(tmp_path, monkeypatch, evil_model):
    folder, marker = evil_model
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rf = _trainer(tmp_path / "exp", report_to="mlflow")
    tracker = rf.engine.tracker
    # As the MLflow UI sets it, and as the CLI sets it.
    tracker.client.set_tag(tracker.run_id("run-0"), "rapidfire.op", _evil_op(folder))
    assert cli_main(["clone", "run-1", "--set", f"model={folder}", "--set",
                     "trust_remote_code=true", "--output-dir", str(tmp_path / "exp"),
                     "--next-run"]) == 0  # built, not training yet
    tracker.poll_now()
    records = rf.engine.apply_ops()
    assert sorted(r.run for r in records) == ["run-0", "run-1"]
    for record in records:
        assert record.source == "tag"
        assert record.result.startswith("error: "), record.result
        assert "'model'" in record.result and "clone_overrides" in record.result
    assert not marker.exists()
    assert sorted(rf.engine.slots) == ["run-0", "run-1", "run-2", "run-3"]  # no clone made
    tracker.flush()
    tags = MlflowClient(tracker.uri).get_run(tracker.run_id("run-0")).data.tags
    result = tags["rapidfire.op.result"]
    assert "error: " in result and "'model'" in result, result


REFUSED = [
    ({"trust_remote_code": True}, "loads code"),
    ({"model_init_kwargs": {"trust_remote_code": True}}, "loads code"),
    ({"output_dir": "/tmp/x"}, "whole experiment"),
    ({"report_to": "wandb"}, "whole experiment"),
    ({"hub_model_id": "someone/model"}, "loads code"),
    ({"push_to_hub": True}, "loads code"),
    ({"chat_template_path": "/etc/passwd"}, "loads code"),
    ({"resume_from_checkpoint": "/x"}, "loads code"),
    ({"dataset_text_field": "secret"}, "free-form text"),
    ({"peft_config.base_model_name_or_path": "/x"}, "loads code"),
    ({"peft_config.megatron_core": "os"}, "free-form text"),
    ({"peft_config.target_modules": ["q_proj", "../x"]}, "module names"),
    ({"lr_scheduler_type": "not-a-schedule"}, "not one of"),
    ({"lr_scheduler_kwargs": {"fn": "os.system"}}, "text"),
    ({"model": {"candidate": 0}}, "not a List knob"),
]


def test_tag_clones_refuse_what_loads_code_or_chooses_places(tmp_path):
    rf = _trainer(tmp_path / "exp")
    for overrides, _ in REFUSED:
        rf.engine.queue_op("run-0", f"clone {json.dumps(overrides)}", source="tag")
    records = rf.engine.apply_ops()
    assert len(records) == len(REFUSED)
    for (_, fragment), record in zip(REFUSED, records):
        assert record.result.startswith("error: ") and fragment in record.result, record
    assert sorted(rf.engine.slots) == ["run-0", "run-1", "run-2", "run-3"]


def test_a_status_op_before_train_says_the_run_is_not_registered_yet(tmp_path):
    # The run exists (built here) but the shared state has no record of it before train():
    # the answer must say so, not that no run has its name while listing it.
    rf = _trainer(tmp_path / "exp")
    rf.engine.queue_op("run-1", "stop", source="python")
    with pytest.warns(RuntimeWarning, match="not in the experiment's shared state yet"):
        [record] = rf.engine.apply_ops()
    assert record.result.startswith("error: run-1 is not in the experiment's shared state")
    rf.engine.queue_op("run-9", "stop", source="python")
    with pytest.warns(RuntimeWarning, match="no run named 'run-9'"):
        rf.engine.apply_ops()


def test_tag_clones_may_change_hyperparameters_and_pick_declared_candidates(tmp_path):
    rf = _trainer(tmp_path / "exp")
    for overrides in ({"learning_rate": 5e-4, "weight_decay": 0.1},
                      {"peft_config": {"candidate": 1}, "lr_scheduler_type": "cosine"},
                      {"peft_config.r": 16, "peft_config.target_modules": ["q_proj", "v_proj"]},
                      {"learning_rate": 3e-3, "gradient_accumulation_steps": 2}):
        rf.engine.queue_op("run-0", f"clone {json.dumps(overrides)}", source="tag")
    records = rf.engine.apply_ops()
    assert [r.result for r in records] == [f"ok: created run-{i}" for i in range(4, 8)]
    assert rf.runs[5].knobs["peft_config"].r == 8
    assert rf.runs[6].knobs["peft_config"].r == 16


def test_the_authors_python_clone_is_not_restricted(tmp_path, evil_model):
    # The marker is live: the same op from the script itself imports the remote code.
    folder, marker = evil_model
    rf = _trainer(tmp_path / "exp")
    rf.engine.queue_op("run-0", _evil_op(folder), source="python")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whether the odd model then trains is not the point
        rf.engine.apply_ops()
    assert marker.exists()


def test_clone_overrides_lets_the_author_allow_more(tmp_path):
    rf = _trainer(tmp_path / "exp", clone_overrides=["dataset_text_field"])
    rf.engine.queue_op("run-0", 'clone {"dataset_text_field": "text"}', source="tag")
    rf.engine.queue_op("run-0", 'clone {"trust_remote_code": true}', source="tag")
    first, second = rf.engine.apply_ops()
    assert first.result == "ok: created run-4"
    assert second.result.startswith("error: ") and "trust_remote_code" in second.result


def _add_clone(doc: dict, name: str, op: str) -> None:
    add_run(doc, name, {"parent": "run-0", "op": op})


def test_a_crafted_clone_in_the_state_file_cannot_load_code(tmp_path, evil_model):
    folder, marker = evil_model
    out = tmp_path / "exp"
    _trainer(out).train()
    path, doc = read_state(out)
    _add_clone(doc, "run-4", _evil_op(folder))
    path.write_text(json.dumps(doc))
    again = _trainer(out)
    with pytest.warns(RuntimeWarning, match="cannot rebuild clone run-4"):
        again.train()
    assert not marker.exists()
    runs = {r.name: r for r in again.runs}
    assert runs["run-4"].status == RunStatus.FAILED
    assert "'model'" in runs["run-4"].error
    assert all(runs[f"run-{i}"].status == RunStatus.COMPLETED for i in range(4))


@pytest.mark.parametrize("where", ["clones", "runs", "owner", "parent"])
def test_run_names_from_the_state_file_never_become_paths_outside(tmp_path, where):
    out = tmp_path / "a" / "b" / "exp"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    _trainer(out).train()
    path, doc = read_state(out)
    bad = "../../../../victim"
    if where == "clones":
        _add_clone(doc, bad, 'clone {"learning_rate": 1e-4}')
    elif where == "runs":
        doc["runs"][bad] = doc["runs"].pop("run-1")
    elif where == "owner":
        doc["owner"][bad] = "w"
    else:
        _add_clone(doc, "run-4", 'clone {"learning_rate": 1e-4}')
        doc["clones"]["run-4"]["parent"] = bad
    path.write_text(json.dumps(doc))
    with pytest.raises(RFConfigError, match="is not a run name"):
        _trainer(out)
    assert (victim / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_run_names_and_paths():
    for good in ("run-0", "run-7", "run-123"):
        assert check_run_name(good) == good
    for bad in ("run-", "run-01", "../run-1", "run-1/..", "run-1 ", "x", "", None, 3):
        with pytest.raises(UntrustedValue):
            check_run_name(bad)


def test_inside_follows_links(tmp_path):
    root = tmp_path / "root"
    (root / "runs").mkdir(parents=True)
    assert inside(root, root / "runs" / "run-0") == (root / "runs" / "run-0").resolve()
    (root / "runs" / "link").symlink_to(tmp_path)
    with pytest.raises(UntrustedValue):
        inside(root, root / "runs" / "link" / "x")
    with pytest.raises(UntrustedValue):
        inside(root, root / ".." / "elsewhere")


def test_check_tag_override_rules():
    from peft import LoraConfig
    from trl import SFTConfig

    check_tag_override("learning_rate", 1e-4, owner=SFTConfig)
    check_tag_override("lr_scheduler_type", "cosine", owner=SFTConfig)
    check_tag_override("loss_type", "dft", owner=SFTConfig)
    check_tag_override("peft_config.r", 4, owner=LoraConfig)
    check_tag_override("peft_config.bias", "none", owner=LoraConfig)
    check_tag_override("model", "org/declared", owner=None, candidates=("org/declared",),
                       trainer_arg=True)
    with pytest.raises(UntrustedValue, match="trainer argument"):
        check_tag_override("model", "org/other", owner=None, candidates=("org/declared",),
                           trainer_arg=True)
    with pytest.raises(UntrustedValue, match="not one of"):
        check_tag_override("peft_config.bias", "everything", owner=LoraConfig)
    # A distillation teacher loads a model, as the model does: a tag may pick a declared one.
    assert refused_by_name("teacher_model") == refused_by_name("model") is not None
    check_tag_override("teacher_model", "org/teacher", owner=None, candidates=("org/teacher",),
                       trainer_arg=True)
    with pytest.raises(UntrustedValue):
        check_tag_override("teacher_model", "/etc", owner=None, candidates=("org/teacher",),
                           trainer_arg=True)
    check_tag_override("hub_model_id", "me/x", owner=SFTConfig, allowed=("hub_model_id",))


def test_resolve_overrides_checks_only_untrusted_ops():
    from trl import SFTConfig

    fields = {"trust_remote_code": False, "learning_rate": 1e-3}
    assert resolve_overrides({"trust_remote_code": True}, {}, {}, fields, {}) == {
        "trust_remote_code": True}
    with pytest.raises(OpError, match="loads code"):
        resolve_overrides({"trust_remote_code": True}, {}, {}, fields, {}, untrusted=True,
                          config_class=SFTConfig)
    with pytest.raises(OpError, match="takes a number like 0.001, not true or false"):
        resolve_overrides({"learning_rate": True}, {}, {}, fields, {})
