"""What ops say back is true and safe to print: an op file that cannot be read is answered
with the reason; control and bidi characters in op text are stored and reported escaped; a
refused clone leaves no folder behind; a run made to diverge by a NaN setting is told so, not
blamed on its learning rate, and NaN in a clone is refused; the notebook's clone form says
what is wrong with deeply nested JSON instead of a bare ``RecursionError``."""

from __future__ import annotations

import warnings

import pytest

from trl_rapidfire import List, RFSFTConfig, RFSFTTrainer
from trl_rapidfire.control.folder_control import Inbox
from trl_rapidfire.control.ops import OpError, parse_op, resolve_overrides
from trl_rapidfire.reports.plots import write_report
from trl_rapidfire.reports.results import RunResult
from trl_rapidfire.shared_state.runs import RunStatus
from trl_rapidfire.storage.csv_logs import printable, read_rows
from trl_rapidfire.storage.layout import Layout
from trl_rapidfire.testing import (
    cpu_training_kwargs,
    make_sft_dataset,
    tiny_lora_config,
    tiny_model_path,
)

RAW = ("\x00", "\u202e", "\x1b")  # NUL, RIGHT-TO-LEFT OVERRIDE, ESC


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _experiment(out, peft_config=None) -> RFSFTTrainer:
    return RFSFTTrainer(
        model=tiny_model_path(),
        args=RFSFTConfig(output_dir=str(out), num_chunks=2, max_steps=4,
                         learning_rate=List([1e-3, 3e-3]), per_device_train_batch_size=4,
                         **cpu_training_kwargs()),
        train_dataset=make_sft_dataset(16),
        peft_config=peft_config or tiny_lora_config(r=4),
    )


def test_printable_escapes_control_and_bidi_characters_only():
    plain = 'clone {"learning_rate": 1e-4} é 中'
    assert printable(plain) == plain
    assert printable("stop\x00\u202e\x1b[31m\nx") == "stop\\x00\\u202e\\x1b[31m\\nx"
    assert printable(printable("a\u2066b\u2028")) == printable("a\u2066b\u2028") == \
        "a\\u2066b\\u2028"


def test_op_files_and_op_text_are_answered_truly_and_stored_escaped(tmp_path):
    out = tmp_path / "out"
    trainer = _experiment(out)
    inbox = Inbox(Layout(out))
    inbox.folder.mkdir(parents=True)
    (inbox.folder / "0-bad.json").write_text("{not json")
    (inbox.folder / "1-shape.json").write_text('{"run": "run-0"}')
    inbox.post("run-1", "stop\x00\u202e")
    # The script's own op (trusted), whose answer quotes TRL's message with the raw text.
    trainer.engine.queue_op("run-0", 'clone {"lr_scheduler_type": "\\u202ecosine\\u001b"}')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        trainer.train()
    answers = {r.op: r.result for r in trainer.op_log}
    # An unreadable file: its reason is the answer, the op column names the file.
    assert answers["<op file 0-bad.json>"].startswith(
        "error: unreadable op file 0-bad.json: op file 0-bad.json is not valid JSON")
    assert answers["<op file 1-shape.json>"] == (
        'error: unreadable op file 1-shape.json: it is not {"run": ..., "op": ...}')
    # Control and bidi characters are escaped wherever the op is written down.
    assert answers["stop\\x00\\u202e"].startswith("error: unknown op")
    clone = answers['clone {"lr_scheduler_type": "\\u202ecosine\\u001b"}']
    assert "\\u202ecosine\\x1b is not a valid SchedulerType" in clone
    for record in trainer.op_log:
        assert not any(c in record.op + record.result for c in RAW), record
    text = (out / "ops.csv").read_text(encoding="utf-8")
    assert not any(c in text for c in RAW)
    assert [r["op"] for r in read_rows(out / "ops.csv")] == [r.op for r in trainer.op_log]
    write_report(out, out / "report")
    summary = (out / "report" / "summary.md").read_text(encoding="utf-8")
    assert "\\u202ecosine\\x1b is not a valid" in summary
    assert not any(c in summary for c in RAW)


def test_a_refused_clone_leaves_no_folder(tmp_path):
    out = tmp_path / "out"
    _experiment(out).train()
    # A later process: a completed run kept only its final weights, nothing to warm-start.
    again = _experiment(out)
    again.clone("run-0", {"learning_rate": 1e-4}, warm=True)
    with pytest.warns(RuntimeWarning, match="no checkpoint at step 4 to warm-start from"):
        again.train()
    assert again.op_log[-1].result.startswith("error: run-0 has no checkpoint")
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["run-0", "run-1"]
    assert [r.name for r in again.runs] == ["run-0", "run-1"]


def test_a_nan_lora_alpha_is_named_not_the_learning_rate(tmp_path):
    broken = tiny_lora_config(r=4)
    broken.lora_alpha = float("nan")
    trainer = _experiment(tmp_path / "out", List([broken, tiny_lora_config(r=4)]))
    with pytest.warns(RuntimeWarning, match="diverged"):
        trainer.train()
    failed = [r for r in trainer.runs if r.status == RunStatus.FAILED]
    assert len(failed) == 2  # both learning rates of the NaN adapter
    for run in failed:
        assert "peft_config.lora_alpha is nan: give it a finite number" in run.error
        assert "learning rate" not in run.error
    assert sum(r.status == RunStatus.COMPLETED for r in trainer.runs) == 2


def test_nan_inside_a_config_object_or_a_mapping_is_refused_by_every_sender():
    for text in ('clone {"peft_config.lora_dropout": NaN}',
                 'clone {"lr_scheduler_kwargs": {"min_lr": NaN}}'):
        with pytest.raises(OpError, match="holds NaN, which no setting takes"):
            parse_op(text)
    with pytest.raises(OpError, match="'peft_config.lora_dropout' holds NaN"):
        resolve_overrides({"peft_config.lora_dropout": float("nan")}, {},
                          {}, {}, {"peft_config": tiny_lora_config(r=4)})


def test_the_clone_form_says_what_is_wrong_with_deep_json():
    pytest.importorskip("ipywidgets")
    from trl_rapidfire.reports.notebook_form import CloneForm, parse_field

    class Trainer:
        op_log: list = []
        asked: list = []

        def clone(self, run, overrides=None, *, warm=False):
            self.asked.append((run, overrides))

    trainer = Trainer()
    form = CloneForm(trainer)
    form.set_runs([RunResult("run-0", {"learning_rate": 1e-3}, RunStatus.RUNNING, 2, "out",
                             {})])
    form.more.value = "[" * 5000
    form.button.click()
    assert "nests 5000 levels deep (at most 8)" in form.answer.value
    assert "Recursion" not in form.answer.value and trainer.asked == []
    form.more.value = ""
    form.fields["learning_rate"].value = '{"a": ' * 20 + "1" + "}" * 20
    form.button.click()
    assert "the field &#x27;learning_rate&#x27; nests 20 levels deep" in form.answer.value
    assert parse_field("cosine") == "cosine" and parse_field("1e-4") == 1e-4
